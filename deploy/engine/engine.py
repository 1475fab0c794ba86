"""The speculative engine: the draft -> verify -> accept round of one request or of a batch.

`iterate(requests)` is one round of every request in it (`step` and `run`: a batch of one; the
scheduler, deploy/engine/scheduler.py, batches many). Each part of the round lives in its own module:

    plan     deploy/engine/planner.py: one coordinator call for the batch (through the
             `DraftCoordinator` interface, deploy/engine/coordination.py), the drafts worth
             verifying chosen (alone by the draft lengths' expected yield, in a batch of several
             by its goodput), each request's row of the forward laid out
    verify   one target forward over every request's [last token, draft] (or its drafts' token
             tree), packed, on slot KV caches (`TargetModel.forward_batch`); while the pool has
             a drafter that reads the target's features (actors/eagle.py), the forward's
             features of the prefill and of each accepted path are kept and ride on the next call
    accept   deploy/engine/acceptance.py: lossless acceptance from the forward's logits (one
             rejection sampler for a chain or a tree); each cache keeps its accepted path only;
             while the pool has a drafter that recycles the target's predictions
             (actors/recycling.py), the top-k of the logits at every verified position
             (deploy/engine/predictions.py) ride on the next call
    learn    deploy/engine/learning.py: the rewards and the shadows' scores become the feedback
             that rides on the next coordinator call; the draft-length statistics learn from both
    emit     deploy/engine/output.py: the round's tokens join the output, honouring EOS,
             max_tokens and stop strings (with the target's log-probabilities, when asked)

The no-draft arm, empty proposals or a one-token budget make the round a plain target step. What
forwards and drafting cost comes from the cost model (deploy/engine/cost_model.py). Greedy output
equals plain decoding token for token, alone or in a batch; sampled output follows the target's
distribution. A request whose caller has left (`run(abandoned=...)`) ends before its next round,
its cache and drafter sessions freed. Rounds are serialised by one lock (the slot KV store is
shared by every request of the engine).
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.proposal import Proposer
from actors.sampling import SamplingParams
from deploy.engine import output
from deploy.engine.acceptance import accept
from deploy.engine.coordination import DraftCoordinator
from deploy.engine.cost_model import BatchCosts, ForwardCosts, max_positions
from deploy.engine.counterfactual import CounterfactualScorer
from deploy.engine.defaults import MAX_K, MAX_PADDING, K
from deploy.engine.draft_length import DraftLengths
from deploy.engine.learning import RoundLearner, batch_pricing
from deploy.engine.planner import DraftPlanner
from deploy.engine.predictions import top_predictions
from deploy.engine.request import ABORT, GenerationResult, RequestState, RoundTrace
from deploy.engine.shared_lengths import LengthSharing
from deploy.engine.slot_kv import SlotSequence
from deploy.engine.target import BatchRow, TargetModel
from policy.coordinator import Coordinator
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY
from policy.reward import BD


class SpeculativeEngine:
    """Runs requests against one target. Drafting goes through a coordinator: a local
    `Coordinator` over `drafters` (default), or any `DraftCoordinator` (the Ray coordinator
    actor's proxy)."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Mapping[str, Proposer] | None = None,
        policy: str = DEFAULT_POLICY,
        k: int = K,
        seed: int = 0,
        max_padding: int = MAX_PADDING,
        coordinator: DraftCoordinator | None = None,
        cut_drafts: bool = True,
        verify: str = DEFAULT_VERIFY,
        costs: ForwardCosts | None = None,
        max_tree_nodes: int | None = None,
    ) -> None:
        """cut_drafts: verify only as much of each draft as pays for its forward (and in `tree`
        mode the nodes that pay, deploy/engine/draft_length.py); False verifies every drafted token
        of the chosen draft. A sampled request with a seed always verifies the chosen draft whole:
        cuts depend on measured times, and its output must depend on the seed alone. costs: the
        cost model (default: this machine's, measured on the target). max_tree_nodes: the most
        draft nodes a round verifies (None: as many as pay)."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidRequestError("k", f"must be an integer in 1..{MAX_K}, got {k!r}")
        if (drafters is None) == (coordinator is None):
            raise ValueError("give drafters (a local coordinator is built) or a coordinator, not both")
        self.target, self.k, self.cut_drafts = target, k, cut_drafts
        self.coordinator = coordinator if coordinator is not None else Coordinator(drafters, policy, seed, verify=verify)
        self.reward_kind = self.coordinator.reward_kind
        self._seeds = np.random.default_rng(seed)
        self._seed_lock = threading.Lock()
        self._lock = threading.RLock()  # the slot KV store: one forward (or release) at a time
        self.kv = target.new_kv()  # every request's cache, in slots (deploy/engine/slot_kv.py)
        only_plain = drafters is not None and set(drafters) == {NO_DRAFT}
        self.costs = costs or ForwardCosts(None if only_plain else target, max_positions(k, max_padding), max_padding)
        # how many of each draft's tokens to verify, learned from the verifications (deploy/engine/draft_length.py)
        self.draft_lengths = DraftLengths(self.costs.forward_s, lambda n: self.costs.padded_size[n], k, max_tree_nodes)
        self.planner = DraftPlanner(k, self.costs, self.draft_lengths)
        self.learner = RoundLearner(self.reward_kind, k, self.costs, self.draft_lengths)
        # pooled with every replica's through a coordinator shared across processes (deploy/engine/
        # shared_lengths.py); a coordinator in this process serves this engine alone: nothing to pool
        pool_lengths = getattr(self.coordinator, "pool_lengths", None)
        shared = pool_lengths is not None and not isinstance(self.coordinator, Coordinator)
        self.sharing = LengthSharing(self.draft_lengths, pool_lengths, guard=self.planner.guard,
                                     pool_guard=getattr(self.coordinator, "pool_guard", None)) if shared else None

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

    def iterate(self, requests: Sequence[RequestState],
                prefill: Sequence[tuple[RequestState, Sequence[int]]] = ()) -> list[RoundTrace]:
        """One round of every request, verified in one batched target forward: budget (a batch of
        several: the most draft tokens its goodput could verify) -> draft (one coordinator call)
        -> choose what to verify (a batch of several: by the batch's goodput) -> one forward ->
        accept -> learn -> emit. A batch of several also teaches its size's acceptance calibration
        and its guard (the iteration's realised gain, with or without drafts). `prefill`: prompt
        chunks of other requests appended to their caches in the same forward (a scheduler's
        admissions). -> each request's trace."""
        planner = self.planner
        with self._lock:
            began = start = time.perf_counter()
            prefill_rows = [BatchRow(request.cache, tokens, logits_for=0, summed=True) for request, tokens in prefill]
            prefilled = sum(len(row.token_ids) for row in prefill_rows)
            batched = len(requests) + len(prefill_rows) > 1 and planner.batch_costs is not None
            # the guard (deploy/engine/draft_guard.py) keeps a batch size plain where drafting was realised not to pay
            drafting = not (batched and requests) or planner.guard.drafts(len(requests))
            budget = (planner.budget(requests, prefilled) if drafting else 0) if batched else None
            drafted = planner.draft(self.coordinator, requests, budget) if requests else []
            if batched:
                chosen, expectations = planner.choose_batch(requests, drafted, prefilled)
            else:
                chosen = [planner.choose(d.round, r.cutting) for r, d in zip(requests, drafted)]
            draft_s = time.perf_counter() - start  # every request of the batch waited for the whole call
            alone = len(requests) == 1 and not prefill_rows  # a forward of one request: padded to a cheaper size
            plans = [planner.plan(request, round_, padded=alone) for request, round_ in zip(requests, chosen)]
            rows = [plan.row for plan in plans] + prefill_rows
            start = time.perf_counter()
            logits = self.target.forward_batch(self.kv, rows, features=any(
                r.features is not None for r in [*requests, *(request for request, _ in prefill)]))
            forward_s = time.perf_counter() - start
            self._keep_prefill_features(prefill, prefill_rows)
            if not requests:
                return []
            pricing = batch_pricing(planner.batch_costs, len(requests), sum(len(row.token_ids) for row in rows),
                                    forward_s) if batched else None
            traces, accepted = [], []
            for request, drafts, round_, plan, row_logits in zip(requests, drafted, chosen, plans, logits):
                verify_s = pricing.verify_s(len(plan.row.token_ids) - 1) if pricing else forward_s
                verdict = accept(self.kv, request, round_, plan, row_logits, verify_s, self.reward_kind == BD)
                accepted.append([outcome.accepted for outcome in verdict.outcomes])
                if request.features is not None:  # the accepted path's positions: a feature per emitted token
                    request.features.append(plan.row.features[list(verdict.branch_rows)])
                if request.predictions is not None:  # every verified position's top-k, for the recycling drafter
                    request.predictions.append(top_predictions(
                        plan.row.token_ids, row_logits, 1 + verdict.drafted, verdict.branch_rows,
                        parents=plan.row.parents, before=request.tokens[-2] if len(request.tokens) > 1 else -1))
                # a batch shares its coordinator call: each request is charged its share
                request.feedback, reward = self.learner.learn(request, drafts, round_, verdict,
                                                              draft_s / len(requests) if batched else draft_s, pricing)
                emitted = output.commit(request, verdict.emitted, self.target.eos_ids, self.target.decode, verdict.logprobs)
                own_s = [p.draft_s for p in round_.proposals + round_.shadows]
                trace = RoundTrace(round_.label, verdict.drafted, verdict.accepted, emitted, reward, draft_s,
                                   verdict.verify_s, max(own_s, default=0.0), drafts.drafting_s)
                request.rounds.append(trace)
                traces.append(trace)
            if batched:  # what batches of this size accept, and what their drafting realises
                planner.observe_batch(len(requests), expectations, chosen, accepted)
                plain_s = planner.batch_costs.profiled_s(len(requests) + prefilled)
                drafts_ran = drafting or not all(r.cutting for r in requests)  # those draft whatever the guard says
                planner.guard.observe(len(requests), drafts_ran, sum(t.emitted for t in traces) * plain_s
                                      / (len(requests) * (time.perf_counter() - began)))
            return traces

    def share_learning(self, wait: bool = False) -> None:
        """Pool the draft-length statistics with the other replicas' when due (deploy/engine/
        shared_lengths.py); wait: now, and take the pool's totals before returning (at start).
        Called between iterations by the thread that runs them."""
        if self.sharing is not None:
            self.sharing.share_now() if wait else self.sharing.maybe_share()

    def enable_batching(self) -> None:
        """Measure the batch forward's costs (deploy/engine/cost_model.BatchCosts): from then on a
        batch of several requests is cut by its goodput (`DraftPlanner.choose_batch`)."""
        if self.planner.batch_costs is None:
            self.planner.batch_costs = BatchCosts(self.target)

    def load_report(self) -> dict:
        """Per batch-size bucket: the planner's P(accepted) of the nodes batches verified against
        what they accepted (deploy/engine/load_calibration.py), and the guard's realised gains
        (deploy/engine/draft_guard.py). Empty before a batch of several ran."""
        calibration, guard = self.planner.calibration.report(), self.planner.guard.report()
        return {"calibration": calibration, "guard": guard} if calibration or guard else {}

    def open(self, prompt_ids: list[int], sampling: SamplingParams, prefill: bool = True) -> RequestState:
        """Check the request, prefill the target's cache with the prompt (all but its last token;
        `prefill=False` leaves that to the caller: a scheduler batches prefills)."""
        self.target.check_length(len(prompt_ids), sampling.max_tokens)
        with self._seed_lock:
            seed = sampling.seed if sampling.seed is not None else int(self._seeds.integers(2**62))
        cutting = self.cut_drafts and self.costs.plain_step_s > 0 and not sampling.seeded_sampling
        request = RequestState(uuid.uuid4().hex, list(prompt_ids), sampling, torch.Generator().manual_seed(seed),
                               SlotSequence(), CounterfactualScorer(with_overlaps=self.reward_kind == BD), cutting,
                               tokens=list(prompt_ids),
                               features=[] if getattr(self.coordinator, "wants_features", False) else None,
                               predictions=[] if getattr(self.coordinator, "wants_predictions", False) else None)
        if prefill and len(prompt_ids) > 1:
            self.prefill([(request, prompt_ids[:-1])])
        return request

    def prefill(self, chunks: Sequence[tuple[RequestState, Sequence[int]]]) -> None:
        """Append prompt tokens to their requests' caches in one batched forward (no logits needed;
        the features, for the requests that collect them)."""
        self.iterate([], chunks)

    @staticmethod
    def _keep_prefill_features(chunks: Sequence[tuple[RequestState, Sequence[int]]], rows: Sequence[BatchRow]) -> None:
        for (request, _), row in zip(chunks, rows):
            request.sum_hidden(row.hidden_sum, len(row.token_ids))
            if request.features is not None:
                request.features.append(row.features)

    def close(self, request: RequestState) -> None:
        """Score the shadows still open, hand the last feedback to the coordinator, free the request."""
        committed = request.prompt_ids + request.output
        feedback = self.learner.last_feedback(request)
        with self._lock:
            self.kv.release(request.cache)
        self.coordinator.finish(request.request_id, committed[request.sent:], feedback)

    def result(self, request: RequestState) -> GenerationResult:
        """The request's text and tokens, cut at the first stop string."""
        return output.result(request, self.target.decode)
