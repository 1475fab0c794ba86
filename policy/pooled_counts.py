"""Counts pooled from several learners: the coordinator's store of what every target replica learned.

`PooledCounts.add(delta)` adds a replica's counts gathered since its last share and returns the
pool's totals. Counts are rows of numbers under string keys (what a replica's engine encodes:
deploy/engine/shared_lengths.py); rows of one key are added position by position, the shorter
padded with zeros. `totals` is JSON-able (the coordinator's checkpoint holds it) and `restore`
takes it back. Not thread-safe: the coordinator calls it under its lock.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

Rows = dict[str, list[list[float]]]  # key -> rows (for draft lengths: [reached, accepted])


def add_rows(into: list[float], more: Sequence[float]) -> list[float]:
    """`into` + `more`, position by position (the shorter padded with zeros)."""
    if len(more) > len(into):
        into = into + [0.0] * (len(more) - len(into))
    return [a + (float(more[i]) if i < len(more) else 0.0) for i, a in enumerate(into)]


class PooledCounts:
    def __init__(self) -> None:
        self.totals: Rows = {}

    def add(self, delta: Mapping[str, Sequence[Sequence[float]]]) -> Rows:
        """Add one learner's new counts; -> the pool's totals (a copy)."""
        for key, rows in delta.items():
            have = self.totals.get(key, [[] for _ in rows])
            if len(have) < len(rows):
                have = have + [[] for _ in range(len(rows) - len(have))]
            self.totals[key] = [add_rows(row, rows[i]) if i < len(rows) else row for i, row in enumerate(have)]
        return self.snapshot()

    def snapshot(self) -> Rows:
        """A copy of the totals."""
        return {key: [list(row) for row in rows] for key, rows in self.totals.items()}

    def restore(self, totals: Mapping[str, Sequence[Sequence[float]]]) -> None:
        self.totals = {key: [[float(v) for v in row] for row in rows] for key, rows in totals.items()}
