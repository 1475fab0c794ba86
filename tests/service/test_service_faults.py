"""Failures on the running Ray service never fail a request and never change an answer: a drafter
actor that dies or hangs costs rounds their drafts only (per-round deadline), is marked down,
restarted by Ray and rejoins as an arm; a crashed coordinator is restarted by Ray, from its checkpoint of
what it learned, while requests finish on plain decoding. Runs after the other service tests (it kills parts of the service)."""
import time

import pytest

from tests.conftest import CHAT_PROMPTS, chat_text, plain_text

pytestmark = [pytest.mark.model, pytest.mark.ray]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def plain(target):
    return plain_text(target, CHAT_PROMPTS[0], MAX_TOKENS)


def ask(service) -> str:
    return chat_text(service.url, CHAT_PROMPTS[0], MAX_TOKENS, service.api_key)


def coordinator():
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.local import NAMESPACE

    return ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)


def coordinator_stats(timeout_s: float = 60.0) -> dict:
    """The coordinator's statistics, waiting while Ray restarts it."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(coordinator().stats.remote(), timeout=10)
        except (ray.exceptions.RayError, ValueError):
            assert time.monotonic() < deadline, "the coordinator did not come back"
            time.sleep(0.5)


def pulls(stats: dict) -> int:
    return sum(d["pulls"] for d in stats["drafters"].values())


def wait_until(condition, timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_hung_drafter_costs_rounds_their_drafts_only_and_rejoins_once_it_answers(service, plain, tmp_path):
    import ray

    from cluster.drafter_actor import DRAFTER_PREFIX
    from cluster.local import NAMESPACE

    stall = tmp_path / "stall"
    stall.touch()

    class StallingDrafter:
        """Hangs (propose and health probes) while the file exists; then drafts nothing."""

        def __init__(self, path: str) -> None:
            self.path = path

        def _wait(self) -> None:
            import os

            while os.path.exists(self.path):
                time.sleep(0.1)

        def propose_batch(self, calls):
            from actors.proposal import Proposal

            self._wait()
            return [Proposal("stall") for _ in calls]

        def release(self, session, context_delta=()) -> None:
            pass

        def open_sessions(self) -> int:
            self._wait()
            return 0

    handle = ray.remote(StallingDrafter).options(
        name=DRAFTER_PREFIX + "stall", namespace=NAMESPACE, num_cpus=0, max_restarts=-1, lifetime="detached",
        max_concurrency=4).remote(str(stall))
    ray.get(coordinator().add_drafter.remote("stall", handle))
    try:
        assert ask(service) == plain  # UCB tries the new arm in this request: it hangs past the deadline
        stats = coordinator_stats()
        assert stats["down"] == ["stall"] and "stall" not in ray.get(coordinator().drafter_handles.remote())
        assert ask(service) == plain  # served while the arm is down
        stall.unlink()  # it answers again: Ray restarted it after the coordinator killed it
        wait_until(lambda: coordinator_stats()["down"] == [], what="the drafter to rejoin")
        assert "stall" in ray.get(coordinator().drafter_handles.remote())
        assert ask(service) == plain
    finally:
        stall.unlink(missing_ok=True)
        from cluster.pool import remove_drafter

        remove_drafter("stall", drain_s=5)


def test_a_killed_drafter_never_fails_a_request_and_is_back_after_ray_restarts_it(service, plain):
    import ray

    from cluster.drafter_actor import DRAFTER_PREFIX
    from cluster.local import NAMESPACE

    ray.kill(ray.get_actor(DRAFTER_PREFIX + "suffix", namespace=NAMESPACE), no_restart=False)  # the one drafter actor
    assert [ask(service) for _ in range(2)] == [plain] * 2
    wait_until(lambda: coordinator_stats()["down"] == [], what="the drafter to rejoin")
    assert "suffix" in ray.get(coordinator().drafter_handles.remote())
    assert ask(service) == plain


def test_a_crashed_coordinator_leaves_the_service_answering_and_comes_back_with_the_pool_and_what_it_learned(
        service, plain):
    import ray

    pool_before = sorted(ray.get(coordinator().drafter_handles.remote()))
    learned = ray.get(coordinator().checkpoint.remote())  # it checkpoints every 2 s anyway
    ray.kill(coordinator(), no_restart=False)
    assert ask(service) == plain  # on plain decoding, or on the restarted coordinator
    restarted = coordinator_stats()
    assert sum(counts["pulls"] for counts in learned["drafters"].values()) > 0  # it had learned something to lose
    for name, counts in learned["drafters"].items():  # ... and kept it over the restart
        assert restarted["drafters"][name]["pulls"] >= counts["pulls"], name
    assert sorted(ray.get(coordinator().drafter_handles.remote())) == pool_before  # removed ones stay out
    assert ask(service) == plain
    assert pulls(coordinator_stats()) > pulls(restarted)  # the restarted coordinator drafts again


def test_a_target_replica_dying_mid_request_gives_clean_errors_then_serve_replaces_it(service, plain):
    """Three requests in flight on the replica (a completion, an SSE stream that has begun, a
    gRPC call) when it is killed: a 503 OpenAI-style JSON error, an SSE error event then [DONE],
    and UNAVAILABLE; none hangs. The coordinator forgets their requests and releases their
    drafter sessions; Serve starts a new replica and the service answers exactly again."""
    import json
    import threading
    import urllib.error
    import urllib.request

    import grpc
    import ray
    from openai import APIError

    from cluster.pool import REPLICA_PREFIX
    from deploy.service.proto import specfleet_pb2, specfleet_pb2_grpc

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {service.api_key}"}
    long_chat = {"model": "smollm2-135m", "messages": CHAT_PROMPTS[1], "max_tokens": 400, "temperature": 0}
    outcome: dict = {}

    def completion() -> None:
        request = urllib.request.Request(f"{service.url}/v1/chat/completions", json.dumps(long_chat).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                outcome["completion"] = (response.status, json.loads(response.read()))
        except urllib.error.HTTPError as err:
            outcome["completion"] = (err.code, json.loads(err.read()))

    def grpc_call() -> None:
        with grpc.insecure_channel(service.grpc_address) as channel:
            stub = specfleet_pb2_grpc.SpecfleetStub(channel)
            request = specfleet_pb2.GenerateRequest(
                messages=[specfleet_pb2.ChatMessage(**m) for m in CHAT_PROMPTS[1]], max_tokens=400, temperature=0)
            try:
                stub.Generate(request, metadata=(("application", "specfleet"),
                                                 ("authorization", f"Bearer {service.api_key}")), timeout=120)
                outcome["grpc"] = "OK"
            except grpc.RpcError as err:
                outcome["grpc"] = err.code()

    stream_request = urllib.request.Request(f"{service.url}/v1/chat/completions",
                                            json.dumps(long_chat | {"stream": True}).encode(), headers)
    stream = urllib.request.urlopen(stream_request, timeout=120)
    assert stream.readline().startswith(b"data: ")  # the stream has begun
    threads = [threading.Thread(target=completion), threading.Thread(target=grpc_call)]
    for thread in threads:
        thread.start()
    time.sleep(3)  # all three are in flight on the replica
    (replica,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(REPLICA_PREFIX)]
    ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=True)
    killed_at = time.monotonic()
    events = [line for line in stream.read().decode().splitlines() if line.startswith("data: ")]
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a request hung after its replica died"
    status, body = outcome["completion"]
    assert status == 503 and body["error"]["type"] == "service_unavailable_error" and body["error"]["code"] == 503
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 503 and events[-1] == "data: [DONE]"
    assert outcome["grpc"] == grpc.StatusCode.UNAVAILABLE
    # what the dead replica's requests held is let go after request_ttl_s (15 s in this service)
    wait_until(lambda: coordinator_stats()["active_requests"] == 0, 90, "the coordinator to forget them")
    drafters = ray.get(coordinator().drafter_handles.remote())  # None: hosted by the coordinator

    def open_sessions() -> list[int]:
        hosted = ray.get(coordinator().hosted_drafters.remote())
        return [ray.get(h.open_sessions.remote()) if h is not None else hosted[name]["open_sessions"]
                for name, h in drafters.items()]

    wait_until(lambda: not any(open_sessions()), 30, "their drafter sessions to be released")
    wait_until(lambda: any(a["name"].startswith(REPLICA_PREFIX) and a["name"] != replica
                           for a in ray.util.list_named_actors(all_namespaces=True)), 120, "a new replica")
    deadline, refused = time.monotonic() + 180, 0
    while True:  # Serve routes to the new replica once it is up (model loaded)
        try:
            assert ask(service) == plain
            break
        except APIError:
            refused += 1
            assert time.monotonic() < deadline, "the service did not come back with a new replica"
            time.sleep(2)
    print(f"\nreplica death: answering again {time.monotonic() - killed_at:.1f} s after the kill, "
          f"{refused} request(s) refused meanwhile")
