"""Evaluation: correctness against the reference round, EvalResult, evaluator profiles, the
analytical model and its calibration, the pipeline, worker isolation, the conventional baseline."""
