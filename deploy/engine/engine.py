"""The speculative engine: the draft -> verify -> accept round of one request or of a batch.

`iterate(requests)` is one round of every request in it (`step` and `run`: a batch of one; the
scheduler, deploy/engine/scheduler.py, batches many), as named calls:

    draft    one coordinator call for the batch (`draft_batch`): each request's newly committed
             tokens and previous round's feedback go in, its chosen drafter's draft (and with the
             `counterfactual` and `tree` verification modes, every model-free drafter's draft as a
             shadow) comes out
    choose   alone: each draft cut to the length whose expected yield pays for its forward
             (deploy/engine/draft_length.py); in `tree` mode the tree of every draft, the best
             rated first, cut node by node; the drafts not chosen stay shadows. In a batch of
             several (`choose_batch`): the batch's most likely draft nodes, as many as maximise
             its expected tokens per second (deploy/engine/goodput.py)
    verify   one target forward over every request's [last token, draft] (or its drafts' token
             tree), packed, on paged KV caches (`plan`, `TargetModel.forward_batch`); p computed
             once from each request's logits; `verify` / `verify_tree` accept losslessly
             (`accept`); each cache keeps its accepted path only; while the pool has a drafter
             that reads the target's features (actors/eagle.py), the forward's features of
             the prefill and of each accepted path are kept and ride on the next call
    learn    each verified draft's reward (computed here, where the timings are) and the
             shadows scored against the output as it is committed (deploy/engine/counterfactual.py)
             become the feedback that rides on the next coordinator call; the draft-length
             statistics learn from both
    commit   the round's tokens are emitted, honouring EOS, max_tokens and stop strings (with
             the target's log-probabilities of them, from the same forward, when asked)

A chosen model drafter is asked for as many tokens as pay for its drafting time too, and for
none when a model-free draft in hand already promises more (drafting in one process is
sequential: the coordinator drafts the cheap drafters first and defers the model drafter to a
second call, sized here). The no-draft arm, empty proposals or a one-token budget make the round a
plain target step. What forwards and drafting cost comes from the cost model
(deploy/engine/cost_model.py; a batch's, `BatchCosts`, and the rewards it charges, `BatchPricing`).
Greedy output equals plain decoding token for token, alone or in a batch; sampled output follows
the target's distribution. A request whose caller has left (`run(abandoned=...)`) ends before its
next round, its cache and drafter sessions freed. Rounds are serialised by one lock (the paged KV
store is shared by every request of the engine).
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.proposal import BRANCH, Proposal, Proposer
from actors.sampling import SamplingParams, warp_probs
from deploy.engine.cost_model import MAX_PADDING, BatchCosts, ForwardCosts, max_positions
from deploy.engine.counterfactual import CounterfactualScorer, ShadowScore
from deploy.engine.draft_length import DraftLengths
from deploy.engine.draft_tree import ROOT, DraftTree
from deploy.engine.goodput import batch_draft_nodes
from deploy.engine.logprobs import TokenLogprob, token_logprobs
from deploy.engine.paged_kv import PagedSequence
from deploy.engine.target import BatchRow, TargetModel
from deploy.engine.tree_verify import per_draft_outcome, verify_tree
from deploy.engine.verify import draft_overlaps, verify
from policy.coordinator import Coordinator, DraftCall, DraftRound, Feedback, RoundFeedback
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY
from policy.reward import BD, COST, round_reward

MAX_K = 32
ABORT = "abort"  # the finish reason of a request whose caller left (vLLM's name)
PLAIN_DRAFT = Proposal(drafter=NO_DRAFT)  # an empty draft: a plain step


@dataclass(frozen=True)
class RoundTrace:
    drafter: str  # several drafters of one round joined by '+'
    drafted: int  # positions verified (a tree's distinct nodes)
    accepted: int
    emitted: int
    reward: float
    draft_s: float  # the coordinator call as the target saw it (selection, RPCs, drafting)
    verify_s: float
    drafter_s: float = 0.0  # the slowest drafter's own drafting time (chosen and shadow drafts; on the engine's device)
    drafting_sum_s: float = 0.0  # every drafter's own drafting time as measured here, summed

    @property
    def parallel_draft_s(self) -> float:
        """The coordinator call had its drafters drafted in parallel, as drafter actors on their
        own devices do: its overhead (selection, RPCs, merging) plus the slowest drafter. Equal to
        draft_s for one drafter; in-process drafting pays their sum."""
        return max(0.0, self.draft_s - self.drafting_sum_s) + self.drafter_s


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort" (the caller left: `run(abandoned=...)`)
    prompt_tokens: int
    rounds: list[RoundTrace] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # per token of token_ids, when the request asked (sampling.logprobs)

    @property
    def summary(self) -> dict:
        per_drafter: dict[str, dict[str, int]] = {}
        for r in self.rounds:
            d = per_drafter.setdefault(r.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
            d["steps"] += 1
            d["drafted"] += r.drafted
            d["accepted"] += r.accepted
        drafted = sum(r.drafted for r in self.rounds)
        accepted = sum(r.accepted for r in self.rounds)
        return {
            "rounds": len(self.rounds),
            "num_spec_steps": sum(1 for r in self.rounds if r.drafted),
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": len(self.token_ids) / len(self.rounds) if self.rounds else None,
            "draft_s": sum(r.draft_s for r in self.rounds),
            "verify_s": sum(r.verify_s for r in self.rounds),
            "per_drafter": per_drafter,
        }

    def to_dict(self, trace: bool = False) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.summary}
        if trace:
            out["rounds"] = [asdict(r) for r in self.rounds]
        return out


@dataclass
class RequestState:
    """One request in flight: what the loop carries from round to round."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator
    cache: PagedSequence
    shadows: CounterfactualScorer
    cutting: bool  # cut drafts (and choose among them) by the measured costs
    tokens: list[int] = field(default_factory=list)  # committed context; the cache covers tokens[:-1]
    sent: int = 0  # committed tokens the coordinator has seen
    output: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when sampling.logprobs is set
    rounds: list[RoundTrace] = field(default_factory=list)
    feedback: RoundFeedback | None = None  # rides on the next coordinator call
    finish: str | None = None
    features: list[torch.Tensor] | None = None  # the target's features not yet sent (None: not collected)


@dataclass(frozen=True)
class Drafts:
    """A round's drafts as the coordinator gave them, priced by the cost model."""

    round: DraftRound
    drafting_s: float  # every drafter's own seconds as measured here, summed


@dataclass(frozen=True)
class BatchPricing:
    """What a batched forward charges each request's round in rewards: a plain step's share of
    the batch, plus each verified (or shadow) draft token's marginal cost (goodput's prices)."""

    plain_step_s: float
    per_token_s: float

    def verify_s(self, drafted: int) -> float:
        return self.plain_step_s + self.per_token_s * drafted


@dataclass(frozen=True)
class ForwardPlan:
    """A round's part of a batched target forward and what acceptance needs to read it."""

    row: BatchRow
    distinct: list[Proposal]  # the distinct non-empty drafts verified
    tree: DraftTree | None  # their token tree, when more than one


@dataclass(frozen=True)
class DraftOutcome:
    """What one verified draft earned: its tokens accepted and its BD overlaps."""

    accepted: int
    overlaps: tuple[float, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What one target forward decided."""

    emitted: tuple[int, ...]  # accepted tokens + the recovered or bonus token
    drafted: int  # positions verified (a tree's distinct nodes)
    outcomes: tuple[DraftOutcome, ...]  # per verified proposal, in order
    p: torch.Tensor | None  # [rows, V] the target's warped probabilities (None when nothing needs them)
    branch_rows: tuple[int, ...]  # the forward's row of each emitted token's distribution
    chain_size: int  # the forward's size when it verified one draft or none (0 for a tree)
    verify_s: float
    logprobs: tuple[TokenLogprob, ...] = ()  # per emitted token, when the request asked for them

    @property
    def accepted(self) -> int:
        return len(self.emitted) - 1


class SpeculativeEngine:
    """Runs requests against one target. Drafting goes through a coordinator: a local
    `Coordinator` over `drafters` (default), or any object with the same `propose_batch` /
    `finish` / `reward_kind` (the Ray coordinator actor's proxy)."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Mapping[str, Proposer] | None = None,
        policy: str = DEFAULT_POLICY,
        k: int = 7,
        seed: int = 0,
        max_padding: int = MAX_PADDING,
        coordinator: Coordinator | None = None,
        cut_drafts: bool = True,
        verify: str = DEFAULT_VERIFY,
        costs: ForwardCosts | None = None,
    ) -> None:
        """cut_drafts: verify only as much of each draft as pays for its forward (and in `tree`
        mode the nodes that pay, deploy/engine/draft_length.py); False verifies every drafted token
        of the chosen draft. A sampled request with a seed always verifies the chosen draft whole:
        cuts depend on measured times, and its output must depend on the seed alone. costs: the
        cost model (default: this machine's, measured on the target)."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidRequestError("k", f"must be an integer in 1..{MAX_K}, got {k!r}")
        if (drafters is None) == (coordinator is None):
            raise ValueError("give drafters (a local coordinator is built) or a coordinator, not both")
        self.target, self.k, self.cut_drafts = target, k, cut_drafts
        self.coordinator = coordinator if coordinator is not None else Coordinator(drafters, policy, seed, verify=verify)
        self.reward_kind = self.coordinator.reward_kind
        self._seeds = np.random.default_rng(seed)
        self._seed_lock = threading.Lock()
        self._lock = threading.RLock()  # the paged KV store: one forward (or release) at a time
        self.kv = target.new_paged_kv()  # every request's cache, paged (deploy/engine/paged_kv.py)
        only_plain = drafters is not None and set(drafters) == {NO_DRAFT}
        self.costs = costs or ForwardCosts(None if only_plain else target, max_positions(k, max_padding), max_padding)
        self.draft_s_per_token: dict[str, float] = {}  # each drafter's drafting seconds per token (running mean)
        # how many of each draft's tokens to verify, learned from the verifications (deploy/engine/draft_length.py)
        self.draft_lengths = DraftLengths(self.costs.forward_s, lambda n: self.costs.padded_size[n], k)
        self.batch_costs: BatchCosts | None = None  # set by enable_batching (a scheduler's engine)

    def generate(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingParams = SamplingParams(),
    ) -> GenerationResult:
        return self.run(self.target.encode(prompt=prompt, messages=messages, token_ids=token_ids), sampling)

    def run(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None,
            abandoned: Callable[[], bool] | None = None) -> GenerationResult:
        """Generate from prompt token ids; `on_tokens(list[int])` is called with each round's output.
        `abandoned()` is asked before every round: True (nobody waits for the answer any more) ends
        the request there, finish_reason "abort", and frees its cache and drafter sessions."""
        request = self.open(prompt_ids, sampling)
        try:
            while request.finish is None:
                if abandoned is not None and abandoned():
                    request.finish = ABORT
                    break
                trace = self.step(request)
                if on_tokens is not None and trace.emitted:
                    on_tokens(request.output[-trace.emitted:])
        finally:
            self.close(request)
        return self.result(request)

    def step(self, request: RequestState) -> RoundTrace:
        """One round of one request (a batch of one)."""
        return self.iterate([request])[0]

    def iterate(self, requests: Sequence[RequestState]) -> list[RoundTrace]:
        """One round of every request, verified in one batched target forward: draft (one
        coordinator call) -> choose what to verify (a batch of several: by the batch's goodput,
        `choose_batch`) -> one forward and accept -> learn -> commit. -> each request's trace."""
        with self._lock:
            start = time.perf_counter()
            drafted = self.draft_batch(requests)
            batched = len(requests) > 1 and self.batch_costs is not None
            chosen = (self.choose_batch(requests, drafted) if batched
                      else [self.choose(d.round, r.cutting) for r, d in zip(requests, drafted)])
            draft_s = time.perf_counter() - start  # every request of the batch waited for the whole call
            plans = [self.plan(request, round_, padded=len(requests) == 1) for request, round_ in zip(requests, chosen)]
            start = time.perf_counter()
            logits = self.target.forward_batch(self.kv, [plan.row for plan in plans],
                                               features=any(r.features is not None for r in requests))
            forward_s = time.perf_counter() - start
            pricing = self._batch_pricing(len(requests), sum(len(p.row.token_ids) for p in plans), forward_s) \
                if batched else None
            traces = []
            for request, drafts, round_, plan, row_logits in zip(requests, drafted, chosen, plans, logits):
                verify_s = pricing.verify_s(len(plan.row.token_ids) - 1) if pricing else forward_s
                verdict = self.accept(request, round_, plan, row_logits, verify_s)
                if request.features is not None:  # the accepted path's positions: a feature per emitted token
                    request.features.append(plan.row.features[list(verdict.branch_rows)])
                # a batch shares its coordinator call: each request is charged its share
                request.feedback, reward = self.learn(request, drafts, round_, verdict,
                                                      draft_s / len(requests) if batched else draft_s, pricing)
                emitted = self.commit(request, verdict.emitted, verdict.logprobs)
                own_s = [p.draft_s for p in round_.proposals + round_.shadows]
                trace = RoundTrace(round_.label, verdict.drafted, verdict.accepted, emitted, reward, draft_s,
                                   verdict.verify_s, max(own_s, default=0.0), drafts.drafting_s)
                request.rounds.append(trace)
                traces.append(trace)
            return traces

    def enable_batching(self) -> None:
        """Measure the batch forward's costs (deploy/engine/cost_model.BatchCosts): from then on a
        batch of several requests is cut by its goodput (`choose_batch`)."""
        if self.batch_costs is None:
            self.batch_costs = BatchCosts(self.target)

    def _batch_pricing(self, rows: int, positions: int, forward_s: float) -> BatchPricing:
        """The forward's seconds split as goodput priced them: a plain step's share per request,
        the rest per draft position (scaled to what the forward measured)."""
        costs = self.batch_costs
        predicted, plain = costs.forward_s(positions), costs.forward_s(rows)
        costs.observe(positions, forward_s)
        per_token = (predicted - plain) / (positions - rows) if positions > rows else costs.forward_s(rows + 1) - plain
        scale = forward_s / predicted
        return BatchPricing(scale * plain / rows, scale * max(per_token, 0.0))

    def choose_batch(self, requests: Sequence[RequestState], drafted: Sequence[Drafts]) -> list[DraftRound]:
        """What each request of a batch verifies: of all their drafts' nodes (the chosen drafts';
        in `tree` mode every draft's), the most likely ones, as many as maximise the batch's
        expected tokens per second (deploy/engine/goodput.py). A request that must verify its
        draft whole (`cutting` off) is priced as it stands."""
        base_positions, base_expected = len(requests), float(len(requests))
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
            order = sorted(range(tree.size), key=lambda node: (-accepted[node], node))
            offers.append((candidates, tree, order, [accepted[node] for node in order]))
        counts = batch_draft_nodes([offer[3] if offer else [] for offer in offers], base_positions, base_expected,
                                   self.batch_costs.forward_s)
        chosen = []
        for request, drafts, offer, count in zip(requests, drafted, offers, counts):
            round_ = drafts.round
            if offer is None:
                chosen.append(round_)
                continue
            candidates, tree, order, _ = offer
            lengths = dict(zip(map(id, candidates), self.draft_lengths.lengths_keeping(tree, set(order[:count]))))
            proposals = tuple(p.cut(lengths[id(p)]) if id(p) in lengths else p for p in round_.proposals)
            shadows = round_.shadows
            if round_.tree:  # shadows with kept nodes are verified in the tree
                proposals += tuple(p.cut(lengths[id(p)]) for p in shadows if lengths.get(id(p)))
                shadows = tuple(p for p in shadows if not lengths.get(id(p)))
            chosen.append(replace(round_, proposals=proposals, shadows=shadows))
        return chosen

    def _candidates(self, round_: DraftRound) -> list[Proposal]:
        """The drafts a round may verify: its chosen drafts, and in `tree` mode every shadow after
        them, the best rated first (`choose` heads its tree the same way)."""
        chosen = [p for p in round_.proposals if p.token_ids]
        if not round_.tree:
            return chosen
        shadows = [p for p in round_.shadows if p.token_ids]
        return chosen + sorted(shadows, key=lambda p: -self.draft_lengths.rate(self.draft_lengths.cut(p)))

    def open(self, prompt_ids: list[int], sampling: SamplingParams, prefill: bool = True) -> RequestState:
        """Check the request, prefill the target's cache with the prompt (all but its last token;
        `prefill=False` leaves that to the caller: a scheduler batches prefills)."""
        self.target.check_length(len(prompt_ids), sampling.max_tokens)
        with self._seed_lock:
            seed = sampling.seed if sampling.seed is not None else int(self._seeds.integers(2**62))
        cutting = self.cut_drafts and self.costs.plain_step_s > 0 and (sampling.greedy or sampling.seed is None)
        request = RequestState(uuid.uuid4().hex, list(prompt_ids), sampling, torch.Generator().manual_seed(seed),
                               PagedSequence(), CounterfactualScorer(with_overlaps=self.reward_kind == BD), cutting,
                               tokens=list(prompt_ids),
                               features=[] if getattr(self.coordinator, "wants_features", False) else None)
        if prefill and len(prompt_ids) > 1:
            self.prefill([(request, prompt_ids[:-1])])
        return request

    def prefill(self, chunks: Sequence[tuple[RequestState, Sequence[int]]]) -> None:
        """Append prompt tokens to their requests' caches in one batched forward (no logits needed;
        the features, for the requests that collect them)."""
        rows = [BatchRow(request.cache, tokens, logits_for=0) for request, tokens in chunks]
        with self._lock:
            self.target.forward_batch(self.kv, rows, features=any(r.features is not None for r, _ in chunks))
        for (request, _), row in zip(chunks, rows):
            if request.features is not None:
                request.features.append(row.features)

    def draft_batch(self, requests: Sequence[RequestState]) -> list[Drafts]:
        """The coordinator's drafts for every request's round, in one call; a deferred model
        drafter is asked for as many tokens as pay for its drafting time (`_model_tokens`)."""
        calls = [DraftCall(r.request_id, r.tokens[r.sent:], r.feedback,
                           min(self.k, r.sampling.max_tokens - len(r.output) - 1),  # leaves room for the bonus
                           r.sampling, r.cutting, self._unsent_features(r)) for r in requests]
        rounds = self.coordinator.propose_batch(calls)
        drafts = []
        for request, call, round_ in zip(requests, calls, rounds):
            if round_.deferred:
                in_hand = round_.proposals + (round_.shadows if round_.tree else ())
                asked = {arm: min(call.k, self._model_tokens(arm, in_hand)) for arm in round_.deferred}
                extra = self.coordinator.draft_deferred(request.request_id, asked, request.sampling)
                round_ = replace(round_, proposals=round_.proposals + extra, deferred=())
            if any(p.branches for p in round_.proposals):  # a draft tree's chains are verified together
                round_ = replace(round_, proposals=tuple(c for p in round_.proposals for c in p.chains()))
            request.sent = len(request.tokens)
            drafting_s = sum(p.draft_s for p in round_.proposals + round_.shadows)  # measured here
            round_ = self.costs.priced_drafts(round_)
            self._time_drafting(round_)
            drafts.append(Drafts(round_, drafting_s))
        return drafts

    @staticmethod
    def _unsent_features(request: RequestState) -> torch.Tensor | None:
        """The request's features the coordinator has not had yet, [m, H] (None when not collected)."""
        if not request.features:
            return None
        chunk = torch.cat(request.features) if len(request.features) > 1 else request.features[0]
        request.features = []
        return chunk

    def choose(self, round_: DraftRound, cutting: bool) -> DraftRound:
        """What to verify: each draft cut to the length worth verifying; in `tree` mode the best
        rated of the chosen draft and the shadows (the chosen one, or a plain step, on a tie)
        heads the tree of every uncut draft, cut node by node (DraftLengths.select_tree). The
        drafts left out are the round's shadows (as cut)."""
        if not cutting:
            return round_
        if not round_.tree and any(p.source == BRANCH for p in round_.proposals):  # a drafter's tree: cut node by node
            lengths = self.draft_lengths.select_tree(round_.proposals)
            return replace(round_, proposals=tuple(p.cut(n) for p, n in zip(round_.proposals, lengths) if n),
                           shadows=tuple(map(self.draft_lengths.cut, round_.shadows)))
        cut = replace(round_, proposals=tuple(map(self.draft_lengths.cut, round_.proposals)),
                      shadows=tuple(map(self.draft_lengths.cut, round_.shadows)))
        if not round_.tree or not cut.shadows:
            return cut
        chosen = cut.proposals  # none when the chosen model drafter sat the round out
        rated = [(self.draft_lengths.rate(p), p) for p in (*chosen, *cut.shadows)]  # each draft rated once
        best_rate, best = max(rated[len(chosen):], key=lambda pair: pair[0])
        chosen_rate = rated[0][0] if chosen else self.draft_lengths.rate(PLAIN_DRAFT)
        if best_rate > chosen_rate:
            chosen = (best,)
        if not chosen or not chosen[0].token_ids:
            return replace(cut, proposals=chosen, shadows=tuple(p for _, p in rated if not any(p is c for c in chosen)))
        whole = (*round_.proposals, *round_.shadows)
        first = next(i for i, (_, p) in enumerate(rated) if p is chosen[0])
        order = [first, *sorted((i for i, (_, p) in enumerate(rated) if i != first and whole[i].token_ids),
                                key=lambda i: -rated[i][0])]
        lengths = dict(zip(order, self.draft_lengths.select_tree([whole[i] for i in order])))
        return replace(cut, proposals=tuple(whole[i].cut(lengths[i]) for i in order if lengths[i]),
                       shadows=tuple(p for i, (_, p) in enumerate(rated) if not lengths.get(i) and p.source != BRANCH))

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

    def accept(self, request: RequestState, chosen: DraftRound, plan: ForwardPlan, logits: torch.Tensor,
               verify_s: float) -> Verdict:
        """Accept from the forward's logits losslessly; the cache keeps the accepted path only."""
        tokens, sampling, with_overlaps = request.tokens, request.sampling, self.reward_kind == BD
        distinct, tree = plan.distinct, plan.tree
        if tree is None:
            draft, q = (distinct[0].token_ids, distinct[0].q) if distinct else ((), None)
            logits = logits[: len(draft) + 1]  # [d+1, V]
            p = warp_probs(logits, sampling) if with_overlaps or not sampling.greedy else None  # [d+1, V]
            result = verify(draft, q, logits, sampling, request.generator, with_overlaps=with_overlaps, p=p)
            self.kv.crop(request.cache, len(tokens) + result.accepted)
            outcomes = tuple(
                DraftOutcome(0) if not proposal.token_ids
                else DraftOutcome(result.accepted, result.overlaps if proposal.q is q or not with_overlaps
                                  else draft_overlaps(draft, proposal.q, p[: len(draft)]))
                for proposal in chosen.proposals
            )
            rows = tuple(range(result.accepted + 1))
            return Verdict(result.token_ids, len(draft), outcomes, p, rows, len(plan.row.token_ids), verify_s,
                           self._logprobs(logits, rows, result.token_ids, sampling))
        drafts = [p.token_ids for p in distinct]
        logits = logits[: 1 + tree.size]  # [1+n, V]
        p = warp_probs(logits, sampling) if with_overlaps or not sampling.greedy else None  # [1+n, V]
        result = verify_tree(tree, [d.q for d in distinct], drafts, logits, sampling, request.generator, p=p)
        self.kv.keep(request.cache, len(tokens), [len(tokens) + node for node in result.nodes])
        index = {proposal.token_ids: i for i, proposal in enumerate(distinct)}
        outcomes = tuple(
            DraftOutcome(*per_draft_outcome(tree, index[proposal.token_ids], proposal.token_ids, proposal.q,
                                            p if with_overlaps else None, result))
            if proposal.token_ids else DraftOutcome(0)
            for proposal in chosen.proposals
        )
        rows = (0, *(1 + node for node in result.nodes))
        return Verdict(result.token_ids, tree.size, outcomes, p, rows, 0, verify_s,
                       self._logprobs(logits, rows, result.token_ids, sampling))

    def learn(self, request: RequestState, drafts: Drafts, chosen: DraftRound, verdict: Verdict,
              draft_s: float, pricing: BatchPricing | None = None) -> tuple[RoundFeedback | None, float]:
        """The round's feedback for the coordinator (each verified draft's reward, and the shadows
        whose score became final) and the draft-length statistics' update. -> (feedback, the
        best verified draft's reward)."""
        if pricing is None:  # the cost model's sizes are forwards of one request
            self.costs.observe(verdict.chain_size, verdict.verify_s)
            priced_s = self.costs.priced_verify_s(verdict.chain_size, verdict.drafted + 1, verdict.verify_s)
        else:
            priced_s = verdict.verify_s
        for proposal, outcome in zip(chosen.proposals, verdict.outcomes):
            self.draft_lengths.observe(proposal, outcome.accepted)
        # what the round cost beyond drafting (selection, RPCs), shared by every draft in it
        overhead_s = max(0.0, draft_s - drafts.drafting_s)
        plain_step_s = pricing.plain_step_s if pricing else self.costs.plain_step_s
        best = {}  # a draft tree's chains earn their drafter one reward: its longest accepted chain's
        for p, outcome in zip(chosen.proposals, verdict.outcomes):
            best[p.drafter] = max(best.get(p.drafter, 0), outcome.accepted)
        feedback = [self._feedback(p, best[p.drafter] if p.source != BRANCH else outcome.accepted, outcome.overlaps,
                                   p.draft_s + overhead_s, priced_s, plain_step_s)
                    for p, outcome in zip(chosen.proposals, verdict.outcomes) if p.source != BRANCH]
        position = len(request.tokens)
        final = request.shadows.add([replace(s, draft_s=s.draft_s + overhead_s) for s in chosen.shadows], position)
        p, rows = verdict.p, verdict.branch_rows
        final += request.shadows.observe(position, verdict.emitted, lambda i: p[rows[i]])
        for score in final:  # a shadow teaches the draft lengths as a verified draft would
            self.draft_lengths.observe(score.proposal, score.matched)
        feedback += [self._counterfactual(s, pricing) for s in final]
        reward = max((f.reward for f in feedback if not f.counterfactual), default=0.0)
        return (RoundFeedback(tuple(feedback)) if feedback else None), reward

    def commit(self, request: RequestState, emitted_ids: Sequence[int], logprobs: Sequence[TokenLogprob] = ()) -> int:
        """Append the round's tokens (and their log-probabilities, when asked) to the output,
        honouring EOS, max_tokens and stop strings. -> how many were emitted."""
        output, sampling = request.output, request.sampling
        before = len(output)
        request.tokens.extend(emitted_ids)
        for i, token in enumerate(emitted_ids):
            if token in self.target.eos_ids:
                request.finish = "stop"
                return len(output) - before
            output.append(token)
            if logprobs:
                request.logprobs.append(logprobs[i])
            if len(output) >= sampling.max_tokens:
                request.finish = "length"
                return len(output) - before
        if sampling.stop:
            tail = self.target.decode(output[-(len(emitted_ids) + 16) :])
            if any(stop in tail for stop in sampling.stop):
                request.finish = "stop"
        return len(output) - before

    def close(self, request: RequestState) -> None:
        """Score the shadows still open, hand the last feedback to the coordinator, free the request."""
        committed = request.prompt_ids + request.output
        last = tuple(self._counterfactual(s) for s in request.shadows.finish())
        feedback = request.feedback
        if last:
            feedback = replace(feedback, drafts=feedback.drafts + last) if feedback else RoundFeedback(last)
        with self._lock:
            self.kv.release(request.cache)
        self.coordinator.finish(request.request_id, committed[request.sent:], feedback)

    def result(self, request: RequestState) -> GenerationResult:
        """The request's text and tokens, cut at the first stop string."""
        output, finish, stops = request.output, request.finish, request.sampling.stop
        text = self.target.decode(output)
        cuts = [cut for cut in (text.find(stop) for stop in stops) if cut >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
            while output and any(stop in self.target.decode(output[:-1]) for stop in stops):
                output.pop()  # token ids end with the token that completed the stop string
        logprobs = request.logprobs[: len(output)] if request.sampling.logprobs is not None else None
        return GenerationResult(text, output, finish, len(request.prompt_ids), request.rounds, logprobs)

    @staticmethod
    def _logprobs(logits: torch.Tensor, rows: Sequence[int], emitted: Sequence[int],
                  sampling: SamplingParams) -> tuple[TokenLogprob, ...]:
        if sampling.logprobs is None:
            return ()
        return token_logprobs(logits, rows, emitted, sampling.logprobs)

    def _time_drafting(self, draft_round: DraftRound) -> None:
        """Running mean of each drafter's drafting seconds per drafted token."""
        for proposal in draft_round.proposals + draft_round.shadows:
            if proposal.token_ids and proposal.source != BRANCH:  # a tree's drafting time rides on its first chain
                per_token_s = proposal.draft_s / len(proposal.token_ids)
                before = self.draft_s_per_token.get(proposal.drafter)
                self.draft_s_per_token[proposal.drafter] = per_token_s if before is None else 0.9 * before + 0.1 * per_token_s

    def _model_tokens(self, drafter: str, in_hand: Sequence[Proposal]) -> int:
        """How many tokens to ask a model drafter for, its drafting time counted: none when a draft
        in hand already promises more tokens per second (deploy/engine/draft_length.py); k until its
        drafting has been timed."""
        per_token_s = self.draft_s_per_token.get(drafter)
        if per_token_s is None:
            return self.k
        floor = max((self.draft_lengths.rate(self.draft_lengths.cut(p)) for p in in_hand if p.token_ids), default=0.0)
        return self.draft_lengths.tokens_to_draft(drafter, per_token_s, self.k, floor)

    def _feedback(self, proposal: Proposal, accepted: int, overlaps: Sequence[float], draft_s: float, verify_s: float,
                  plain_step_s: float, counterfactual: bool = False) -> Feedback:
        """plain_step_s: what a plain step costs the request (alone, or its share of a batch)."""
        reward = round_reward(
            self.reward_kind, accepted=accepted, drafted=len(proposal.token_ids), overlaps=overlaps,
            draft_s=draft_s, verify_s=verify_s, plain_step_s=plain_step_s, k=self.k,
        )
        # the cost reward is a rate: weighed by the round's duration, an arm's mean is its throughput
        weight = (draft_s + verify_s) / plain_step_s if self.reward_kind == COST and plain_step_s else 1.0
        return Feedback(proposal.drafter, len(proposal.token_ids), accepted, reward, counterfactual, weight)

    def _counterfactual(self, shadow: ShadowScore, pricing: BatchPricing | None = None) -> Feedback:
        """A shadow draft's feedback: its matched tokens as accepted; the cost reward prices it as
        if verified (its drafting time plus its round's overhead, a verification of its size,
        alone or in the batch that scored it)."""
        proposal, drafted = shadow.proposal, len(shadow.proposal.token_ids)
        overlaps = tuple(shadow.overlaps)
        if overlaps and shadow.matched < len(overlaps):  # a mismatch: the positions after it count 0
            overlaps += (0.0,) * (drafted - len(overlaps))
        if pricing is None:
            verify_s, plain_step_s = self.costs.shadow_verify_s(drafted), self.costs.plain_step_s
        else:
            verify_s, plain_step_s = pricing.verify_s(drafted), pricing.plain_step_s
        return self._feedback(proposal, shadow.matched, overlaps, proposal.draft_s, verify_s, plain_step_s,
                              counterfactual=True)
