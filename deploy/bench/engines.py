"""The engine a bench run decodes with, from its name: `ar` (plain target decoding), `single:<drafter>`
or `policy:<name>[@<verify>]` (a `batch:` run builds the same engine as its `policy:` twin, in its own
process: deploy/bench/batch_run.py).
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import is_model_free
from actors.recycling import RECYCLING
from deploy.bench.cost_profile import CostProfile
from deploy.bench.device_costs import DeviceCosts
from deploy.engine.cost_model import max_positions
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.target import TargetModel
from policy.registry import CHOSEN, run_drafters, split_run_policy


def make_engine(run: str, target: TargetModel, drafters: Sequence[str], k: int, draft_model=None,
                cut_drafts: bool = True, device: CostProfile | None = None,
                tree_budget: int | None = None) -> SpeculativeEngine:
    """cut_drafts=False verifies every drafted token (`--no-cut`): each drafter's acceptance at the full k.
    device: the engine decides as on that device (`--cost-profile`; deploy/bench/device_costs.py).
    tree_budget: the most draft nodes a round verifies (`--tree-budget`), and the recycling
    drafter's tree size."""
    if run == "ar":
        return SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}", k=k, verify=CHOSEN)
    if run.startswith("single:"):
        name = run.removeprefix("single:")
        pool, policy, verify = build_drafters([name], draft_model, target.vocab_size, target.name), f"fixed:{name}", CHOSEN
    else:
        label = run.removeprefix("policy:")
        pool = build_drafters(run_drafters(label, drafters), draft_model, target.vocab_size, target.name)
        policy, verify = split_run_policy(label)
    costs = None
    if device is not None:
        costs = DeviceCosts(device, target, max_positions(k), [name for name, d in pool.items() if is_model_free(d)])
    if tree_budget is not None and RECYCLING in pool:
        pool[RECYCLING].tree_nodes = tree_budget
    return SpeculativeEngine(target, pool, policy=policy, k=k, cut_drafts=cut_drafts, verify=verify, costs=costs,
                             max_tree_nodes=tree_budget)
