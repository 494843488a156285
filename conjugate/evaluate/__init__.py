"""Evaluation: correctness against the reference round (and, on the GPU, timing)."""
