"""Planning a round's drafts: ask the coordinator, choose what is worth verifying, lay it out
for the target's forward.

    budget   in a batch of several (`budget`): the most draft tokens any request could have
             verified, from the batch's goodput over the best acceptance seen (as batches of its
             size realised it: deploy/engine/load_calibration.py), before any drafter is asked;
             0 (a batch too large for any draft to pay, or one whose size the guard keeps
             plain: deploy/engine/draft_guard.py) drafts nothing
    draft    one coordinator call for the batch (`draft`): each request's newly committed tokens,
             its previous round's feedback and its unsent features go in; its chosen drafter's
             draft (and with the `counterfactual`, `tree` and `ensemble` verification modes, every
             model-free drafter's draft as a shadow) comes out. A deferred model drafter is asked for as many
             tokens as pay for its drafting time, and for none when a model-free draft in hand,
             or a plain step, already promises more (`_model_tokens`). In `ensemble` mode the
             round's drafts are combined into the one draft it verifies (`combine`); the drafters'
             own drafts become shadows.
    choose   alone (`choose`): each draft cut to the length whose expected yield pays for its
             forward (deploy/engine/draft_length.py); in `tree` mode the tree of every draft, the
             best rated first, cut node by node; the drafts not chosen stay shadows. In a batch of
             several (`choose_batch`): the batch's most likely draft nodes, as many as maximise its
             expected tokens per second (deploy/engine/goodput.py), their P(accepted) corrected
             by what batches of its size accepted (`calibration`).
    plan     the request's row of the batched forward (`plan`): [last token, draft] padded to a
             cheaper size when alone, or the drafts' token tree.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from actors.no_draft import NO_DRAFT
from actors.proposal import BRANCH, Proposal
from deploy.engine.coordination import DraftCoordinator
from deploy.engine.cost_model import BatchCosts, ForwardCosts
from deploy.engine.draft_guard import DraftGuard
from deploy.engine.draft_length import DraftLengths
from deploy.engine.draft_tree import ROOT, DraftTree
from deploy.engine.ensemble import ensemble_draft
from deploy.engine.goodput import batch_draft_nodes
from deploy.engine.load_calibration import LoadCalibration
from deploy.engine.predictions import Predictions, joined
from deploy.engine.request import RequestState
from deploy.engine.target import BatchRow
from policy.coordinator import DraftCall, DraftRound

PLAIN_DRAFT = Proposal(drafter=NO_DRAFT)  # an empty draft: a plain step
NodeExpectations = dict[tuple[int, ...], float]  # a verified node (its tokens from the root) -> its P(accepted)


@dataclass(frozen=True)
class Drafts:
    """A round's drafts as the coordinator gave them, priced by the cost model."""

    round: DraftRound
    drafting_s: float  # every drafter's own seconds as measured here, summed


@dataclass(frozen=True)
class ForwardPlan:
    """A round's part of a batched target forward and what acceptance needs to read it."""

    row: BatchRow
    distinct: list[Proposal]  # the distinct non-empty drafts verified
    tree: DraftTree | None  # their token tree, when more than one


class DraftPlanner:
    def __init__(self, k: int, costs: ForwardCosts, draft_lengths: DraftLengths) -> None:
        self.k, self.costs, self.draft_lengths = k, costs, draft_lengths
        self.draft_s_per_token: dict[str, float] = {}  # each drafter's drafting seconds per token (running mean)
        self.batch_costs: BatchCosts | None = None  # a scheduler's engine: a batch of several is cut by its goodput
        self.calibration = LoadCalibration()  # a batch's P(accepted) as batches of its size realised it
        self.guard = DraftGuard()  # whether batches of a size draft at all, by their realised gain

    def budget(self, requests: Sequence[RequestState], prefilled: int = 0) -> int:
        """Before drafting, the most draft tokens a request of this batch could have verified: the
        batch's goodput (deploy/engine/goodput.py) over every request's best conceivable chain
        (DraftLengths.best_reach) as batches of this size realised it (`calibration`), with
        `prefilled` prompt positions in the same forward. 0: no draft can pay at this batch's
        size, and no drafter is asked."""
        reach = np.minimum.accumulate(self.calibration.correct(len(requests), self.draft_lengths.best_reach(self.k)))
        counts = batch_draft_nodes([reach.tolist() if r.cutting else [] for r in requests], len(requests) + prefilled,
                                   float(len(requests)), self.batch_costs.forward_s)
        return max(counts, default=0)

    def draft(self, coordinator: DraftCoordinator, requests: Sequence[RequestState],
              budget: int | None = None) -> list[Drafts]:
        """The coordinator's drafts for every request's round, in one call, each at most `budget`
        tokens (a request that verifies its draft whole, `cutting` off, is not held to it); a
        deferred model drafter is asked for as many tokens as pay for its drafting time (`_model_tokens`)."""
        def tokens(r: RequestState) -> int:
            room = min(self.k, r.sampling.max_tokens - len(r.output) - 1)  # leaves room for the bonus
            return room if budget is None or not r.cutting else min(room, budget)

        calls = [DraftCall(r.request_id, r.tokens[r.sent:], r.feedback, tokens(r), r.sampling, r.cutting,
                           _unsent_features(r), _unsent_predictions(r), _first_context(r)) for r in requests]
        rounds = coordinator.propose_batch(calls)
        drafts = []
        for request, call, round_ in zip(requests, calls, rounds):
            if round_.deferred:
                in_hand = round_.proposals + (round_.shadows if round_.tree or round_.ensemble else ())
                asked = {arm: min(call.k, self._model_tokens(arm, in_hand)) for arm in round_.deferred}
                extra = coordinator.draft_deferred(request.request_id, asked, request.sampling)
                round_ = replace(round_, proposals=round_.proposals + extra, deferred=())
            if any(p.branches for p in round_.proposals):  # a draft tree's chains are verified together
                round_ = replace(round_, proposals=tuple(c for p in round_.proposals for c in p.chains()))
            if any(p.branches for p in round_.shadows):  # in `tree` mode a shadow tree joins the round's tree
                round_ = replace(round_, shadows=tuple(c for p in round_.shadows
                                                       for c in (p.chains() if round_.tree else (replace(p, branches=()),))))
            if round_.ensemble:
                round_ = self.combine(round_, request)
            request.sent = len(request.tokens)
            drafting_s = sum(p.draft_s for p in round_.proposals + round_.shadows)  # measured here
            round_ = self.costs.priced_drafts(round_)
            self._time_drafting(round_)
            drafts.append(Drafts(round_, drafting_s))
        return drafts

    def combine(self, round_: DraftRound, request: RequestState) -> DraftRound:
        """The `ensemble` mode: every draft of the round (chosen first) combined into the one draft
        verified (deploy/engine/ensemble.py); each drafter's own draft becomes a shadow, scored
        against the output, which is what teaches the ensemble's weights. A seeded sampled request
        verifies the chosen draft: its output must depend on its seed alone, not on learned weights."""
        if request.sampling.seeded_sampling:
            return round_
        drafts = (*round_.proposals, *round_.shadows)
        chain = ensemble_draft(drafts, self.draft_lengths.acceptance, request.sampling, request.generator,
                               min(self.k, self.draft_lengths.max_k))
        return replace(round_, proposals=(chain,) if chain.token_ids else (), shadows=drafts)

    def choose(self, round_: DraftRound, cutting: bool) -> DraftRound:
        """What to verify: each draft cut to the length worth verifying; in `tree` mode the best
        rated of the chosen draft and the shadows (the chosen one, or a plain step, on a tie)
        heads the tree of every uncut draft, cut node by node (DraftLengths.select_tree). The
        drafts left out are the round's shadows (as cut)."""
        if not cutting:
            return round_
        lengths_of = self.draft_lengths
        if not round_.tree and any(p.source == BRANCH for p in round_.proposals):  # a drafter's tree: cut node by node
            lengths = lengths_of.select_tree(round_.proposals)
            return replace(round_, proposals=tuple(p.cut(n) for p, n in zip(round_.proposals, lengths) if n),
                           shadows=tuple(map(lengths_of.cut, round_.shadows)))
        cut = replace(round_, proposals=tuple(map(lengths_of.cut, round_.proposals)),
                      shadows=tuple(map(lengths_of.cut, round_.shadows)))
        if not round_.tree or not cut.shadows:
            return cut
        chosen = cut.proposals  # none when the chosen model drafter sat the round out
        rated = [(lengths_of.rate(p), p) for p in (*chosen, *cut.shadows)]  # each draft rated once
        best_rate, best = max(rated[len(chosen):], key=lambda pair: pair[0])
        chosen_rate = rated[0][0] if chosen else lengths_of.rate(PLAIN_DRAFT)
        if best_rate > chosen_rate:
            chosen = (best,)
        if not chosen or not chosen[0].token_ids:
            return replace(cut, proposals=chosen, shadows=tuple(p for _, p in rated if not any(p is c for c in chosen)))
        whole = (*round_.proposals, *round_.shadows)
        first = next(i for i, (_, p) in enumerate(rated) if p is chosen[0])
        order = [first, *sorted((i for i, (_, p) in enumerate(rated) if i != first and whole[i].token_ids),
                                key=lambda i: -rated[i][0])]
        lengths = dict(zip(order, lengths_of.select_tree([whole[i] for i in order])))
        return replace(cut, proposals=tuple(whole[i].cut(lengths[i]) for i in order if lengths[i]),
                       shadows=tuple(p for i, (_, p) in enumerate(rated) if not lengths.get(i) and p.source != BRANCH))

    def choose_batch(self, requests: Sequence[RequestState], drafted: Sequence[Drafts],
                     prefilled: int = 0) -> tuple[list[DraftRound], list[NodeExpectations]]:
        """What each request of a batch verifies: of all their drafts' nodes (the chosen drafts';
        in `tree` mode every draft's), the most likely ones, as many as maximise the batch's
        expected tokens per second (deploy/engine/goodput.py), each node's P(accepted) corrected
        by what batches of this size accepted (a child never above its parent). A request that
        must verify its draft whole (`cutting` off) is priced as it stands; `prefilled` prompt
        positions ride in the same forward (they cost, and emit nothing). -> the rounds, and per
        request the nodes chosen with their uncorrected P(accepted) (`observe_batch` learns from them)."""
        base_positions, base_expected = len(requests) + prefilled, float(len(requests))
        offers: list[tuple[list[Proposal], DraftTree, list[int], list[float]] | None] = []
        for request, drafts in zip(requests, drafted):
            candidates = self._candidates(drafts.round)
            if not candidates:
                offers.append(None)
                continue
            tree, accepted = self.draft_lengths.node_probabilities(candidates)
            if not request.cutting:
                base_positions += tree.size
                base_expected += sum(accepted)
                offers.append(None)
                continue
            corrected = self.calibration.correct(len(requests), accepted)
            for node, parent in enumerate(tree.parents):  # a parent precedes its children
                if parent != ROOT:
                    corrected[node] = min(corrected[node], corrected[parent])
            order = sorted(range(tree.size), key=lambda node: (-corrected[node], node))[: self.draft_lengths.max_nodes]
            offers.append((candidates, tree, order, [corrected[node] for node in order], accepted))
        counts = batch_draft_nodes([offer[3] if offer else [] for offer in offers], base_positions, base_expected,
                                   self.batch_costs.forward_s)
        chosen, expectations = [], []
        for drafts, offer, count in zip(drafted, offers, counts):
            round_ = drafts.round
            if offer is None:
                chosen.append(round_)
                expectations.append({})
                continue
            candidates, tree, order, _, accepted = offer
            kept = set(order[:count])
            expectations.append({candidates[i].token_ids[: depth + 1]: accepted[node]
                                 for i, path in enumerate(tree.paths) for depth, node in enumerate(path) if node in kept})
            lengths = dict(zip(map(id, candidates), self.draft_lengths.lengths_keeping(tree, kept)))
            proposals = tuple(p.cut(lengths[id(p)]) if id(p) in lengths else p for p in round_.proposals)
            shadows = round_.shadows
            if round_.tree:  # shadows with kept nodes are verified in the tree
                proposals += tuple(p.cut(lengths[id(p)]) for p in shadows if lengths.get(id(p)))
                shadows = tuple(p for p in shadows if not lengths.get(id(p)))
            chosen.append(replace(round_, proposals=proposals, shadows=shadows))
        return chosen, expectations

    def observe_batch(self, rows: int, expectations: Sequence[NodeExpectations], verified: Sequence[DraftRound],
                      accepted: Sequence[Sequence[int]]) -> None:
        """A batch's verification, for its size's calibration: per request the nodes it chose
        (`choose_batch`), the round it verified and each verified draft's accepted tokens."""
        expected, hits = [], []
        for nodes, round_, counts in zip(expectations, verified, accepted):
            if not nodes:
                continue
            path = {p.token_ids[:i] for p, n in zip(round_.proposals, counts) for i in range(1, n + 1)}
            for prefix, probability in nodes.items():
                expected.append(probability)
                hits.append(prefix in path)
        self.calibration.observe(rows, expected, hits)

    def plan(self, request: RequestState, chosen: DraftRound, padded: bool = True) -> ForwardPlan:
        """The round's part of a target forward: [last token, draft] (padded to a cheaper size
        when `padded`, a batch of one), or the drafts' token tree."""
        tokens = request.tokens
        distinct = list({p.token_ids: p for p in reversed(chosen.proposals) if p.token_ids}.values())[::-1]
        if len(distinct) <= 1:
            draft = distinct[0].token_ids if distinct else ()
            positions = [tokens[-1], *draft]
            if draft and padded:  # extra positions only change speed; their K/V is cropped
                positions += [draft[-1]] * (self.costs.padded_size[len(positions)] - len(positions))
            # every padded row's logits: the size was chosen by the cost of exactly that (see padded_length)
            return ForwardPlan(BatchRow(request.cache, positions), distinct, None)
        tree = DraftTree.build([p.token_ids for p in distinct])
        positions = [tokens[-1], *tree.tokens]
        parents = [-1] + [0 if parent == ROOT else 1 + parent for parent in tree.parents]
        if padded and len(positions) < len(self.costs.padded_size):  # padding attends to the prefix only
            padding = self.costs.padded_size[len(positions)] - len(positions)
            positions, parents = positions + [tree.tokens[-1]] * padding, parents + [-1] * padding
        return ForwardPlan(BatchRow(request.cache, positions, parents=parents), distinct, tree)

    def _candidates(self, round_: DraftRound) -> list[Proposal]:
        """The drafts a round may verify: its chosen drafts, and in `tree` mode every shadow after
        them, the best rated first (`choose` heads its tree the same way)."""
        chosen = [p for p in round_.proposals if p.token_ids]
        if not round_.tree:
            return chosen
        shadows = [p for p in round_.shadows if p.token_ids]
        return chosen + sorted(shadows, key=lambda p: -self.draft_lengths.rate(self.draft_lengths.cut(p)))

    def _time_drafting(self, draft_round: DraftRound) -> None:
        """Running mean of each drafter's drafting seconds per drafted token."""
        for proposal in draft_round.proposals + draft_round.shadows:
            if proposal.token_ids and proposal.source != BRANCH:  # a tree's drafting time rides on its first chain
                per_token_s = proposal.draft_s / len(proposal.token_ids)
                before = self.draft_s_per_token.get(proposal.drafter)
                self.draft_s_per_token[proposal.drafter] = per_token_s if before is None else 0.9 * before + 0.1 * per_token_s

    def _model_tokens(self, drafter: str, in_hand: Sequence[Proposal]) -> int:
        """How many tokens to ask a model drafter for, its drafting time counted: none when a draft
        in hand, or a plain step, already promises more tokens per second (deploy/engine/draft_length.py);
        k until its drafting has been timed."""
        per_token_s = self.draft_s_per_token.get(drafter)
        if per_token_s is None:
            return self.k
        lengths = self.draft_lengths
        floor = max([lengths.rate(PLAIN_DRAFT), *(lengths.rate(lengths.cut(p)) for p in in_hand if p.token_ids)])
        return self.draft_lengths.tokens_to_draft(drafter, per_token_s, self.k, floor)


def _unsent_predictions(request: RequestState) -> Predictions | None:
    """The target's top-k predictions the coordinator has not had yet (None when none or not collected)."""
    if not request.predictions:
        return None
    chunk = joined(request.predictions)
    request.predictions = []
    return chunk


def _first_context(request: RequestState) -> np.ndarray | None:
    """The prompt's context on the request's first call (None on later calls)."""
    context = request.context if request.sent == 0 else None
    return None if context is None else context.numpy()


def _unsent_features(request: RequestState) -> torch.Tensor | None:
    """The request's features the coordinator has not had yet, [m, H] (None when not collected)."""
    if not request.features:
        return None
    chunk = torch.cat(request.features) if len(request.features) > 1 else request.features[0]
    request.features = []
    return chunk
