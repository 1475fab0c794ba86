"""The coordinator: the only holder of bandit state. It picks the drafter for each round,
dispatches drafting to it, and learns from the target's verification feedback.

One call per speculation round from the target:

    propose(request_id, new_tokens, feedback, k, sampling) -> DraftRound

`new_tokens` are the tokens the target committed since its previous call (the prompt on the
first call); `feedback` (a RoundFeedback: one Feedback per drafter that drafted) describes the
previous round (feedback for round t rides on the call of round t+1). The coordinator keeps per
request the committed context, the request's bandit (cold, or warm-started from global
statistics with `-warm`) and how much of the context each drafter has seen, so a drafter
receives only its unseen tokens (catch-up after rounds it sat out). `finish` learns the last
round and releases every drafter's session.

A round drafts with the policy's top `width` arms (`-m<N>`, `-mall`; `-mauto` picks the width
with a UCB over widths on the round's cost reward, shared across requests); the target verifies
their drafts together. With `-cf`, the model-free drafters not chosen draft too (`shadows`:
never verified; the target scores them against the output, counterfactual feedback); the no-draft
arm, when not chosen, is a shadow that drafts nothing (its cost reward is what a plain step would
have scored), so no policy has to pull it to learn it. With `-mbest` (and `-mauto`) the round is
marked `pick_best`: the engine verifies whichever of the chosen draft and the shadows promises the
most, so several drafters draft and one draft is verified; with `-mrated` also `pick_set`: the
others join it while the tree they make promises more; with `-mtree` also `pick_nodes`: the tree
of all of them is cut node by node.

A request whose target stops calling (its replica died mid-request) is forgotten after
`request_ttl_s` without a call, and its drafter sessions are released (`expire`).

`add_drafter` grows the pool live: the new arm joins new requests and the ones in flight;
`remove_drafter` shrinks it: no round picks the arm again, requests in flight carry on with the
others (the actor body waits for the arm's rounds in flight before handing it back).

`Coordinator` is a plain class (tested without Ray); `CoordinatorActor` is its async Ray actor
body (it also keeps where each target replica runs, for `specfleet status`), and
`start_coordinator_actor` applies `ray.remote` at build time and names the actor
`specfleet:coordinator`.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal, Proposer
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams
from policy.bandit import ArmStats, Bandit
from policy.registry import AUTO_MAX_WIDTH, DEFAULT_POLICY, parse_policy
from policy.ucb import UCB

COORDINATOR_NAME = "specfleet:coordinator"
DRAFT_TIMEOUT_S = 5.0  # a drafter's answer later than this costs the round its draft
REQUEST_TTL_S = 60.0  # a request without a call for this long is over (its target died)


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
    width: int = 1  # drafters asked this round
    round_reward: float = 0.0  # the round's cost reward (what -mauto learns the width from)


@dataclass(frozen=True)
class DraftRound:
    proposals: tuple[Proposal, ...] = ()  # to verify; drafts may be empty
    shadows: tuple[Proposal, ...] = ()  # drafted for counterfactual feedback only
    pick_best: bool = False  # verify whichever of one chosen draft and the shadows promises most (-mbest)
    pick_set: bool = False  # ... and add the others while the tree they make promises more (-mrated)
    pick_nodes: bool = False  # ... or cut the tree of all of them node by node (-mtree)

    @property
    def width(self) -> int:
        """Drafters asked this round."""
        return len(self.proposals)

    @property
    def label(self) -> str:
        """The round's name in traces and metrics: its drafters, sorted, joined by '+'."""
        return "+".join(sorted(p.drafter for p in self.proposals)) or NO_DRAFT


PLAIN_ROUND = DraftRound()
# (model drafter, the round's drafts in hand) -> how many tokens to ask it for (0: none)
ModelTokens = Callable[[str, Sequence[Proposal]], int]


@dataclass(frozen=True)
class Selection:
    arms: tuple[str, ...]  # draft and verify, best first
    shadows: tuple[str, ...]  # draft for counterfactual feedback only
    deltas: dict[str, list[int]]  # per drafter asked, the committed tokens it has not seen


@dataclass
class _Request:
    bandit: Bandit
    tokens: list[int] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # committed tokens each drafter has seen
    last_call: float = field(default_factory=time.monotonic)


@dataclass
class DrafterStats:
    pulls: int = 0
    drafted: int = 0
    accepted: int = 0
    reward_sum: float = 0.0
    counterfactual: int = 0  # rounds scored against the output without being verified


class Coordinator:
    def __init__(self, drafters: Mapping[str, Proposer], policy: str = DEFAULT_POLICY, seed: int = 0,
                 request_ttl_s: float = REQUEST_TTL_S) -> None:
        self.drafters = dict(drafters)
        self.request_ttl_s = request_ttl_s
        self.spec = parse_policy(policy, list(self.drafters))
        self.global_stats: dict[str, ArmStats] = {arm: ArmStats() for arm in self.spec.arms}
        self.drafter_stats: dict[str, DrafterStats] = {name: DrafterStats() for name in self.drafters}
        self.requests: dict[str, _Request] = {}
        self._rng = np.random.default_rng(seed)
        self.model_free = {name for name, d in self.drafters.items() if getattr(d, "model_free", False) is True}
        self.width_bandit = UCB([str(w) for w in range(1, AUTO_MAX_WIDTH + 1)], np.random.default_rng(seed + 1))
        self._lock = threading.Lock()  # guards bandits and statistics, never held while drafting

    @property
    def reward_kind(self) -> str:
        return self.spec.reward

    @property
    def policy(self) -> str:
        return self.spec.name

    def select(
        self, request_id: str, new_tokens: Sequence[int], feedback: RoundFeedback | None, k: int
    ) -> Selection | None:
        """Record the committed tokens and the feedback, pick this round's drafters.

        -> the selection, or None when k <= 0 (no room to draft: a plain step that nobody learns from).
        """
        with self._lock:
            request = self.requests.get(request_id)
            if request is None and feedback is not None:
                return None  # begun before this coordinator (re)started: it lacks the context, so no draft
            if request is None:
                rng = np.random.default_rng(self._rng.integers(2**63))
                bandit = self.spec.make(self.global_stats, rng, self.model_free | {NO_DRAFT})
                request = self.requests[request_id] = _Request(bandit)
            request.tokens.extend(int(t) for t in new_tokens)
            request.last_call = time.monotonic()
            if feedback is not None:
                self._learn(request, feedback)
            if k <= 0:
                return None
            width = int(self.width_bandit.select(1)[0]) if self.spec.auto_width else self.spec.width
            arms = tuple(request.bandit.select(width or len(request.bandit.stats)))
            shadows = ()
            if self.spec.counterfactual:
                shadows = tuple(a for a in request.bandit.stats
                                if (a in self.model_free or a == NO_DRAFT) and a not in arms)
            deltas = {}
            for arm in arms + shadows:
                deltas[arm] = request.tokens[request.sent.get(arm, 0) :]
                request.sent[arm] = len(request.tokens)
            return Selection(arms, shadows, deltas)

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
        model_tokens: ModelTokens | None = None,
    ) -> DraftRound:
        """Drafting in this process runs the drafters one after the other (the Ray actor body runs
        them in parallel): the model-free ones first, then each chosen model drafter, asked for
        `model_tokens(arm, drafts in hand)` tokens when given (0: it sits the round out, no
        feedback; the drafts in hand are verified instead), else k."""
        chosen = self.select(request_id, new_tokens, feedback, k)
        if chosen is None:
            return PLAIN_ROUND
        asked = chosen.arms + chosen.shadows
        cheap = [arm for arm in asked if arm in self.model_free or arm == NO_DRAFT]
        drafts = {arm: self._draft(arm, request_id, chosen.deltas[arm], k, sampling) for arm in cheap}
        for arm in asked:
            if arm in drafts:
                continue
            # the drafts that could be verified instead: the shadows' too only when the round picks among them
            in_hand = tuple(d for a, d in drafts.items() if self.spec.pick_best or a in chosen.arms)
            arm_k = k if model_tokens is None else min(k, model_tokens(arm, in_hand))
            if arm_k <= 0:
                self._unsend(request_id, arm, chosen.deltas[arm])
                continue
            drafts[arm] = self._draft(arm, request_id, chosen.deltas[arm], arm_k, sampling)
        return DraftRound(tuple(drafts[a] for a in chosen.arms if a in drafts), tuple(drafts[a] for a in chosen.shadows),
                          self.spec.pick_best, self.spec.pick_set, self.spec.pick_nodes)

    def _draft(self, arm: str, request_id: str, delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        return self.as_round(arm, self.drafters[arm].propose(request_id, delta, k, sampling), k)

    def _unsend(self, request_id: str, arm: str, delta: Sequence[int]) -> None:
        """The arm sat the round out: the tokens `select` counted as sent to it were not."""
        with self._lock:
            request = self.requests.get(request_id)
            if request is not None and arm in request.sent:
                request.sent[arm] -= len(delta)

    def close(self, request_id: str, new_tokens: Sequence[int] = (), feedback: RoundFeedback | None = None) -> dict[str, list[int]]:
        """Learn the last round and forget the request. -> per drafter, the tokens it has not seen."""
        with self._lock:
            request = self.requests.pop(request_id, None)
            if request is None:
                return {}
            request.tokens.extend(int(t) for t in new_tokens)
            if feedback is not None:
                self._learn(request, feedback)
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
            spec = parse_policy(self.spec.name, [*self.drafters, name])
            self.drafters[name] = drafter
            self.spec = spec
            if getattr(drafter, "model_free", False) is True:  # a Ray actor handle says so when asked (below)
                self.model_free.add(name)
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
            spec = parse_policy(self.spec.name, [d for d in self.drafters if d != name])
            drafter = self.drafters.pop(name)
            self.spec = spec
            self.model_free.discard(name)
            if not keep_stats:
                self.drafter_stats.pop(name, None)
                self.global_stats.pop(name, None)
            for request in self.requests.values():
                request.sent.pop(name, None)
                if name in request.bandit.stats:
                    request.bandit.remove_arm(name)
            return drafter

    def _learn(self, request: _Request, feedback: RoundFeedback) -> None:
        if self.spec.auto_width and 1 <= feedback.width <= AUTO_MAX_WIDTH:
            self.width_bandit.update(str(feedback.width), feedback.round_reward)
        for draft in feedback.drafts:
            request.bandit.update(draft.drafter, draft.reward, pulled=not draft.counterfactual, weight=draft.weight)
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

    def stats(self) -> dict:
        """Pulls, mean reward and acceptance per drafter, plus the number of open requests."""
        with self._lock:
            return {
                "policy": self.spec.name,
                "reward": self.spec.reward,
                "active_requests": len(self.requests),
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


class CoordinatorActor:
    """The async Ray actor body: `Coordinator`'s bandit logic, drafting awaited on drafter actors,
    so concurrent requests' rounds never wait on each other's drafting.

    Failures: a drafter that fails a round (its actor died, or raised) or misses the per-round
    deadline (`draft_timeout_s`) costs that round its draft only (an empty proposal: a plain
    target step). The arm is marked down and taken out of every bandit; a hung actor is killed so
    that Ray restarts it (drafter actors have max_restarts=-1). A watcher probes down arms every
    second and puts each back as an arm (statistics kept) once it answers again. The actor
    itself restarts after a crash (max_restarts=-1) with the pool rebuilt from the named drafter
    actors alive in the namespace; requests in flight then finish on plain decoding
    (`RemoteCoordinator`)."""

    def __init__(self, drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0,
                 draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S) -> None:
        self.core = Coordinator(_pool_at_start(drafters), policy, seed, request_ttl_s)  # values: drafter actor handles
        self.draft_timeout_s = draft_timeout_s
        self.replicas: dict[str, dict] = {}  # target replica actor name -> where it runs
        self.drafting: dict[str, int] = {}  # drafter -> propose calls in flight
        self.down: dict[str, tuple[object, bool]] = {}  # drafter -> (handle, taken out of the bandits)
        self.kinds_known: set[str] = set()  # drafters asked whether they are model-free
        self._kinds: asyncio.Task | None = None
        self._janitor: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None

    async def propose(self, request_id, new_tokens, feedback, k, sampling) -> DraftRound:
        """The chosen drafters (and shadows) draft in parallel, each within the round's deadline."""
        if self._janitor is None:
            self._janitor = asyncio.get_running_loop().create_task(self._expire_forever())
        if self.core.spec.counterfactual and (self._kinds is None or self._kinds.done()):
            if any(name not in self.kinds_known for name in self.core.drafters):
                self._kinds = asyncio.get_running_loop().create_task(self._learn_model_free())
        chosen = self.core.select(request_id, new_tokens, feedback, k)
        if chosen is None:
            return PLAIN_ROUND
        asked = chosen.arms + chosen.shadows
        drafts = await asyncio.gather(*(self._draft(arm, request_id, chosen.deltas[arm], k, sampling, arm in chosen.arms)
                                         for arm in asked))
        by_arm = dict(zip(asked, drafts))
        shadows = tuple(by_arm[a] for a in chosen.shadows if by_arm[a] is not None)
        return DraftRound(tuple(by_arm[a] for a in chosen.arms), shadows, self.core.spec.pick_best, self.core.spec.pick_set,
                          self.core.spec.pick_nodes)

    async def _draft(self, arm: str, request_id: str, delta, k: int, sampling, chosen: bool) -> Proposal | None:
        """One drafter's proposal; an empty one when it is down, fails or misses the deadline (a
        chosen drafter is then marked down; a shadow's failure loses its feedback: None)."""
        from ray.exceptions import RayError

        if arm == NO_DRAFT:  # drafts nothing: no call
            return Proposal(drafter=arm)
        if arm in self.down:  # still the only arm the policy has: plain steps until it is back
            return Proposal(drafter=arm) if chosen else None
        handle = self.core.drafters[arm]
        self.drafting[arm] = self.drafting.get(arm, 0) + 1
        try:
            call = handle.propose.remote(request_id, delta, k, sampling)
            proposal = await asyncio.wait_for(call, self.draft_timeout_s)
        except (asyncio.TimeoutError, RayError) as err:
            if not chosen:
                return None
            self._mark_down(arm, handle, hung=isinstance(err, asyncio.TimeoutError))
            return Proposal(drafter=arm)  # this round without its draft
        finally:
            self.drafting[arm] -= 1
        return Coordinator.as_round(arm, proposal, k)

    async def _learn_model_free(self) -> None:
        """In the background, ask each drafter not asked yet whether it is model-free (kinds never
        change); until it answers, it drafts only when chosen."""
        unknown = [name for name in self.core.drafters if name not in self.kinds_known]
        answers = await asyncio.gather(*(self._ask_model_free(self.core.drafters[n]) for n in unknown))
        for name, answer in zip(unknown, answers):
            if answer:
                self.core.model_free.add(name)
            if answer is not None:
                self.kinds_known.add(name)

    async def _ask_model_free(self, handle) -> bool | None:
        """True or False, or None when the actor does not answer in time."""
        try:
            method = handle.model_free
        except AttributeError:  # an actor that is not a DrafterActor: treat as a model drafter
            return False
        try:
            return await asyncio.wait_for(method.remote(), self.draft_timeout_s) is True
        except Exception:  # noqa: BLE001 - dead, restarting or hung: ask again later
            return None

    def _mark_down(self, arm: str, handle, hung: bool) -> None:
        import ray

        if arm in self.down:
            return
        try:
            self.core.remove_drafter(arm, keep_stats=True)
            removed = True
        except (KeyError, InvalidRequestError):  # gone already, or the policy's last arm: keep it selectable
            removed = False
        self.down[arm] = (handle, removed)
        if hung:
            ray.kill(handle, no_restart=False)  # Ray restarts it; the watcher sees it answer again
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_down())

    async def _watch_down(self) -> None:
        while self.down:
            await asyncio.sleep(1.0)
            for arm, (handle, removed) in list(self.down.items()):
                try:
                    await asyncio.wait_for(handle.open_sessions.remote(), self.draft_timeout_s)
                except Exception:  # noqa: BLE001 - still dead, restarting or hung
                    continue
                if self.down.pop(arm, None) is None:  # removed from the pool while probed
                    continue
                if removed and arm not in self.core.drafters:
                    await self.add_drafter(arm, handle)

    async def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        self._release(request_id, self.core.close(request_id, new_tokens, feedback))

    def _release(self, request_id: str, deltas: Mapping[str, list[int]]) -> None:
        for name, delta in deltas.items():
            if name in self.core.drafters:
                self.core.drafters[name].release.remote(request_id, delta)  # fire and forget, ordered per caller

    async def _expire_forever(self) -> None:
        """Release what requests whose target died left behind (checked a few times per TTL)."""
        while True:
            await asyncio.sleep(min(5.0, self.core.request_ttl_s / 4))
            for request_id, deltas in self.core.expire().items():
                self._release(request_id, deltas)

    async def stats(self) -> dict:
        return self.core.stats() | {"down": sorted(self.down)}

    async def add_drafter(self, name: str, handle) -> None:
        self.core.add_drafter(name, handle)
        self.kinds_known.discard(name)

    async def remove_drafter(self, name: str, drain_s: float = 30.0):
        """Remove the arm, up or down, then wait (at most drain_s) for its rounds in flight. -> its
        handle. KeyError when no such drafter is in the pool."""
        if name in self.core.drafters:
            handle = self.core.remove_drafter(name)
            self.down.pop(name, None)
        elif name in self.down:  # down: already out of the bandits; the watcher stops probing it
            handle, _ = self.down.pop(name)
        else:
            raise KeyError(name)
        deadline = asyncio.get_running_loop().time() + drain_s
        while self.drafting.get(name, 0) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        self.drafting.pop(name, None)
        return handle

    async def drafter_handles(self) -> dict:
        return dict(self.core.drafters)

    async def register_replica(self, name: str, placement: dict) -> None:
        self.replicas[name] = placement

    async def registered_replicas(self) -> dict[str, dict]:
        return dict(self.replicas)


def _named_drafters() -> dict[str, object]:
    """The drafter actors alive in the `specfleet` namespace, by drafter name ({} outside Ray)."""
    import ray

    from actors.remote import DRAFTER_PREFIX
    from cluster.local import NAMESPACE

    if not ray.is_initialized():
        return {}
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == NAMESPACE and a["name"].startswith(DRAFTER_PREFIX)]
    return {name.removeprefix(DRAFTER_PREFIX): ray.get_actor(name, namespace=NAMESPACE) for name in names}


def _pool_at_start(given: Mapping[str, object]) -> dict[str, object]:
    """The given drafters, or after a restart the drafter actors alive now (the given order first,
    then drafters added live since), so removed drafters stay out and added ones come back."""
    named = _named_drafters()
    if not named:
        return dict(given)
    ordered = [n for n in given if n in named] + sorted(n for n in named if n not in given)
    return {name: named[name] for name in ordered}


def start_coordinator_actor(drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0,
                            draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S):
    """The named async actor `specfleet:coordinator` over drafter actor handles (restarted by Ray
    after a crash, with the same arguments)."""
    import ray

    from cluster.local import NAMESPACE

    actor = ray.remote(CoordinatorActor).options(
        name=COORDINATOR_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=256, lifetime="detached",
        max_restarts=-1, max_task_retries=0,
    )
    return actor.remote(dict(drafters), policy, seed, draft_timeout_s, request_ttl_s)


def connect_coordinator() -> "RemoteCoordinator":
    """The running coordinator actor, looked up by name in the `specfleet` namespace."""
    import ray

    from cluster.local import NAMESPACE

    return RemoteCoordinator(ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE))


class RemoteCoordinator:
    """The engine-facing interface (`propose`, `finish`, `reward_kind`) over the coordinator actor.
    If the actor fails a call (it crashed; Ray restarts it), the request carries on with plain
    target steps to its end, still exact; later requests use the restarted coordinator."""

    def __init__(self, handle) -> None:
        import ray

        self.handle = handle
        self.reward_kind = ray.get(handle.stats.remote())["reward"]
        self.degraded: set[str] = set()  # requests finishing on plain decoding since a coordinator failure
        self._lock = threading.Lock()
        self._registration: tuple[str, dict] | None = None
        self._reregister = False

    def propose(self, request_id, new_tokens, feedback, k, sampling, model_tokens=None) -> DraftRound:
        """`model_tokens` is for sequential drafting in one process; the actor drafts in parallel
        and asks every chosen drafter for k tokens."""
        import ray
        from ray.exceptions import RayError

        if request_id in self.degraded:
            return PLAIN_ROUND
        try:
            proposal = ray.get(self.handle.propose.remote(request_id, list(new_tokens), feedback, k, sampling))
            if self._reregister and self._registration is not None:
                self._reregister = False
                self.handle.register_replica.remote(*self._registration)
            return proposal
        except RayError:  # the coordinator died or is restarting: this request ends on plain decoding
            with self._lock:
                self.degraded.add(request_id)
                self._reregister = True  # a restarted coordinator has forgotten where this replica runs
            return PLAIN_ROUND

    def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        import ray
        from ray.exceptions import RayError

        with self._lock:
            degraded = request_id in self.degraded
            self.degraded.discard(request_id)
        if degraded:
            return  # a restarted coordinator never knew it
        try:
            ray.get(self.handle.finish.remote(request_id, list(new_tokens), feedback))
        except RayError:
            pass  # sessions it held die with the old coordinator's drafter calls or expire (actors/session.py)

    def register_replica(self, name: str, placement: dict) -> None:
        import ray

        self._registration = (name, placement)
        ray.get(self.handle.register_replica.remote(name, placement))

    def stats(self) -> dict:
        import ray

        return ray.get(self.handle.stats.remote())
