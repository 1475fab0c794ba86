"""What verification forwards and drafting cost, as the engine prices them: the only place the
engine's decisions (cuts, model-drafter budgets, rewards) read a time from.

`ForwardCosts` is the serving cost model. Forward sizes cost non-monotonically on CPU (measured
once per target, `TargetModel.forward_profile`): a draft's forward is padded with up to
`max_padding` throwaway positions when a larger size is cheaper (`padded_size`). The seconds of a
one-draft (or plain) forward of each size start at the target's profile and follow a running mean
of the rounds seen (`observe`); a reward is charged that running mean for its size, so one slow
forward (the machine's noise, not the drafter's doing) does not sink the arm that happened to be
pulled; a tree's forward (no running mean) is charged as measured. A tree larger than a chain's largest
forward is priced from a few larger sizes measured at load (`TREE_SIZES`), interpolated, and
beyond the largest in proportion to it. Drafting is charged as measured: the coordinator call as
the target saw it.

A bench that decides as on another device subclasses it (deploy/bench/device_costs.py); the
engine only calls the methods below.
"""
from __future__ import annotations

from collections.abc import Sequence

from deploy.engine.defaults import MAX_PADDING
from deploy.engine.target import TargetModel
from policy.coordinator import DraftRound


TREE_SIZES = (16, 32, 64)  # forward sizes measured for trees beyond a chain's largest forward


def max_positions(k: int, max_padding: int = MAX_PADDING) -> int:
    """The largest forward an engine drafting at most k tokens runs: last token, draft, padding."""
    return k + 1 + max_padding


class ForwardCosts:
    def __init__(self, target: TargetModel | None, max_positions: int, max_padding: int) -> None:
        """target None: an engine that only decodes plainly (nothing to price: every cost 0)."""
        self.max_positions = max_positions
        # padded_size[n]: the forward size for n positions (the cheapest size >= n)
        self.padded_size = list(range(max_positions + 1))
        if max_padding and target is not None:
            self.padded_size = [target.padded_length(n, max_positions) for n in self.padded_size]
        # verify_s_by_size[n]: seconds of a one-draft verification over a forward of n positions (1 = a plain step)
        self.verify_s_by_size = [0.0] * (max_positions + 1) if target is None else [0.0, *target.forward_profile(max_positions)]
        # a tree larger than that (several drafts, a recycled or eagle tree): measured at a few sizes, interpolated
        self.tree_sizes = [n for n in TREE_SIZES if n > max_positions] if target is not None else []
        self.tree_s = target.batch_profile(self.tree_sizes, rows=1, context=128) if self.tree_sizes else []

    @property
    def plain_step_s(self) -> float:
        """Seconds of a plain target step (0 for a plain-decoding-only engine)."""
        return self.verify_s_by_size[1]

    def forward_s(self, n: int) -> float:
        """Seconds of a verification forward over n positions: the padded size's, for a one-draft
        forward; a larger tree interpolated between the tree sizes measured (in proportion beyond them)."""
        if n <= self.max_positions:
            return self.verify_s_by_size[self.padded_size[n]]
        sizes, seconds = [self.max_positions, *self.tree_sizes], [self.verify_s_by_size[self.max_positions], *self.tree_s]
        if n >= sizes[-1]:
            return seconds[-1] * n / sizes[-1]
        upper = next(i for i, size in enumerate(sizes) if size >= n)
        low, high = sizes[upper - 1], sizes[upper]
        return seconds[upper - 1] + (seconds[upper] - seconds[upper - 1]) * (n - low) / (high - low)

    def shadow_verify_s(self, drafted: int) -> float:
        """What verifying a draft of `drafted` tokens alone would have cost (a shadow's price)."""
        return self.verify_s_by_size[self.padded_size[drafted + 1]]

    def priced_verify_s(self, chain_size: int, positions: int, measured_s: float) -> float:
        """What a verification is charged in rewards: the running mean for its forward size
        (chain_size: the forward's size for one draft or none, 0 for a tree), else as measured."""
        return self.verify_s_by_size[chain_size] if chain_size and self.verify_s_by_size[chain_size] else measured_s

    def observe(self, chain_size: int, measured_s: float) -> None:
        """A one-draft (or plain) forward of that size took measured_s: its running mean moves."""
        if chain_size and self.verify_s_by_size[chain_size]:
            self.verify_s_by_size[chain_size] = 0.9 * self.verify_s_by_size[chain_size] + 0.1 * measured_s

    def priced_drafts(self, draft_round: DraftRound) -> DraftRound:
        """The round with each draft's drafting seconds as this cost model charges them."""
        return draft_round

    def round_draft_s(self, call_s: float, overhead_s: float, own_s: Sequence[float]) -> float:
        """What the round's drafting cost: call_s, the coordinator call as the target saw it
        (overhead_s: its part beyond the drafters' own seconds, own_s)."""
        return call_s


BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # packed positions of a batch forward, measured


class BatchCosts:
    """Seconds of a batched target forward as a function of its packed positions: the target's
    batch profile (`TargetModel.batch_profile`, measured once), interpolated linearly between the
    sizes measured and in proportion beyond the largest, times a running correction to the
    forwards seen (`observe`), so a machine busier than at start-up is priced as it is."""

    def __init__(self, target: TargetModel, sizes: Sequence[int] = BATCH_SIZES) -> None:
        self.sizes, self.seconds = list(sizes), target.batch_profile(sizes)
        self.scale = 1.0

    def profiled_s(self, positions: int) -> float:
        sizes, seconds = self.sizes, self.seconds
        if positions >= sizes[-1]:
            return seconds[-1] * positions / sizes[-1]
        if positions <= sizes[0]:
            return seconds[0]
        upper = next(i for i, size in enumerate(sizes) if size >= positions)
        low, high = sizes[upper - 1], sizes[upper]
        return seconds[upper - 1] + (seconds[upper] - seconds[upper - 1]) * (positions - low) / (high - low)

    def forward_s(self, positions: int) -> float:
        return self.scale * self.profiled_s(positions)

    def observe(self, positions: int, measured_s: float) -> None:
        ratio = measured_s / self.profiled_s(positions)
        self.scale = min(4.0, max(0.25, 0.9 * self.scale + 0.1 * ratio))
