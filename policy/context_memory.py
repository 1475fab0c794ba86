"""What earlier requests with similar prompts taught the bandit: the contextual warm start.

A request's context is the target's own representation of its prompt (the mean of the last
hidden states over the prompt's positions, computed by the prefill anyway; deploy/engine/
target.py). `ContextMemory` keeps, for the last `capacity` finished requests, that context (cut
to `dims` numbers by a fixed, seeded random projection) and what the request observed of each
arm (its own pulls and reward sums, ArmStats; the warm start it began with left out).

`prior(context)` -> per arm, the statistics of the `neighbours` stored requests most alike
(cosine similarity after subtracting the stored contexts' mean; only positive similarities
count), each weighted by its similarity: a new request starts on the arms that paid on similar
prompts. Arms none of them saw are absent (the caller falls back to the global statistics).
`add` stores a finished request; `snapshot` / `restore` carry the memory over a restart as
JSON-able data (the coordinator's checkpoint). A context of another width than the first one
seen (another target) is ignored. Not thread-safe: the coordinator calls it under its lock.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from policy.bandit import ArmStats

CAPACITY = 256  # requests remembered (the oldest forgotten first)
NEIGHBOURS = 8  # requests a prior is drawn from
DIMS = 64  # numbers kept of each context (a random projection keeps cosine similarities)


class ContextMemory:
    def __init__(self, capacity: int = CAPACITY, neighbours: int = NEIGHBOURS, dims: int = DIMS, seed: int = 0) -> None:
        if capacity < 1 or neighbours < 1 or dims < 1:
            raise ValueError("capacity, neighbours and dims must be >= 1")
        self.capacity, self.neighbours, self.dims, self.seed = capacity, neighbours, dims, seed
        self.width: int | None = None  # the contexts' width (the target's hidden size), fixed by the first one
        self._projection: np.ndarray | None = None
        self.rows = np.zeros((0, dims), dtype=np.float32)
        self.arms: list[dict[str, ArmStats]] = []

    def __len__(self) -> int:
        return len(self.arms)

    def embed(self, context: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
        """A prompt's context -> its projection ([dims]); None for no context, one that is not a finite
        vector, or one of another width than the memory's."""
        if context is None:
            return None
        vector = np.asarray(context, dtype=np.float32).reshape(-1)
        if vector.size == 0 or not np.isfinite(vector).all():
            return None
        if self.width is None:
            self._fix_width(vector.size)
        if vector.size != self.width:
            return None
        return vector @ self._projection

    def _fix_width(self, width: int) -> None:
        self.width = int(width)
        rng = np.random.default_rng(self.seed)
        self._projection = (rng.standard_normal((self.width, self.dims)) / np.sqrt(self.dims)).astype(np.float32)

    def prior(self, embedded: np.ndarray | None) -> dict[str, ArmStats]:
        """Per arm, the similarity-weighted statistics of the nearest stored requests (empty: none alike)."""
        if embedded is None or len(self) < 2:
            return {}
        centre = self.rows.mean(axis=0)
        rows = self.rows - centre
        query = embedded - centre
        norms = np.linalg.norm(rows, axis=1) * float(np.linalg.norm(query))
        similarity = np.where(norms > 0, rows @ query / np.maximum(norms, 1e-12), 0.0)
        nearest = np.argsort(-similarity, kind="stable")[: self.neighbours]
        prior: dict[str, ArmStats] = {}
        for index in nearest:
            weight = float(similarity[index])
            if weight <= 0:
                break
            for arm, stats in self.arms[index].items():
                prior.setdefault(arm, ArmStats()).add(stats.mean, stats.pulls * weight)
        return prior

    def add(self, embedded: np.ndarray | None, observed: Mapping[str, ArmStats]) -> None:
        """Remember a finished request: its projected context and what it observed of each arm."""
        observed = {arm: ArmStats(s.pulls, s.reward_sum) for arm, s in observed.items() if s.pulls > 0}
        if embedded is None or not observed:
            return
        self.rows = np.vstack([self.rows, embedded[None].astype(np.float32)])[-self.capacity :]
        self.arms = (self.arms + [observed])[-self.capacity :]

    def snapshot(self) -> dict:
        """JSON-able: the width, the projected contexts and each request's arm statistics."""
        return {"width": self.width, "dims": self.dims, "seed": self.seed,
                "rows": [[round(float(v), 5) for v in row] for row in self.rows],
                "arms": [{arm: [s.pulls, s.reward_sum] for arm, s in arms.items()} for arms in self.arms]}

    def restore(self, data: Mapping) -> bool:
        """Take a snapshot back. False, and nothing taken, when it was projected otherwise (dims, seed)."""
        if not data or data.get("dims") != self.dims or data.get("seed") != self.seed:
            return False
        rows, arms = data.get("rows", []), data.get("arms", [])
        if data.get("width") is None or len(rows) != len(arms):
            return False
        self._fix_width(int(data["width"]))
        self.rows = np.asarray(rows, dtype=np.float32).reshape(-1, self.dims)[-self.capacity :]
        self.arms = [{arm: ArmStats(float(p), float(r)) for arm, (p, r) in entry.items()}
                     for entry in arms][-self.capacity :]
        return True
