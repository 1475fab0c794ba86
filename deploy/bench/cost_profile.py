"""A measured verification-cost profile, to replay a run's rounds as if on another device.

`python -m deploy.bench.verify_cost --out FILE.json` measures, on some device, what a target
forward over n new positions costs in plain steps (`chain`), and the plain step itself. Given such a
file, `specfleet bench --cost-profile FILE.json` re-times every in-process run's real rounds (the
same lossless tokens, the same drafts and acceptances) as

    profiled seconds = plain_step_s * (1 + Σ_rounds chain[positions verified in the round])
                       + Σ_rounds the round's measured drafting seconds, drafters in parallel

(1 = the prefill, ~one step on a GPU for these prompt lengths; a round verifies drafted + 1
positions: a tree's nodes + its root). Drafting is charged as the service runs it, each drafter an
actor on its own device: the coordinator call's own overhead plus the slowest of the round's
drafters, chosen or shadow (`RoundTrace.parallel_draft_s`), not the in-process sum of them.
Shipped: `deploy/bench/results/h200.verify_cost.json`, measured on one H200, where a forward over
29 positions costs ~1.1-1.3 plain steps.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deploy.errors import InvalidRequestError


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
        """Seconds of one forward over `positions` new positions (beyond the profile: its largest)."""
        return self.plain_step_s * self.chain[min(positions, max(self.chain))]

    def request_s(self, rounds: list[tuple[int, float]]) -> float:
        """rounds: (positions verified, drafting seconds) per round -> profiled request seconds."""
        return self.plain_step_s + sum(self.forward_s(positions) + draft_s for positions, draft_s in rounds)
