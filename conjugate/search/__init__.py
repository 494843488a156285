"""The search: persistent store, Monte Carlo tree search over plans, the run loop and export."""
