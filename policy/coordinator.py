"""The coordinator: the only holder of bandit state. It picks the drafter for each round,
dispatches drafting to it, and learns from the target's verification feedback.

One call per speculation round from the target:

    propose(request_id, new_tokens, feedback, k, sampling) -> DraftRound

`new_tokens` are the tokens the target committed since its previous call (the prompt on the
first call); `feedback` (a RoundFeedback: one Feedback per drafter that drafted) describes the
previous round (feedback for round t rides on the call of round t+1). The coordinator keeps per
request the committed context, the request's bandit (cold, or warm-started from global
statistics with `-warm`, or with `-context` from the earlier requests whose prompts the target
represented most alike: `context`, sent with the first call; policy/context_memory.py) and how much of the context each drafter has seen, so a drafter
receives only its unseen tokens (catch-up after rounds it sat out). `finish` learns the last
round and releases every drafter's session.

A round drafts with the bandit's chosen arm. With the verification modes `counterfactual`,
`tree` and `ensemble` (policy/registry.py) the model-free drafters not chosen draft too (`shadows`); the no-draft
arm, when not chosen, is a shadow that drafts nothing (its cost reward is what a plain step would
have scored), so no policy has to pull it to learn it. The round carries its mode: the engine
verifies the chosen draft (`chosen`, `counterfactual`), cuts the tree of all of them (`tree`) or
combines them into one (`ensemble`).

Drafting in one process is sequential. With `defer_models=True` a chosen model drafter does not
draft in `propose`: the round names it in `deferred`, the caller sizes its draft from the cheap
drafts in hand, and `draft_deferred` drafts it (0 tokens: it sits the round out and later catches
up). The coordinator never calls back into its caller.

Drafters that read the target's features (`needs_features`: the `eagle` head, actors/eagle.py)
get them the same way: while the pool has one (`wants_features`, which every round reports to
the target as `features_wanted`), the target sends with each call the features of the positions
it committed since (`DraftCall.features`), the coordinator keeps them per request, and such a
drafter receives, beside its unseen tokens, the features it has not seen. Other drafters never
see them.

A drafter that recycles the target's own predictions (`needs_predictions`: `recycling`,
actors/recycling.py) gets, with each call (`DraftCall.predictions`, while `wants_predictions`),
the top-k of the target's logits at the positions its last verification scored, written into its
table under the request's tenant (`recycle`) before the round drafts.

A request whose target stops calling (its replica died mid-request) is forgotten after
`request_ttl_s` without a call, and its drafter sessions are released (`expire`).

`add_drafter` grows the pool live: the new arm joins new requests and the ones in flight;
`remove_drafter` shrinks it: no round picks the arm again, requests in flight carry on with the
others. `learned` and `restore` carry what was learned across requests (each arm's global
statistics, each drafter's counters and the context memory) over a restart. The Ray actor body over drafter actors is
cluster/coordinator_actor.py.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal, Proposer, is_model_free, needs_features, needs_predictions
from actors.sampling import SamplingParams
from policy.bandit import ArmStats, Bandit
from policy.context_memory import ContextMemory
from policy.pooled_counts import PooledCounts
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY, ENSEMBLE, TREE, parse_policy

REQUEST_TTL_S = 60.0  # a request without a call for this long is over (its target died)
DRAFT_TIMEOUT_S = 5.0  # a drafter's answer later than this costs the round its draft (the coordinator actor)


@dataclass(frozen=True)
class Feedback:
    """The target's verdict on one drafter's draft, reward already computed with
    `Coordinator.reward_kind`. Counterfactual: scored against the output, never verified."""

    drafter: str
    drafted: int
    accepted: int
    reward: float
    counterfactual: bool = False
    weight: float = 1.0  # pulls it counts as (the cost reward: the round's duration in plain steps)


@dataclass(frozen=True)
class RoundFeedback:
    drafts: tuple[Feedback, ...]


@dataclass(frozen=True)
class DraftRound:
    proposals: tuple[Proposal, ...] = ()  # to verify; drafts may be empty
    shadows: tuple[Proposal, ...] = ()  # drafted for counterfactual feedback only
    verify: str = DEFAULT_VERIFY  # how the engine verifies them (policy/registry.py VERIFY_MODES)
    deferred: tuple[str, ...] = ()  # chosen model drafters left for `draft_deferred`
    features_wanted: bool = False  # the pool has a drafter that reads the target's features
    predictions_wanted: bool = False  # the pool has a drafter that recycles the target's predictions

    @property
    def tree(self) -> bool:
        """The engine cuts the tree of every draft of the round node by node."""
        return self.verify == TREE

    @property
    def ensemble(self) -> bool:
        """The engine combines every draft of the round into one (deploy/engine/ensemble.py)."""
        return self.verify == ENSEMBLE

    @property
    def label(self) -> str:
        """The round's name in traces and metrics: its drafters, sorted, joined by '+'."""
        return "+".join(sorted({p.drafter for p in self.proposals})) or NO_DRAFT


PLAIN_ROUND = DraftRound()


@dataclass(frozen=True)
class DraftCall:
    """One request's part of a batched coordinator call (`propose_batch`): `propose`'s arguments."""

    request_id: str
    new_tokens: Sequence[int]
    feedback: RoundFeedback | None
    k: int
    sampling: SamplingParams
    defer_models: bool = False
    features: Any = None  # the target's features of the positions committed since its last call ([m, H] tensor)
    predictions: Any = None  # the target's top-k predictions at the positions it verified since: (tokens [n], ids [n, k], probs [n, k])
    context: Any = None  # on a request's first call: the mean of the target's last hidden states over the prompt ([H])


@dataclass(frozen=True)
class Selection:
    arm: str  # drafts, and its draft is verified
    shadows: tuple[str, ...]  # draft for counterfactual feedback only
    deltas: dict[str, list[int]]  # per drafter asked, the committed tokens it has not seen
    features: dict[str, Any] = field(default_factory=dict)  # per drafter asked that reads features, the chunks it has not seen


@dataclass
class _Request:
    bandit: Bandit
    tokens: list[int] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # committed tokens each drafter has seen
    deferred: dict[str, tuple[list[int], Any]] = field(default_factory=dict)  # left for draft_deferred: their deltas
    last_call: float = field(default_factory=time.monotonic)
    features: list = field(default_factory=list)  # the target's features as received, in chunks ([m, H] each)
    features_received: int = 0
    features_sent: dict[str, int] = field(default_factory=dict)  # features each feature drafter has seen
    context: Any = None  # the prompt's projected context (contextual policies)
    observed: dict[str, ArmStats] = field(default_factory=dict)  # what this request saw of each arm, warm start left out

    def unseen_features(self, arm: str) -> tuple | None:
        """The features `arm` has not seen, as chunks in order (None when none), marked as seen."""
        seen = self.features_sent.get(arm, 0)
        if seen >= self.features_received:
            return None
        chunks, start = [], self.features_received
        for chunk in reversed(self.features):
            if start <= seen:
                break
            start -= len(chunk)
            chunks.append(chunk[max(0, seen - start):])
        self.features_sent[arm] = self.features_received
        return tuple(chunks[::-1])


@dataclass
class DrafterStats:
    pulls: int = 0
    drafted: int = 0
    accepted: int = 0
    reward_sum: float = 0.0
    counterfactual: int = 0  # rounds scored against the output without being verified


class Coordinator:
    def __init__(self, drafters: Mapping[str, Proposer], policy: str = DEFAULT_POLICY, seed: int = 0,
                 request_ttl_s: float = REQUEST_TTL_S, verify: str = DEFAULT_VERIFY) -> None:
        self.drafters = dict(drafters)
        self.request_ttl_s = request_ttl_s
        self.spec = parse_policy(policy, list(self.drafters), verify)
        self.global_stats: dict[str, ArmStats] = {arm: ArmStats() for arm in self.spec.arms}
        self.drafter_stats: dict[str, DrafterStats] = {name: DrafterStats() for name in self.drafters}
        self.requests: dict[str, _Request] = {}
        self._rng = np.random.default_rng(seed)
        self.model_free = {name for name, d in self.drafters.items() if is_model_free(d)}
        self.feature_arms = {name for name, d in self.drafters.items() if needs_features(d)}
        self.prediction_arms = {name for name, d in self.drafters.items() if needs_predictions(d)}
        self.draft_lengths = PooledCounts()  # every target replica's draft-length statistics, summed
        self.guard_figures: dict[str, list[float]] = {}  # per batch bucket: the best-evidenced replica's guard figures
        self.contexts = ContextMemory(seed=seed)  # finished requests' prompts and what they saw (contextual policies)
        self._lock = threading.Lock()  # guards bandits and statistics, never held while drafting

    @property
    def reward_kind(self) -> str:
        return self.spec.reward

    @property
    def policy(self) -> str:
        return self.spec.name

    @property
    def verify(self) -> str:
        return self.spec.verify

    @property
    def wants_features(self) -> bool:
        """Whether a drafter of the pool reads the target's features (then the target sends them)."""
        return bool(self.feature_arms)

    @property
    def wants_predictions(self) -> bool:
        """Whether a drafter of the pool recycles the target's predictions (then the target sends them)."""
        return bool(self.prediction_arms)

    def recycle(self, predictions: Any, sampling: SamplingParams) -> None:
        """The target's top-k predictions of a request's last verification (DraftCall.predictions)
        into every recycling drafter's table, under the request's tenant (its cache_salt), before
        the round drafts."""
        if predictions is None or not self.prediction_arms:
            return
        for arm in tuple(self.prediction_arms):
            drafter = self.drafters.get(arm)
            if drafter is not None:
                drafter.recycle(sampling.cache_salt, *predictions)

    def select(
        self, request_id: str, new_tokens: Sequence[int], feedback: RoundFeedback | None, k: int, features: Any = None,
        context: Any = None,
    ) -> Selection | None:
        """Record the committed tokens and the feedback, pick this round's drafters. `context`: the
        prompt's, on a request's first call (a contextual policy warm-starts from it).

        -> the selection, or None when k <= 0 (no room to draft: a plain step that nobody learns from).
        """
        with self._lock:
            request = self.requests.get(request_id)
            if request is None and feedback is not None:
                return None  # begun before this coordinator (re)started: it lacks the context, so no draft
            if request is None:
                rng = np.random.default_rng(self._rng.integers(2**63))
                embedded = self.contexts.embed(context) if self.spec.contextual else None
                bandit = self.spec.make(self._prior(embedded), rng, self.model_free | {NO_DRAFT})
                request = self.requests[request_id] = _Request(bandit, context=embedded)
            request.tokens.extend(int(t) for t in new_tokens)
            if features is not None and len(features) and self.feature_arms:
                request.features.append(features)
                request.features_received += len(features)
            request.last_call = time.monotonic()
            if feedback is not None:
                self._learn(request, feedback)
            if k <= 0:
                return None
            (arm,) = request.bandit.select(1)
            shadows = ()
            if self.spec.shadows:
                shadows = tuple(a for a in request.bandit.stats
                                if (a in self.model_free or a == NO_DRAFT) and a != arm)
            deltas, unseen = {}, {}
            for asked in (arm, *shadows):
                deltas[asked] = request.tokens[request.sent.get(asked, 0) :]
                request.sent[asked] = len(request.tokens)
                if asked in self.feature_arms:
                    unseen[asked] = request.unseen_features(asked)
            return Selection(arm, shadows, deltas, unseen)

    def _prior(self, embedded: Any) -> dict[str, ArmStats]:
        """A new request's warm start: per arm, the nearest similar requests' statistics where they
        saw the arm, else the global ones."""
        near = self.contexts.prior(embedded) if embedded is not None else {}
        return {arm: near.get(arm, stats) for arm, stats in self.global_stats.items()}

    @staticmethod
    def as_round(arm: str, proposal: Proposal, k: int) -> Proposal:
        """The drafter's proposal under the arm's name, at most k tokens."""
        return replace(proposal.cut(k), drafter=arm)

    def propose(
        self,
        request_id: str,
        new_tokens: Sequence[int],
        feedback: RoundFeedback | None,
        k: int,
        sampling: SamplingParams,
        defer_models: bool = False,
        features: Any = None,
        predictions: Any = None,
        context: Any = None,
    ) -> DraftRound:
        """The chosen drafter and the shadows draft (in this process one after the other; the Ray
        actor body drafts in parallel). `defer_models`: a chosen model drafter is left for
        `draft_deferred` (the round's `deferred`), so the caller can size its draft by the cheap
        drafts in hand."""
        self.recycle(predictions, sampling)
        chosen = self.select(request_id, new_tokens, feedback, k, features, context)
        if chosen is None:
            return replace(PLAIN_ROUND, features_wanted=self.wants_features, predictions_wanted=self.wants_predictions)
        arm = chosen.arm
        if defer_models and arm not in self.model_free and arm != NO_DRAFT:
            with self._lock:
                request = self.requests.get(request_id)
                if request is not None:
                    request.deferred[arm] = (chosen.deltas[arm], chosen.features.get(arm))
            proposals, deferred = (), (arm,)
        else:
            proposals = (self._draft(arm, request_id, chosen.deltas[arm], k, sampling, chosen.features.get(arm)),)
            deferred = ()
        shadows = tuple(self._draft(a, request_id, chosen.deltas[a], k, sampling, chosen.features.get(a))
                        for a in chosen.shadows)
        return DraftRound(proposals, shadows, self.spec.verify, deferred, self.wants_features, self.wants_predictions)

    def propose_batch(self, calls: Sequence[DraftCall]) -> list[DraftRound]:
        """Every request of a batch iteration in one call (in this process one after the other)."""
        return [self.propose(c.request_id, c.new_tokens, c.feedback, c.k, c.sampling, c.defer_models, c.features,
                             c.predictions, c.context) for c in calls]

    def draft_deferred(self, request_id: str, tokens: Mapping[str, int], sampling: SamplingParams) -> tuple[Proposal, ...]:
        """Draft the round's deferred model drafters, each asked for `tokens[arm]` tokens; an arm
        asked for 0 sits the round out (no draft, no feedback; it catches up on its next draft)."""
        with self._lock:
            request = self.requests.get(request_id)
            deltas = {arm: request.deferred.pop(arm) for arm in tokens if arm in request.deferred} if request else {}
        drafts = []
        for arm, (delta, features) in deltas.items():
            if tokens[arm] <= 0:
                self._unsend(request_id, arm, delta, features)
            else:
                drafts.append(self._draft(arm, request_id, delta, tokens[arm], sampling, features))
        return tuple(drafts)

    def _draft(self, arm: str, request_id: str, delta: Sequence[int], k: int, sampling: SamplingParams,
               features: Any = None) -> Proposal:
        drafter = self.drafters[arm]
        if arm in self.feature_arms:
            return self.as_round(arm, drafter.propose(request_id, delta, k, sampling, features), k)
        return self.as_round(arm, drafter.propose(request_id, delta, k, sampling), k)

    def _unsend(self, request_id: str, arm: str, delta: Sequence[int], features: Any = None) -> None:
        """The arm sat the round out: the tokens (and features) `select` counted as sent to it were not."""
        with self._lock:
            request = self.requests.get(request_id)
            if request is not None and arm in request.sent:
                request.sent[arm] -= len(delta)
            if request is not None and features is not None and arm in request.features_sent:
                request.features_sent[arm] -= sum(len(chunk) for chunk in features)

    def close(self, request_id: str, new_tokens: Sequence[int] = (), feedback: RoundFeedback | None = None) -> dict[str, list[int]]:
        """Learn the last round and forget the request. -> per drafter, the tokens it has not seen."""
        with self._lock:
            request = self.requests.pop(request_id, None)
            if request is None:
                return {}
            request.tokens.extend(int(t) for t in new_tokens)
            if feedback is not None:
                self._learn(request, feedback)
            self.contexts.add(request.context, request.observed)
        return {name: request.tokens[request.sent.get(name, 0) :] for name in self.drafters}

    def expire(self) -> dict[str, dict[str, list[int]]]:
        """Forget the requests without a call for request_ttl_s. -> per request, what `close` gives
        (the caller releases those drafter sessions)."""
        now = time.monotonic()
        with self._lock:
            stale = [rid for rid, r in self.requests.items() if now - r.last_call > self.request_ttl_s]
        return {rid: self.close(rid) for rid in stale}

    def finish(self, request_id: str, new_tokens: Sequence[int] = (), feedback: RoundFeedback | None = None) -> None:
        for name, delta in self.close(request_id, new_tokens, feedback).items():
            self.drafters[name].release(request_id, delta)

    def add_drafter(self, name: str, drafter: Proposer) -> None:
        """A new arm, live: new requests and the requests in flight explore it from their next round
        (it catches up on the whole context the first time it drafts)."""
        with self._lock:
            if name in self.drafters:
                raise ValueError(f"drafter {name!r} is already in the pool")
            spec = parse_policy(self.spec.name, [*self.drafters, name], self.spec.verify)
            self.drafters[name] = drafter
            self.spec = spec
            if is_model_free(drafter):  # a Ray actor handle says so when asked (cluster/coordinator_actor.py)
                self.model_free.add(name)
            if needs_features(drafter):
                self.feature_arms.add(name)
            if needs_predictions(drafter):
                self.prediction_arms.add(name)
            self.drafter_stats.setdefault(name, DrafterStats())  # a drafter rejoining keeps its statistics
            if name in spec.arms:
                self.global_stats.setdefault(name, ArmStats())
                for request in self.requests.values():
                    request.bandit.add_arm(name)

    def remove_drafter(self, name: str, keep_stats: bool = False) -> Proposer:
        """Take an arm out, live: no round picks it again; requests in flight carry on with the
        remaining arms. Refused (InvalidRequestError naming `policy`) when it would leave the
        policy no arm. -> the drafter, whose sessions the caller drops."""
        with self._lock:
            if name not in self.drafters:
                raise KeyError(name)
            spec = parse_policy(self.spec.name, [d for d in self.drafters if d != name], self.spec.verify)
            drafter = self.drafters.pop(name)
            self.spec = spec
            self.model_free.discard(name)
            self.feature_arms.discard(name)
            self.prediction_arms.discard(name)
            if not keep_stats:
                self.drafter_stats.pop(name, None)
                self.global_stats.pop(name, None)
            for request in self.requests.values():
                request.sent.pop(name, None)
                request.features_sent.pop(name, None)
                if name in request.bandit.stats:
                    request.bandit.remove_arm(name)
            return drafter

    def _learn(self, request: _Request, feedback: RoundFeedback) -> None:
        for draft in feedback.drafts:
            request.bandit.update(draft.drafter, draft.reward, pulled=not draft.counterfactual, weight=draft.weight)
            if request.context is not None:  # only a contextual request's observations are remembered
                request.observed.setdefault(draft.drafter, ArmStats()).add(draft.reward, draft.weight)
            if draft.drafter in self.global_stats:
                self.global_stats[draft.drafter].add(draft.reward, draft.weight)
            stats = self.drafter_stats.get(draft.drafter)
            if stats is not None and draft.counterfactual:
                stats.counterfactual += 1
            elif stats is not None:  # pulls, drafted, accepted: what the target verified only
                stats.pulls += 1
                stats.drafted += draft.drafted
                stats.accepted += draft.accepted
                stats.reward_sum += draft.reward

    def pool_lengths(self, delta: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, list[list[float]]]:
        """A target replica's draft-length statistics gathered since its last share (deploy/engine/
        shared_lengths.py) join the pool's; -> the pool's totals, which the replica then drafts on."""
        with self._lock:
            return self.draft_lengths.add(delta)

    def pool_guard(self, state: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
        """A target replica's draft-guard figures per batch bucket (deploy/engine/draft_guard.py
        `state`) -> per bucket, the figures of the replica with the most iterations there (what a
        new replica seeds the buckets it has not probed with)."""
        with self._lock:
            for bucket, figures in state.items():
                held = self.guard_figures.get(bucket)
                if held is None or figures[0] + figures[2] >= held[0] + held[2]:
                    self.guard_figures[bucket] = [float(v) for v in figures]
            return {bucket: list(figures) for bucket, figures in self.guard_figures.items()}

    def learned(self) -> dict:
        """What the coordinator has learned across requests, as JSON-able data (its checkpoint): the
        policy and reward it was learned under, each arm's global statistics (what a warm bandit
        starts from), each drafter's counters (`stats`), the target replicas' pooled
        draft-length statistics and the context memory (what a contextual bandit starts from)."""
        with self._lock:
            return {"policy": self.spec.name, "reward": self.spec.reward,
                    "arms": {arm: asdict(s) for arm, s in self.global_stats.items()},
                    "drafters": {name: asdict(s) for name, s in self.drafter_stats.items()},
                    "draft_lengths": self.draft_lengths.snapshot(), "contexts": self.contexts.snapshot()}

    def restore(self, learned: Mapping) -> bool:
        """Take a checkpoint's statistics (`learned`) for the drafters in the pool. False, and
        nothing taken, when it was learned under another policy or reward."""
        if learned.get("policy") != self.spec.name or learned.get("reward") != self.spec.reward:
            return False
        with self._lock:
            for arm, values in learned.get("arms", {}).items():
                if arm in self.global_stats:
                    self.global_stats[arm] = ArmStats(**values)
            for name, values in learned.get("drafters", {}).items():
                if name in self.drafter_stats:
                    self.drafter_stats[name] = DrafterStats(**values)
            self.draft_lengths.restore(learned.get("draft_lengths", {}))
            self.contexts.restore(learned.get("contexts", {}))
        return True

    def stats(self) -> dict:
        """Pulls, mean reward and acceptance per drafter, plus the number of open requests."""
        with self._lock:
            return {
                "policy": self.spec.name,
                "verify": self.spec.verify,
                "reward": self.spec.reward,
                "active_requests": len(self.requests),
                "features": self.wants_features,
                "predictions": self.wants_predictions,
                "drafters": {
                    name: {
                        "pulls": s.pulls,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                        "acceptance": s.accepted / s.drafted if s.drafted else None,
                        "mean_reward": s.reward_sum / s.pulls if s.pulls else None,
                        "counterfactual": s.counterfactual,
                    }
                    for name, s in self.drafter_stats.items()
                },
            }
