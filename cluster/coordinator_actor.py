"""The coordinator as a Ray actor: `policy.coordinator.Coordinator`'s bandit logic with drafting
awaited on drafter actors, plus its start, lookup and the engine-facing proxy.

`CoordinatorActor` is the async actor body (it also keeps where each target replica runs, for
`specfleet status`); `start_coordinator_actor` applies `ray.remote` at build time and names the
actor `specfleet:coordinator` in the `specfleet` namespace; `connect_coordinator` looks it up and
returns a `RemoteCoordinator`, the object a target replica's engine drafts through.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal
from cluster.drafter_actor import named_drafters
from cluster.local import NAMESPACE
from policy.coordinator import PLAIN_ROUND, REQUEST_TTL_S, Coordinator, DraftRound
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY

COORDINATOR_NAME = "specfleet:coordinator"
DRAFT_TIMEOUT_S = 5.0  # a drafter's answer later than this costs the round its draft


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
                 draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S,
                 verify: str = DEFAULT_VERIFY, built_for: Mapping | None = None) -> None:
        self.core = Coordinator(_pool_at_start(drafters), policy, seed, request_ttl_s, verify)  # values: drafter actor handles
        # what the pool was built from (cluster/pool.py: its signature, and each drafter's config), for redeploys
        self.built_for = {"signature": dict((built_for or {}).get("signature", {})),
                          "drafters": dict((built_for or {}).get("drafters", {}))}
        self.draft_timeout_s = draft_timeout_s
        self.replicas: dict[str, dict] = {}  # target replica actor name -> where it runs
        self.drafting: dict[str, int] = {}  # drafter -> propose calls in flight
        self.down: dict[str, tuple[object, bool]] = {}  # drafter -> (handle, taken out of the bandits)
        self.kinds_known: set[str] = set()  # drafters asked whether they are model-free
        self._kinds: asyncio.Task | None = None
        self._janitor: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None

    async def propose(self, request_id, new_tokens, feedback, k, sampling) -> DraftRound:
        """The chosen drafter and the shadows draft in parallel, each within the round's deadline."""
        if self._janitor is None:
            self._janitor = asyncio.get_running_loop().create_task(self._expire_forever())
        if self.core.spec.shadows and (self._kinds is None or self._kinds.done()):
            if any(name not in self.kinds_known for name in self.core.drafters):
                self._kinds = asyncio.get_running_loop().create_task(self._learn_model_free())
        chosen = self.core.select(request_id, new_tokens, feedback, k)
        if chosen is None:
            return PLAIN_ROUND
        asked = (chosen.arm, *chosen.shadows)
        drafts = await asyncio.gather(*(self._draft(arm, request_id, chosen.deltas[arm], k, sampling, arm == chosen.arm)
                                         for arm in asked))
        shadows = tuple(d for d in drafts[1:] if d is not None)
        return DraftRound((drafts[0],), shadows, self.core.spec.verify)

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

    async def add_drafter(self, name: str, handle, config: Mapping | None = None) -> None:
        self.core.add_drafter(name, handle)
        self.kinds_known.discard(name)
        self.built_for["drafters"][name] = dict(config) if config is not None else None

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
        self.built_for["drafters"].pop(name, None)
        return handle

    async def drafter_handles(self) -> dict:
        return dict(self.core.drafters)

    async def pool_config(self) -> dict:
        """{"signature", "drafters": {name: its config, or None when unknown}} for every drafter in
        the pool, up or down."""
        names = [*self.core.drafters, *self.down]
        return {"signature": self.built_for["signature"],
                "drafters": {name: self.built_for["drafters"].get(name) for name in names}}

    async def register_replica(self, name: str, placement: dict) -> None:
        self.replicas[name] = placement

    async def registered_replicas(self) -> dict[str, dict]:
        return dict(self.replicas)


def _pool_at_start(given: Mapping[str, object]) -> dict[str, object]:
    """The given drafters, or after a restart the drafter actors alive now (the given order first,
    then drafters added live since), so removed drafters stay out and added ones come back."""
    named = named_drafters()
    if not named:
        return dict(given)
    ordered = [n for n in given if n in named] + sorted(n for n in named if n not in given)
    return {name: named[name] for name in ordered}


def start_coordinator_actor(drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0,
                            draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S,
                            verify: str = DEFAULT_VERIFY, built_for: Mapping | None = None):
    """The named async actor `specfleet:coordinator` over drafter actor handles (restarted by Ray
    after a crash, with the same arguments). built_for: what cluster/pool.py built the pool from."""
    import ray

    actor = ray.remote(CoordinatorActor).options(
        name=COORDINATOR_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=256, lifetime="detached",
        max_restarts=-1, max_task_retries=0,
    )
    return actor.remote(dict(drafters), policy, seed, draft_timeout_s, request_ttl_s, verify, built_for)


def connect_coordinator() -> "RemoteCoordinator":
    """The running coordinator actor, looked up by name in the `specfleet` namespace."""
    import ray

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

    def propose(self, request_id, new_tokens, feedback, k, sampling, defer_models=False) -> DraftRound:
        """`defer_models` is for sequential drafting in one process; the actor drafts in parallel
        and asks every drafter for k tokens, so nothing is deferred."""
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
