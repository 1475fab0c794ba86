"""The drafter pool on a Ray cluster: start it, grow it, find where everything runs, stop it.

`start_pool(config)` turns the config's drafters into resource requests (cluster/resources.py),
reserves the GPU-holding ones together in the placement group `specfleet:pool` (one bundle per
drafter, the config's strategy), starts one named actor (`specfleet:drafter:<name>`) per drafter
that runs a model or asks for resources, and the coordinator actor over them, which hosts the
drafters that need neither (lookups: cluster/resources.py `drafts_in_coordinator`). A redeploy finds the coordinator by name and reconciles the
pool to the config: with the same target, policy, verification and timeouts (`pool_signature`) it
keeps the pool and its bandit statistics, starts the drafters the config adds, drains and stops
those it drops, and replaces a drafter whose entry changed; a pool built for another target (or
policy) is stopped and a new one started.

`add_drafter(config, drafter)` starts one more drafter actor, in a placement group of its own
(`specfleet:pool:<name>`) when it asks for resources, or has the coordinator host it, and
registers it as a new arm, live; `remove_drafter(name)` drains it out (requests in flight carry on
with the other arms) and stops it. `pool_status()` reports the nodes, the target replicas and every drafter (node,
Ray's GPU ids, device, up/down, pulls, acceptance) for `specfleet status`. `stop_pool` kills the
actors and removes the placement groups.
"""
from __future__ import annotations

from actors.models import model_vocab_size
from cluster.coordinator_actor import COORDINATOR_NAME, delete_checkpoint, start_coordinator_actor
from cluster.drafter_actor import DRAFTER_PREFIX, DrafterSpec, start_drafter_actor
from cluster.local import NAMESPACE
from cluster.placement import cluster_gpus, in_bundle, release, reserve
from cluster.resources import bundle, bundle_indices, drafter_gpus, drafts_in_coordinator
from deploy.config import DrafterConfig, ServiceConfig

POOL_GROUP = "specfleet:pool"
REPLICA_PREFIX = "SERVE_REPLICA::specfleet#SpecfleetServer#"  # Serve's actor names for the target's replicas
HEALTH_TIMEOUT_S = 5.0
NOWHERE = {"node": None, "node_ip": None, "gpu": [], "device": None}  # placement of what did not answer


def _spec(config: ServiceConfig, drafter: DrafterConfig, gpus_in_cluster: float) -> DrafterSpec:
    num_gpus = drafter_gpus(drafter.kind, drafter.model, drafter.num_gpus, gpus_in_cluster)
    return DrafterSpec(drafter.name, drafter.kind, drafter.model, config.target.model, drafter.num_layers,
                       config.target.dtype, num_gpus, drafter.num_cpus, tuple(sorted(drafter.resources.items())))


def pool_signature(config: ServiceConfig) -> dict:
    """What a running pool is built for, beyond its drafters: a change here replaces the pool."""
    return {"model": config.target.model, "dtype": config.target.dtype, "policy": config.policy,
            "verify": config.verify, "draft_timeout_s": config.draft_timeout_s, "request_ttl_s": config.request_ttl_s,
            "placement": config.placement.model_dump()}


def _running_pool():
    """-> (the coordinator actor, what its pool was built from) or (None, None)."""
    import ray

    try:
        coordinator = ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None, None
    return coordinator, ray.get(coordinator.pool_config.remote())


def _reconcile(config: ServiceConfig, running: dict[str, dict | None]) -> None:
    """Bring a running pool's drafters to the config's: add first (the policy never runs out of
    arms), then drop what is gone, then replace what changed. A drafter added live and not in
    the config is dropped too: the config is the pool a deploy asks for."""
    wanted = {d.name: d for d in config.drafters}
    changed = [n for n, built in running.items() if n in wanted and built is not None and built != wanted[n].model_dump()]
    for name in wanted:
        if name not in running:
            add_drafter(config, wanted[name])
    for name in [n for n in running if n not in wanted] + changed:
        remove_drafter(name)
    for name in changed:
        add_drafter(config, wanted[name])


def start_pool(config: ServiceConfig) -> None:
    """Start the drafter actors and the coordinator actor, or reconcile the running pool to `config`."""
    import ray

    coordinator, built_for = _running_pool()
    if coordinator is not None:
        if built_for["signature"] == pool_signature(config):
            _reconcile(config, built_for["drafters"])
            return
        stop_pool(config)  # built for another target, policy or verification: replaced
    vocab = model_vocab_size(config.target.model)
    gpus_in_cluster = cluster_gpus()
    specs = [_spec(config, d, gpus_in_cluster) for d in config.drafters]
    indices = bundle_indices(specs)
    group = None
    if indices:
        bundles = [bundle(s) for s in specs if s.name in indices]
        group = reserve(POOL_GROUP, bundles, config.placement.strategy, config.placement.timeout_s)
    pool = {s.name: s if drafts_in_coordinator(s) else
            start_drafter_actor(s, vocab, in_bundle(group, indices[s.name]) if s.name in indices else None)
            for s in specs}
    ray.get([h.open_sessions.remote() for h in pool.values() if not isinstance(h, DrafterSpec)])  # fail fast
    built_for = {"signature": pool_signature(config), "drafters": {d.name: d.model_dump() for d in config.drafters}}
    coordinator = start_coordinator_actor(pool, config.policy, draft_timeout_s=config.draft_timeout_s,
                                          request_ttl_s=config.request_ttl_s, verify=config.verify, built_for=built_for,
                                          target_vocab_size=vocab)
    ray.get(coordinator.ready.remote())  # every drafter's kind known before the first request


def add_drafter(config: ServiceConfig, drafter: DrafterConfig) -> dict:
    """Start `drafter` and make it an arm of the running coordinator. -> its placement."""
    import ray

    coordinator = ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
    if drafter.name in ray.get(coordinator.drafter_handles.remote()):
        raise ValueError(f"drafter {drafter.name!r} is already in the pool")
    spec = _spec(config, drafter, cluster_gpus())
    if drafts_in_coordinator(spec):
        ray.get(coordinator.add_drafter.remote(spec.name, spec, drafter.model_dump()))
        return ray.get(coordinator.placement.remote()) | {"kind": spec.kind, "model": spec.model}
    strategy = None
    if bundle(spec):
        group = reserve(f"{POOL_GROUP}:{spec.name}", [bundle(spec)], "PACK", config.placement.timeout_s)
        strategy = in_bundle(group, 0)
    handle = start_drafter_actor(spec, model_vocab_size(config.target.model), strategy)
    placement = ray.get(handle.placement.remote())  # started and answering before it becomes an arm
    ray.get(coordinator.add_drafter.remote(spec.name, handle, drafter.model_dump()))
    ray.get(coordinator.ready.remote())  # its kind known: a feature drafter gets features from the next requests on
    return placement


def remove_drafter(name: str, drain_s: float = 30.0) -> None:
    """Drain `name` out of the coordinator (rounds in flight finish), then stop its actor and free
    its own placement group. Raises KeyError for an unknown drafter, InvalidRequestError when
    the policy would be left without an arm."""
    import ray
    from ray.exceptions import RayTaskError

    coordinator = ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
    try:
        handle = ray.get(coordinator.remove_drafter.remote(name, drain_s))
    except RayTaskError as err:
        raise err.as_instanceof_cause() from None
    if handle is not None:  # None: the coordinator hosted it
        ray.kill(handle)
        release(f"{POOL_GROUP}:{name}")


def _probe(handle) -> dict:
    import ray

    try:
        return {"status": "up"} | ray.get(handle.placement.remote(), timeout=HEALTH_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - a dead or hung actor is a status, not a crash
        return {"status": "down", "error": type(err).__name__, "kind": None, "model": None} | NOWHERE


def pool_status() -> dict:
    """{"nodes", "policy", "replicas", "drafters"} of the running service (see specfleet status)."""
    import ray

    coordinator = ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
    stats = ray.get(coordinator.stats.remote())
    handles = ray.get(coordinator.drafter_handles.remote())
    hosted = ray.get(coordinator.hosted_drafters.remote())
    registered = ray.get(coordinator.registered_replicas.remote())
    replicas = [{"replica": a["name"]} | registered.get(a["name"], NOWHERE)  # alive, maybe not registered yet
                for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(REPLICA_PREFIX)]
    drafters = []
    for name, handle in handles.items():
        probe = _probe(handle) if handle is not None else (  # hosted by the coordinator: where it runs
            _probe(coordinator) | {"kind": hosted[name]["kind"], "model": hosted[name]["model"]})
        probe["runs_in"] = "actor" if handle is not None else "coordinator"
        numbers = stats["drafters"].get(name, {})
        drafters.append({"name": name} | probe
                        | {"pulls": numbers.get("pulls", 0), "acceptance": numbers.get("acceptance")})
    nodes = [{"node": n["NodeID"], "node_ip": n["NodeManagerAddress"], "alive": n["Alive"],
              "gpus": n.get("Resources", {}).get("GPU", 0.0)} for n in ray.nodes()]
    return {"policy": stats["policy"], "nodes": nodes, "replicas": replicas, "drafters": drafters}


def stop_pool(config: ServiceConfig | None = None, wait_s: float = 30.0) -> None:
    """Kill the coordinator and every drafter actor (the running pool's and the config's), free the
    placement groups, delete the coordinator's checkpoint, and wait (at most wait_s) until their
    names are free again."""
    import time

    import ray

    named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE
             and (a["name"] == COORDINATOR_NAME or a["name"].startswith(DRAFTER_PREFIX))]
    names = {*named, *(DRAFTER_PREFIX + d.name for d in (config.drafters if config else []))}
    for name in [COORDINATOR_NAME, *sorted(names - {COORDINATOR_NAME})]:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        except ValueError:
            pass
    release(POOL_GROUP, prefix=True)  # the pool's group and those of drafters added later
    delete_checkpoint()  # a new service starts afresh
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(
            a["namespace"] == NAMESPACE and a["name"] in names | {COORDINATOR_NAME}
            for a in ray.util.list_named_actors(all_namespaces=True)):
        time.sleep(0.2)
