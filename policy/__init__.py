"""Bandit policies (one algorithm per file) and rewards (pure functions). No Ray here."""
