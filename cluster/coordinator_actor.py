"""The coordinator as a Ray actor: `policy.coordinator.Coordinator`'s bandit logic with drafting
awaited on drafter actors, plus its start, lookup and the engine-facing proxy.

`CoordinatorActor` is the async actor body (it also keeps where each target replica runs, for
`specfleet status`; what the target replicas learn about draft lengths, pooled, and their draft guards' figures:
`pool_lengths`, `pool_guard`, deploy/engine/shared_lengths.py; and each replica's last published metric families, so that a
scrape of any replica shows every replica: `put_metrics`, `replica_metrics`; the targets'
forward-cost profiles by hardware: `cost_profile`, `put_cost_profile`, deploy/engine/shared_profile.py). The drafters that need no model and ask for no resources draft inside it
(cluster/resources.py `drafts_in_coordinator`: given as a `DrafterSpec`, built here); the others
are drafter actors it calls; `start_coordinator_actor` applies `ray.remote` at build time and names the
actor `specfleet:coordinator` in the `specfleet` namespace; `connect_coordinator` looks it up and
returns a `RemoteCoordinator`, the object a target replica's engine drafts through.

What the coordinator learned across requests (`Coordinator.learned`) is checkpointed every
CHECKPOINT_S (when it changed) to Ray's internal key-value store, which lives in the cluster's
GCS: a restarted coordinator actor starts from it (under the same policy and reward), and
cluster/pool.py `stop_pool` deletes it, so a new service starts afresh.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal
from cluster.drafter_actor import DrafterSpec, build_proposer, named_drafters, open_sessions
from cluster.local import NAMESPACE
from deploy.engine.shared_profile import ProfileBoard
from policy.coordinator import DRAFT_TIMEOUT_S, PLAIN_ROUND, REQUEST_TTL_S, Coordinator, DraftCall, DraftRound
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY

COORDINATOR_NAME = "specfleet:coordinator"
CHECKPOINT_KEY = "coordinator:learned"  # in Ray's internal KV, namespace NAMESPACE
CHECKPOINT_S = 2.0  # how often what was learned is checkpointed (when it changed)
METRICS_S = 2.0  # how often each target replica publishes its metrics here (for every replica's scrapes)
METRICS_STALE_S = 15.0  # a replica that published nothing this long is left out of scrapes
logger = logging.getLogger("specfleet")


class CoordinatorActor:
    """The async Ray actor body: `Coordinator`'s bandit logic, drafting awaited on drafter actors,
    so concurrent requests' rounds never wait on each other's drafting.

    Failures: a drafter that fails a round (its actor died, or raised) or misses the per-round
    deadline (`draft_timeout_s`) costs that round its draft only (an empty proposal: a plain
    target step). The arm is marked down and taken out of every bandit; a hung actor is killed so
    that Ray restarts it (drafter actors have max_restarts=-1). A watcher probes down arms every
    second and puts each back as an arm (statistics kept) once it answers again. The actor
    itself restarts after a crash (max_restarts=-1) with the pool rebuilt from the named drafter
    actors alive in the namespace and the drafters it hosts built afresh; requests in flight then
    finish on plain decoding (`RemoteCoordinator`). A drafter it hosts drafts in its event loop (a
    lookup: microseconds); one that raises costs that round its draft."""

    def __init__(self, drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0,
                 draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S,
                 verify: str = DEFAULT_VERIFY, built_for: Mapping | None = None,
                 target_vocab_size: int | None = None) -> None:
        """drafters: name -> a drafter actor's handle, or the `DrafterSpec` of one drafted here."""
        self.target_vocab_size = target_vocab_size
        at_start = _pool_at_start(drafters)
        self.hosted = {name: d for name, d in at_start.items() if isinstance(d, DrafterSpec)}  # drafted here
        pool = {name: build_proposer(d, target_vocab_size) if name in self.hosted else d for name, d in at_start.items()}
        self.core = Coordinator(pool, policy, seed, request_ttl_s, verify)  # values: actor handles, or hosted drafters
        # what the pool was built from (cluster/pool.py: its signature, and each drafter's config), for redeploys
        self.built_for = {"signature": dict((built_for or {}).get("signature", {})),
                          "drafters": dict((built_for or {}).get("drafters", {}))}
        self.draft_timeout_s = draft_timeout_s
        self.replicas: dict[str, dict] = {}  # target replica actor name -> where it runs
        self.replica_families: dict[str, tuple[float, list]] = {}  # replica -> (when, its metric families)
        self.profiles = ProfileBoard()  # the targets' forward-cost profiles, by hardware
        self.drafting: dict[str, int] = {}  # drafter -> propose calls in flight
        self.down: dict[str, tuple[object, bool]] = {}  # drafter -> (handle, taken out of the bandits)
        self.kinds_known: set[str] = set(self.hosted)  # drafters asked whether they are model-free (hosted: known)
        self._kinds: asyncio.Task | None = None
        self._janitor: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._checkpointer: asyncio.Task | None = None
        self._checkpointed = load_checkpoint()
        if self._checkpointed is not None and self.core.restore(json.loads(self._checkpointed)):
            logger.info("the coordinator starts from its checkpoint of what earlier requests taught it")

    def _housekeeping(self) -> None:
        if self._janitor is None:
            self._janitor = asyncio.get_running_loop().create_task(self._expire_forever())
            self._checkpointer = asyncio.get_running_loop().create_task(self._checkpoint_forever())
        if self._kinds is None or self._kinds.done():
            if any(name not in self.kinds_known for name in self.core.drafters):
                self._kinds = asyncio.get_running_loop().create_task(self._learn_kinds())

    async def ready(self) -> dict:
        """Every drafter's kind learned (model-free, reads features), then the stats: what starting
        or growing the pool waits for, so that the first requests already get the target's features."""
        if any(name not in self.kinds_known for name in self.core.drafters):
            await self._learn_kinds()
        return await self.stats()

    async def propose_batch(self, calls: list[DraftCall]) -> list[DraftRound]:
        """A batch iteration's rounds: each drafter asked once for every request that chose it or
        shadows it (`DrafterActor.propose_batch`), the drafters in parallel, each within the
        round's deadline; a drafter that fails or misses it costs those requests its draft."""
        self._housekeeping()
        for call in calls:
            self.core.recycle(call.predictions, call.sampling)
        chosen = [self.core.select(c.request_id, c.new_tokens, c.feedback, c.k, c.features, c.context)
                  for c in calls]
        asked: dict[str, list[tuple[int, bool]]] = {}  # drafter -> (call index, chosen there)
        for index, selection in enumerate(chosen):
            if selection is not None:
                for arm in (selection.arm, *selection.shadows):
                    asked.setdefault(arm, []).append((index, arm == selection.arm))
        answers = await asyncio.gather(*(
            self._draft_many(arm, [(calls[i].request_id, chosen[i].deltas[arm], calls[i].k, calls[i].sampling, is_chosen,
                                    chosen[i].features.get(arm)) for i, is_chosen in entries])
            for arm, entries in asked.items()))
        drafts: list[dict[str, Proposal | None]] = [{} for _ in calls]
        for (arm, entries), proposals in zip(asked.items(), answers):
            for (index, _), proposal in zip(entries, proposals):
                drafts[index][arm] = proposal
        wanted, recycled = self.core.wants_features, self.core.wants_predictions
        return [replace(PLAIN_ROUND, features_wanted=wanted, predictions_wanted=recycled) if selection is None else
                DraftRound((drafts[i][selection.arm],),
                           tuple(d for arm in selection.shadows if (d := drafts[i][arm]) is not None), self.core.spec.verify,
                           features_wanted=wanted, predictions_wanted=recycled)
                for i, selection in enumerate(chosen)]

    async def _draft_many(self, arm: str, calls: list[tuple]) -> list[Proposal | None]:
        """One drafter's proposals for (request_id, delta, k, sampling, chosen, features) calls (the
        features go to a drafter that reads them, as propose's fifth argument): an empty one
        for a chosen drafter that is down, fails or misses the deadline (it is then marked down),
        None for a shadow's (its feedback is lost)."""
        from ray.exceptions import RayError

        if arm == NO_DRAFT:
            return [Proposal(drafter=arm) for _ in calls]
        failed = [Proposal(drafter=arm) if call[4] else None for call in calls]
        if arm in self.hosted:
            try:
                return [Coordinator.as_round(arm, self.core.drafters[arm].propose(*call[:4]), call[2]) for call in calls]
            except Exception as err:  # noqa: BLE001 - a failing drafter costs the round its draft, not the batch
                logger.warning("drafter %s failed a round", arm, exc_info=err)
                return failed
        if arm in self.down:
            return failed
        handle = self.core.drafters[arm]
        self.drafting[arm] = self.drafting.get(arm, 0) + 1
        try:
            feeds = arm in self.core.feature_arms
            batch = handle.propose_batch.remote([(*call[:4], call[5]) if feeds else call[:4] for call in calls])
            proposals = await asyncio.wait_for(batch, self.draft_timeout_s)
        except (asyncio.TimeoutError, RayError) as err:
            if any(call[4] for call in calls):
                self._mark_down(arm, handle, hung=isinstance(err, asyncio.TimeoutError))
            return failed
        finally:
            self.drafting[arm] -= 1
        return [Coordinator.as_round(arm, proposal, call[2]) for proposal, call in zip(proposals, calls)]

    async def _learn_kinds(self) -> None:
        """Ask each drafter not asked yet whether it is model-free and whether it reads the
        target's features (kinds never change); until it answers, it drafts only when chosen,
        without features."""
        unknown = [name for name in self.core.drafters if name not in self.kinds_known]
        answers = await asyncio.gather(*(self._ask_kind(self.core.drafters[n]) for n in unknown))
        for name, answer in zip(unknown, answers):
            if answer is None or name not in self.core.drafters:
                continue
            model_free, features = answer
            if model_free:
                self.core.model_free.add(name)
            if features:
                self.core.feature_arms.add(name)
            self.kinds_known.add(name)

    async def _ask_kind(self, handle) -> tuple[bool, bool] | None:
        """(model-free, reads features), or None when the actor does not answer in time."""
        try:
            method = handle.kind
        except AttributeError:  # an actor that is not a DrafterActor: treat as a model drafter without features
            return False, False
        try:
            answer = await asyncio.wait_for(method.remote(), self.draft_timeout_s)
        except Exception:  # noqa: BLE001 - dead, restarting or hung: ask again later
            return None
        return answer.get("model_free") is True, answer.get("needs_features") is True

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
            if name in self.hosted:
                self.core.drafters[name].release(request_id, delta)
            elif name in self.core.drafters:
                self.core.drafters[name].release.remote(request_id, delta)  # fire and forget, ordered per caller

    async def _expire_forever(self) -> None:
        """Release what requests whose target died left behind (checked a few times per TTL)."""
        while True:
            await asyncio.sleep(min(5.0, self.core.request_ttl_s / 4))
            for request_id, deltas in self.core.expire().items():
                self._release(request_id, deltas)

    async def _checkpoint_forever(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_S)
            self._checkpoint()

    def _checkpoint(self) -> dict:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        learned = self.core.learned()
        data = json.dumps(learned, sort_keys=True).encode()
        if data != self._checkpointed and _internal_kv_initialized():
            _internal_kv_put(CHECKPOINT_KEY, data, overwrite=True, namespace=NAMESPACE)
            self._checkpointed = data
        return learned

    async def checkpoint(self) -> dict:
        """Checkpoint what was learned now (it is every CHECKPOINT_S anyway). -> what was saved."""
        return self._checkpoint()

    async def stats(self) -> dict:
        return self.core.stats() | {"down": sorted(self.down)}

    async def pool_lengths(self, delta: dict) -> dict:
        """A replica's new draft-length statistics join the pool's; -> the totals (checkpointed)."""
        return self.core.pool_lengths(delta)

    async def pool_guard(self, state: dict) -> dict:
        """A replica's draft-guard figures; -> per batch bucket the best-evidenced replica's."""
        return self.core.pool_guard(state)

    async def add_drafter(self, name: str, handle, config: Mapping | None = None) -> None:
        """handle: the new drafter actor's, or the `DrafterSpec` of a drafter built and hosted here."""
        if isinstance(handle, DrafterSpec):
            self.core.add_drafter(name, build_proposer(handle, self.target_vocab_size))
            self.hosted[name] = handle
            self.kinds_known.add(name)
        else:
            self.core.add_drafter(name, handle)
            self.kinds_known.discard(name)
        self.built_for["drafters"][name] = dict(config) if config is not None else None

    async def remove_drafter(self, name: str, drain_s: float = 30.0):
        """Remove the arm, up or down, then wait (at most drain_s) for its rounds in flight. -> its
        actor's handle (None for a drafter hosted here). KeyError when no such drafter is in the pool."""
        if name in self.hosted:
            self.core.remove_drafter(name)
            del self.hosted[name]
            self.built_for["drafters"].pop(name, None)
            return None
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
        """Every drafter in the pool: its actor's handle, or None for one hosted here."""
        return {name: None if name in self.hosted else d for name, d in self.core.drafters.items()}

    async def hosted_drafters(self) -> dict[str, dict]:
        """The drafters hosted here: {name: {"kind", "model", "open_sessions"}} (a drafter actor answers for itself)."""
        return {name: {"kind": spec.kind, "model": spec.model,
                       "open_sessions": open_sessions(self.core.drafters[name])}
                for name, spec in self.hosted.items()}

    async def rss_bytes(self) -> int:
        """This actor process's resident memory (for leak checks: it holds the hosted drafters' caches)."""
        import psutil

        return psutil.Process().memory_info().rss

    async def placement(self) -> dict:
        """Where this actor (and so every drafter hosted here) runs."""
        from cluster.placement import here

        return here() | {"device": "cpu"}

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

    async def put_metrics(self, replica: str, families: list) -> None:
        """A target replica's metric families (deploy/service/metrics.py), published every METRICS_S;
        the families of replicas silent for METRICS_STALE_S go (a service nobody scrapes whose
        replicas die and are replaced keeps only the live ones')."""
        self.replica_families[replica] = (time.monotonic(), families)
        self._drop_silent_replicas()

    def _drop_silent_replicas(self) -> None:
        now = time.monotonic()
        for replica, (when, _) in list(self.replica_families.items()):
            if now - when > METRICS_STALE_S:
                del self.replica_families[replica]

    async def cost_profile(self, key: str, claimant: str) -> dict:
        """The forward-cost profile published for `key`, or whether `claimant` is to measure it
        (deploy/engine/shared_profile.py)."""
        return self.profiles.ask(key, claimant, time.monotonic())

    async def put_cost_profile(self, key: str, profile: dict) -> None:
        self.profiles.put(key, profile)

    async def replica_metrics(self, exclude: str = "") -> list[list]:
        """Every other replica's last published metric families; a replica silent for
        METRICS_STALE_S (it died, or was scaled away) is dropped."""
        self._drop_silent_replicas()
        return [families for replica, (_, families) in self.replica_families.items() if replica != exclude]


def _pool_at_start(given: Mapping[str, object]) -> dict[str, object]:
    """The given drafters, or after a restart the drafter actors alive now (the given order first,
    then drafters added live since), so removed drafter actors stay out and added ones come back;
    the drafters hosted here come back as given."""
    named = named_drafters()
    if not named:
        return dict(given)
    ordered = [n for n in given if n in named or isinstance(given[n], DrafterSpec)]
    ordered += sorted(n for n in named if n not in given)
    return {name: given[name] if isinstance(given.get(name), DrafterSpec) else named[name] for name in ordered}


def start_coordinator_actor(drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0,
                            draft_timeout_s: float = DRAFT_TIMEOUT_S, request_ttl_s: float = REQUEST_TTL_S,
                            verify: str = DEFAULT_VERIFY, built_for: Mapping | None = None,
                            target_vocab_size: int | None = None):
    """The named async actor `specfleet:coordinator` over drafter actor handles and the specs of
    the drafters it hosts (restarted by Ray after a crash, with the same arguments). built_for:
    what cluster/pool.py built the pool from."""
    import ray

    actor = ray.remote(CoordinatorActor).options(
        name=COORDINATOR_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=256, lifetime="detached",
        max_restarts=-1, max_task_retries=0,
    )
    return actor.remote(dict(drafters), policy, seed, draft_timeout_s, request_ttl_s, verify, built_for, target_vocab_size)


def connect_coordinator() -> "RemoteCoordinator":
    """The running coordinator actor, looked up by name in the `specfleet` namespace."""
    import ray

    return RemoteCoordinator(ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE))


class RemoteCoordinator:
    """The engine's `DraftCoordinator` (deploy/engine/coordination.py) over the coordinator actor.
    If the actor fails a call (it crashed; Ray restarts it), the request carries on with plain
    target steps to its end, still exact; later requests use the restarted coordinator."""

    def __init__(self, handle) -> None:
        import ray

        self.handle = handle
        stats = ray.get(handle.stats.remote())
        self.reward_kind = stats["reward"]
        self.wants_features = bool(stats.get("features"))  # then the engine collects the target's features
        self.wants_predictions = bool(stats.get("predictions"))  # then it sends its top-k predictions
        self.degraded: set[str] = set()  # requests finishing on plain decoding since a coordinator failure
        self._lock = threading.Lock()
        self._registration: tuple[str, dict] | None = None
        self._reregister = False

    def propose_batch(self, calls: list[DraftCall]) -> list[DraftRound]:
        """A batch iteration's rounds in one actor call (the actor drafts in parallel, nothing deferred)."""
        import ray
        from ray.exceptions import RayError

        live = [i for i, call in enumerate(calls) if call.request_id not in self.degraded]
        rounds = [PLAIN_ROUND] * len(calls)
        if not live:
            return rounds
        try:
            answered = ray.get(self.handle.propose_batch.remote([replace(calls[i], new_tokens=list(calls[i].new_tokens))
                                                                 for i in live]))
            if self._reregister and self._registration is not None:
                self._reregister = False
                self.handle.register_replica.remote(*self._registration)
        except RayError:  # the coordinator died or is restarting: these requests end on plain decoding
            with self._lock:
                self.degraded.update(calls[i].request_id for i in live)
                self._reregister = True
            return rounds
        for i, round_ in zip(live, answered):
            rounds[i] = round_
        self.wants_features = any(round_.features_wanted for round_ in answered)  # the pool grows and shrinks
        self.wants_predictions = any(round_.predictions_wanted for round_ in answered)
        return rounds

    def draft_deferred(self, request_id, tokens, sampling) -> tuple:
        """Never asked: the actor drafts every arm of a round in parallel and defers none."""
        return ()

    def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        """Sent, not awaited: the scheduler's thread goes on with the batch while the actor learns
        from the feedback and releases the sessions (Ray runs one caller's calls in order, so the
        next round's call comes after it). If the actor died, its sessions die with it or expire
        (actors/session.py)."""
        with self._lock:
            degraded = request_id in self.degraded
            self.degraded.discard(request_id)
        if degraded:
            return  # a restarted coordinator never knew it
        self.handle.finish.remote(request_id, list(new_tokens), feedback)

    def pool_lengths(self, delta: dict):
        """Sent, not awaited: -> a Future of the pool's draft-length totals (deploy/engine/shared_lengths.py)."""
        return self.handle.pool_lengths.remote(delta).future()

    def pool_guard(self, state: dict):
        """Sent, not awaited: -> a Future of the pooled draft-guard figures."""
        return self.handle.pool_guard.remote(state).future()

    def cost_profile(self, key: str, claimant: str, timeout_s: float = 30.0) -> dict:
        """The published forward-cost profile for `key`, or whether `claimant` is to measure it."""
        import ray

        return ray.get(self.handle.cost_profile.remote(key, claimant), timeout=timeout_s)

    def put_cost_profile(self, key: str, profile: dict) -> None:
        """Sent, not awaited: the forward-cost profile this replica measured."""
        self.handle.put_cost_profile.remote(key, profile)

    def put_metrics(self, replica: str, families: list) -> None:
        """Sent, not awaited: this replica's metric families, for the other replicas' scrapes."""
        self.handle.put_metrics.remote(replica, families)

    async def replica_metrics(self, exclude: str, timeout_s: float = 2.0) -> list[list]:
        """The other replicas' last published metric families ([] when the coordinator does not answer in time)."""
        import ray

        try:
            return await asyncio.wait_for(self.handle.replica_metrics.remote(exclude), timeout_s)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            return []

    def register_replica(self, name: str, placement: dict) -> None:
        import ray

        self._registration = (name, placement)
        ray.get(self.handle.register_replica.remote(name, placement))

    def stats(self, timeout: float | None = None) -> dict:
        import ray

        return ray.get(self.handle.stats.remote(), timeout=timeout)


def load_checkpoint() -> bytes | None:
    """The coordinator's last checkpoint in this cluster (None: none)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    return _internal_kv_get(CHECKPOINT_KEY, namespace=NAMESPACE) if _internal_kv_initialized() else None


def delete_checkpoint() -> None:
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_initialized

    if _internal_kv_initialized():
        _internal_kv_del(CHECKPOINT_KEY, namespace=NAMESPACE)
