"""Retention: the policy, the pure planner, and its execution (prune, garbage collection, retained checkpoints)."""
