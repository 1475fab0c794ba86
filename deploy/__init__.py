"""Verification math, the speculative engine loop, benchmark and CLI (Ray only in the service wrappers)."""
