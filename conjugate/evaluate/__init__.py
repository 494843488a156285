"""Evaluation: correctness against the reference round, EvalResult, evaluator profiles, the
pipeline and its two harnesses (measured on a GPU, modeled by the analytical cost model and its
calibration), the evaluation session, worker isolation, the baselines."""
