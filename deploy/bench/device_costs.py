"""Deciding as on another device (`specfleet bench --cost-profile FILE`): the engine's cost model
with a measured profile's forward costs (deploy/bench/cost_profile.py). Bench-only: the serving
engine never builds one.

Cuts, model-drafter budgets and rewards are priced by the profile's forward costs (no padding:
the profile's sizes are what a forward costs there), fixed rather than followed by a running mean;
a reward is charged the profile's cost for the positions verified; and a model drafter's drafting
time counts as the same share of a plain step there as it measures here (`draft_scale`). Only
decisions change; every forward still runs here, losslessly.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from deploy.bench.cost_profile import CostProfile
from deploy.engine.cost_model import ForwardCosts
from deploy.engine.target import TargetModel
from policy.coordinator import DraftRound


class DeviceCosts(ForwardCosts):
    def __init__(self, profile: CostProfile, target: TargetModel, max_positions: int, model_free: Collection[str]) -> None:
        """model_free: the drafters whose drafting time is not scaled (no model runs)."""
        super().__init__(target, max_positions, max_padding=0)
        plain_here_s = self.verify_s_by_size[1]
        # a model drafter's drafting seconds here -> on the device: the same share of a plain step
        self.draft_scale = profile.plain_step_s / plain_here_s if plain_here_s else 1.0
        self.verify_s_by_size = [0.0, *(profile.forward_s(n) for n in range(1, max_positions + 1))]
        self.profile, self.model_free = profile, frozenset(model_free)

    def forward_s(self, n: int) -> float:
        return super().forward_s(n) if n <= self.max_positions else self.profile.forward_s(n)

    def priced_verify_s(self, chain_size: int, positions: int, measured_s: float) -> float:
        return self.profile.forward_s(positions)

    def observe(self, chain_size: int, measured_s: float) -> None:
        """The profile's costs are fixed."""

    def priced_drafts(self, draft_round: DraftRound) -> DraftRound:
        """Each model drafter's drafting seconds as on the device."""
        if self.draft_scale == 1.0:
            return draft_round

        def scaled(proposals):
            return tuple(p if p.drafter in self.model_free else replace(p, draft_s=p.draft_s * self.draft_scale)
                         for p in proposals)

        return replace(draft_round, proposals=scaled(draft_round.proposals), shadows=scaled(draft_round.shadows))
