"""Deploying the app reconciles the drafter pool to the config (drafters hosted by the coordinator
and drafter actors alike), and deleting it (or shutting Serve down) leaves no specfleet actor or
placement group holding resources: the Serve app on a local
Ray of this test's own (it runs in this stage: it stops pools, which the shared service of the
main suite must keep)."""
import time

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.model]
# k 1 without padding: each replica measures two forward sizes at start, not nine (a faster test)
# `suffix` asks a CPU share: an actor of its own, in the pool's placement group; the others are hosted
SUFFIX_ACTOR = {"name": "suffix", "kind": "suffix", "num_cpus": 0.5}
BASE = {"policy": "metasd-ucb", "k": 1, "max_padding": 0,
        "drafters": [{"name": "ngram", "kind": "ngram"}, SUFFIX_ACTOR, {"name": "none", "kind": "none"}]}
POOL = ["specfleet:coordinator", "specfleet:drafter:suffix"]


def pool_actors() -> list[str]:
    import ray

    from cluster.local import NAMESPACE

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE)


def arms() -> dict[str, str]:
    """The coordinator's drafters: where each runs."""
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.local import NAMESPACE

    handles = ray.get(ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE).drafter_handles.remote())
    return {name: "coordinator" if handle is None else "actor" for name, handle in handles.items()}


def live_groups() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return sorted(e["name"] for e in placement_group_table().values() if e["state"] != "REMOVED")


def settled(check, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.5)
    return check()


def coordinator_id() -> str:
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.local import NAMESPACE

    return ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)._actor_id.hex()


@pytest.fixture(scope="module")
def serve_on_local_ray():
    import ray
    from ray import serve

    from cluster.local import connect
    from tests.conftest import free_ports

    connect(None)
    serve.start(http_options={"host": "127.0.0.1", "port": free_ports(1)[0]})
    yield serve
    serve.shutdown()
    ray.shutdown()


def test_redeploys_reconcile_the_pool_and_deleting_the_app_frees_it(serve_on_local_ray):
    from deploy.service.app import build_app

    serve = serve_on_local_ray
    serve.run(build_app(BASE), name="specfleet", route_prefix="/")
    assert pool_actors() == POOL and live_groups() == ["specfleet:pool"]
    assert arms() == {"ngram": "coordinator", "suffix": "actor", "none": "coordinator"}
    first = coordinator_id()

    # the config drops `none` and adds `hierarchy`: the same pool (its bandit statistics) is reconciled
    serve.run(build_app(BASE | {"drafters": [{"name": "ngram", "kind": "ngram"}, SUFFIX_ACTOR,
                                             {"name": "hierarchy", "kind": "hierarchy"}]}),
              name="specfleet", route_prefix="/")
    assert pool_actors() == POOL
    assert arms() == {"ngram": "coordinator", "suffix": "actor", "hierarchy": "coordinator"}
    assert coordinator_id() == first

    # another policy: the pool built for the old one is replaced
    serve.run(build_app(BASE | {"policy": "thompson"}), name="specfleet", route_prefix="/")
    assert pool_actors() == POOL and arms() == {"ngram": "coordinator", "suffix": "actor", "none": "coordinator"}
    assert coordinator_id() != first

    serve.delete("specfleet")
    assert settled(lambda: pool_actors() == [] and live_groups() == []), (pool_actors(), live_groups())

    serve.run(build_app(BASE), name="specfleet", route_prefix="/")
    assert pool_actors() == POOL
    serve.shutdown()
    assert settled(lambda: pool_actors() == [] and live_groups() == []), (pool_actors(), live_groups())
