"""Two target replicas serve as one: both answer exactly like plain decoding, every scrape of
/metrics holds both replicas' series, one measures the forward costs and the other adopts them,
and what they learn about draft lengths is pooled in the coordinator (and its checkpoint). Killing a replica while 16 clients stream ends exactly the
requests on it, each with an SSE error event and [DONE] within 10 s, never a hang; every other
answer is exact, the service answers new requests, Serve's replacement (adopting the forward
costs) answers in bounded time, the
coordinator and its statistics live on, and the dead replica's drafter sessions are released.
A local Ray of this test's own (it runs in this stage: it stops its pool at the end, which the
main suite's shared service must keep)."""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from deploy.bench.replica_kill import per_replica
from tests.conftest import CHAT_PROMPTS, chat_text, free_ports, plain_text

pytestmark = [pytest.mark.cluster, pytest.mark.model]
MAX_TOKENS = 16
# k 2 without padding: each replica measures few forward sizes at start; 8 requests at a time per
# replica, so 16 clients fill both; a request without a round for 10 s is over (its replica died)
ARGS = {"policy": "metasd-ucb", "k": 2, "max_padding": 0, "max_ongoing_requests": 8, "request_ttl_s": 10,
        "target": {"replicas": 2},
        "drafters": [{"name": "ngram", "kind": "ngram"}, {"name": "suffix", "kind": "suffix"},
                     {"name": "none", "kind": "none"}]}


@pytest.fixture(scope="module")
def two_replicas():
    from deploy.service.app import start_local_service, stop_local_service

    with pytest.MonkeyPatch.context() as env:  # Serve's load reports every second, not 10 (the autoscaling test)
        env.setenv("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "1")
        env.setenv("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "1")
        try:
            yield start_local_service(ARGS, port=free_ports(1)[0])
        finally:
            stop_local_service(ARGS)


@pytest.fixture(scope="module")
def plain(target):
    return [plain_text(target, messages, MAX_TOKENS) for messages in CHAT_PROMPTS]


def pooled_lengths() -> dict:
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.local import NAMESPACE

    return ray.get(ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE).checkpoint.remote())["draft_lengths"]


def running_replicas() -> int:
    from ray import serve

    from deploy.service.app import APP_NAME

    return serve.status().applications[APP_NAME].deployments["SpecfleetServer"].replica_states.get("RUNNING", 0)


def test_both_replicas_answer_exactly_and_every_scrape_shows_both(two_replicas, plain):
    prompts = CHAT_PROMPTS * 2
    with ThreadPoolExecutor(len(prompts)) as clients:
        answers = list(clients.map(lambda messages: chat_text(two_replicas, messages, MAX_TOKENS), prompts))
    assert answers == plain * 2
    deadline = time.monotonic() + 30  # each replica publishes its metrics every 2 s
    served = per_replica(two_replicas)
    while sum(row["requests"] for row in served.values()) < len(prompts):
        assert time.monotonic() < deadline, served
        time.sleep(0.5)
        served = per_replica(two_replicas)
    assert len(served) == 2 and all(row["tokens"] > 0 for row in served.values())  # both answered
    for _ in range(10):
        assert len(per_replica(two_replicas)) == 2


def forward_costs() -> dict[str, str]:
    """replica -> "measured" or "adopted" (its forward-cost profile, from a peer on like hardware)."""
    from cluster.pool import pool_status

    return {r["replica"]: r.get("forward_costs") for r in pool_status()["replicas"]}


def test_one_replica_measures_the_forward_costs_and_the_other_adopts_them(two_replicas):
    assert sorted(forward_costs().values()) == ["adopted", "measured"]


def test_the_replicas_pool_their_draft_length_statistics_in_the_coordinator(two_replicas):
    deadline = time.monotonic() + 30  # a replica shares at most every 5 s, after an iteration
    while not pooled_lengths() and time.monotonic() < deadline:
        chat_text(two_replicas, CHAT_PROMPTS[0], MAX_TOKENS)
        time.sleep(1)
    pooled = pooled_lengths()
    assert pooled and all(len(rows) == 2 for rows in pooled.values())
    assert sum(rows[0][0] for rows in pooled.values()) > 0  # drafted first tokens were verified


def test_killing_a_replica_under_load_ends_only_its_requests_cleanly_and_the_service_recovers(two_replicas, plain):
    from deploy.bench.replica_kill import kill_round

    prompts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(32)]
    before = set(forward_costs())
    report = kill_round(two_replicas, prompts, [plain[i % len(plain)] for i in range(32)], clients=16,
                        max_tokens=MAX_TOKENS, request_ttl_s=ARGS["request_ttl_s"])
    assert report["victim"] is not None and report["failed"] > 0, report  # the kill came while requests ran on it
    assert report["hung"] == 0 and report["wrong"] == 0, report
    assert report["failed_on_another_replica"] == 0 and report["failed_unclean"] == 0, report
    assert report["slowest_failure_s"] <= 10, report
    assert report["recovered_s"] is not None and report["recovered_s"] <= 60, report
    # the 60 s floor is measured by deploy/bench/replica_kill.py (17-23 s); here: it comes at all,
    # within a bound for a busy CI machine
    assert report["replacement_serving_s"] is not None and report["replacement_serving_s"] <= 150, report
    assert report["coordinator_kept"] and report["sessions_released_s"] is not None, report
    assert [costs for replica, costs in forward_costs().items() if replica not in before] == ["adopted"]


def test_with_autoscaling_serve_adds_a_replica_under_load_and_removes_it_after(two_replicas, plain):
    from ray import serve

    from deploy.service.app import APP_NAME, build_app

    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
               "upscale_delay_s": 0, "downscale_delay_s": 2, "look_back_period_s": 2}
    args = ARGS | {"target": {"autoscaling": scaling}}
    serve.run(build_app(args), name=APP_NAME, route_prefix="/")  # a config change: the replicas stay
    deadline = time.monotonic() + 120
    while running_replicas() != 1:  # idle: down to min_replicas
        assert time.monotonic() < deadline, "Serve kept 2 idle replicas above min_replicas 1"
        time.sleep(1)
    stop = time.monotonic() + 150
    scaled_up = False
    with ThreadPoolExecutor(8) as clients:  # 8 streams against a target of 2 each: Serve wants 2 replicas
        pending = set()
        while time.monotonic() < stop and not scaled_up:
            while len(pending) < 8:
                pending.add(clients.submit(chat_text, two_replicas, CHAT_PROMPTS[0], MAX_TOKENS))
            done = {f for f in pending if f.done()}
            for future in done:
                assert future.result() == plain[0]
            pending -= done
            scaled_up = running_replicas() == 2
            time.sleep(0.5)
        for future in pending:
            assert future.result(timeout=120) == plain[0]
    assert scaled_up, "Serve did not add a replica under load within 150 s"
    deadline = time.monotonic() + 120
    while running_replicas() != 1:  # the load is gone: back to one
        assert time.monotonic() < deadline, "Serve did not remove the replica after the load"
        time.sleep(1)
    assert chat_text(two_replicas, CHAT_PROMPTS[1], MAX_TOKENS) == plain[1]
