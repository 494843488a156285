"""The baselines every plan is compared with: the conventional round run by torch (conventional.py,
split_attention.py), measured in the evaluating process (measure.py) or in a process of its own
(apart.py, whose child is apart_child.py)."""
