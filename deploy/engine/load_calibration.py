"""Acceptance calibrated under load: how the planner's P(accepted) of the draft nodes a batch
verified compares with what was accepted, per batch-size bucket, and the correction it learns.

The draft-length statistics (deploy/engine/draft_length.py) estimate each draft node's P(accepted)
from every verification, whatever the batch. Under load a batch verifies only the nodes its
goodput says pay (deploy/engine/goodput.py): the most likely few of many, whose estimates are the
most optimistic (the winner's curse), so a batch of 28-32 rows accepted 0.71 of what it verified
where it expected more. `LoadCalibration` keeps, per batch-size bucket (`batch_bucket`) and per
decile of the planner's estimate, the estimates' sum and the accepted count of the nodes verified:

    ratio_b = (accepted_b + WEIGHT) / (expected_b + WEIGHT)        (recent iterations: DECAY)
    corrected P = min(1, P * ratio_b)

`correct` applies it before a batch chooses its nodes (the estimate it corrects is always the
uncorrected one, so the ratio keeps measuring the statistics, not itself). `report` gives the
whole run's reliability table (never decayed): what the bench prints per bucket.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BUCKET_BOUNDS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # a batch of r rows: the first bound >= r
BINS = 10  # deciles of the planner's P(accepted)
WEIGHT = 4.0  # pseudo-tokens behind a ratio of 1 (no correction before evidence)
DECAY = 0.97  # per iteration of a bucket: the correction follows about the last 30 iterations


def batch_bucket(rows: int) -> int:
    """The bucket of a batch of `rows` requests: the first of BUCKET_BOUNDS not below it."""
    return next((bound for bound in BUCKET_BOUNDS if rows <= bound), BUCKET_BOUNDS[-1])


def bucket_label(bucket: int) -> str:
    """'1', '2', '3-4', ... '49-64' (the largest bucket also holds larger batches)."""
    index = BUCKET_BOUNDS.index(bucket)
    low = BUCKET_BOUNDS[index - 1] + 1 if index else 1
    return str(bucket) if low == bucket else f"{low}-{bucket}"


def _bins(probabilities: Sequence[float]) -> np.ndarray:
    return np.clip((np.asarray(probabilities, dtype=float) * BINS).astype(int), 0, BINS - 1)


class LoadCalibration:
    def __init__(self) -> None:
        self._recent: dict[int, np.ndarray] = {}  # bucket -> [BINS, 2]: decayed (expected, accepted) sums
        self._totals: dict[int, np.ndarray] = {}  # bucket -> [BINS, 3]: (nodes, expected, accepted), whole run

    def ratios(self, rows: int) -> np.ndarray:
        """Per decile, the correction of a batch of `rows` (ones before any evidence)."""
        recent = self._recent.get(batch_bucket(rows))
        if recent is None:
            return np.ones(BINS)
        return (recent[:, 1] + WEIGHT) / (recent[:, 0] + WEIGHT)

    def correct(self, rows: int, probabilities: Sequence[float]) -> list[float]:
        """The planner's P(accepted) of nodes in a batch of `rows`, corrected by what such batches accepted."""
        if not len(probabilities):
            return []
        ratios = self.ratios(rows)
        return np.minimum(1.0, np.asarray(probabilities, dtype=float) * ratios[_bins(probabilities)]).tolist()

    def observe(self, rows: int, expected: Sequence[float], accepted: Sequence[bool]) -> None:
        """One iteration of a batch of `rows`: its verified nodes' uncorrected P(accepted) and
        whether each was accepted."""
        bucket = batch_bucket(rows)
        recent = self._recent.setdefault(bucket, np.zeros((BINS, 2)))
        totals = self._totals.setdefault(bucket, np.zeros((BINS, 3)))
        recent *= DECAY
        if not len(expected):
            return
        bins = _bins(expected)
        hits = np.asarray(accepted, dtype=float)
        np.add.at(recent[:, 0], bins, expected)
        np.add.at(recent[:, 1], bins, hits)
        np.add.at(totals[:, 0], bins, 1.0)
        np.add.at(totals[:, 1], bins, expected)
        np.add.at(totals[:, 2], bins, hits)

    def report(self) -> dict[str, dict]:
        """Per bucket (label): nodes verified, the planner's mean P(accepted) of them, the share
        accepted, and per decile [lower edge, nodes, mean expected, share accepted, the correction
        in force at the end]."""
        out = {}
        for bucket in sorted(self._totals):
            nodes, expected, accepted = self._totals[bucket].T
            if not nodes.sum():
                continue
            ratios = self.ratios(bucket)
            out[bucket_label(bucket)] = {
                "nodes": int(nodes.sum()),
                "expected": round(float(expected.sum() / nodes.sum()), 4),
                "accepted": round(float(accepted.sum() / nodes.sum()), 4),
                "bins": [[i / BINS, int(nodes[i]), round(float(expected[i] / nodes[i]), 4),
                          round(float(accepted[i] / nodes[i]), 4), round(float(ratios[i]), 4)]
                         for i in range(BINS) if nodes[i]],
            }
        return out
