"""Drafters: one Proposer per file, plus model loading. Pure Python/torch; no Ray here."""
