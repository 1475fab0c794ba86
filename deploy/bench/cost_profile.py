"""A measured verification-cost profile: run and time a bench as if on another device.

`python -m deploy.bench.verify_cost --out FILE.json` measures, on some device, what a target
forward over n new positions costs in plain steps (`chain`), and the plain step itself. Given such a
file, `specfleet bench --cost-profile FILE.json` runs every in-process engine as it would run on
that device (deploy/bench/device_costs.py): drafts are cut, model drafters budgeted and rewards
priced by the profile's forward costs, and a model drafter's drafting time counts as the same share
of a plain step there as it measures here (`DeviceCosts.draft_scale`). Every round (the same
lossless tokens, the real drafts and acceptances) is then re-timed as

    profiled seconds = plain_step_s * (1 + Σ_rounds chain[positions verified in the round])
                       + Σ_rounds the round's drafting seconds, drafters in parallel

(1 = the prefill, ~one step on a GPU for these prompt lengths; a round verifies drafted + 1
positions: a tree's nodes + its root). Drafting is charged as the service runs it, each drafter an
actor on its own device: the coordinator call's own overhead plus the slowest of the round's
drafters, chosen or shadow (`RoundTrace.parallel_draft_s`), not the in-process sum of them.
A size between two measured ones costs the larger; beyond the largest, the cost grows on along
the chain's fitted slope. Shipped: `docs/results/h200.verify_cost.json`, measured on one
H200, where a forward over 29 positions costs ~1.1-1.3 plain steps.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from actors.errors import InvalidRequestError


@dataclass(frozen=True)
class CostProfile:
    device: str
    plain_step_s: float
    chain: dict[int, float]  # positions -> cost in plain steps

    @classmethod
    def load(cls, path: str | Path) -> "CostProfile":
        try:
            data = json.loads(Path(path).read_text())
            chain = {int(n): float(c) for n, c in data["chain"].items()}
            profile = cls(str(data.get("device", "?")), float(data["plain_step_s"]), chain)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise InvalidRequestError("cost_profile", f"cannot read a verify_cost profile from {path}: {err}") from err
        if not chain or 1 not in chain or profile.plain_step_s <= 0:
            raise InvalidRequestError("cost_profile", f"{path}: needs plain_step_s > 0 and chain costs from 1 position")
        return profile

    def forward_s(self, positions: int) -> float:
        """Seconds of one forward over `positions` new positions: the smallest measured size that
        holds them; beyond the largest (a tree of many drafts can be), the cost grows on from it
        along the chain's least-squares slope, so a profile never makes a large tree free."""
        largest = max(self.chain)
        if positions <= largest:
            return self.plain_step_s * self.chain[min(n for n in self.chain if n >= positions)]
        return self.plain_step_s * (self.chain[largest] + self._slope * (positions - largest))

    @cached_property
    def _slope(self) -> float:
        """Plain steps per extra position, fitted over the measured sizes (never below 0)."""
        if len(self.chain) < 2:
            return 0.0
        sizes = sorted(self.chain)
        return max(0.0, float(np.polyfit(sizes, [self.chain[n] for n in sizes], 1)[0]))

    def request_s(self, rounds: list[tuple[int, float]]) -> float:
        """rounds: (positions verified, drafting seconds) per round -> profiled request seconds."""
        return self.plain_step_s + sum(self.forward_s(positions) + draft_s for positions, draft_s in rounds)
