"""The heuristic proposer (propose.py) and its edits, one module per knob family: tiles, fusions,
reduce, pdl, streams, cross; repair for failed nodes; tile_table for the tiles measured per GPU."""
from conjugate.agents.heuristic.propose import HeuristicProposer, candidates, fresh_filter

__all__ = ["HeuristicProposer", "candidates", "fresh_filter"]
