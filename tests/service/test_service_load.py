"""Load with chaos on the running Ray service: 16 concurrent streaming clients while a drafter is
added, one is killed (Ray restarts it) and the added one is removed. Zero failed requests, every
greedy answer equal to plain decoding, and no leak: no drafter session or coordinator request
left open, the memory of the coordinator (which hosts the lookup drafters) and of the drafter
actors flat. Short form in `make test` (SPECFLEET_LOAD_S, default 20 s of load); docs/cluster.md's
figures come from SPECFLEET_LOAD_S=120."""
import os
import statistics
import threading
import time

import pytest

from cluster.drafter_actor import named_drafters
from tests.conftest import CHAT_PROMPTS, plain_text
from tests.service.test_service_faults import coordinator

pytestmark = [pytest.mark.model, pytest.mark.ray]
CLIENTS = 16
LOAD_S = float(os.environ.get("SPECFLEET_LOAD_S", "20"))
MAX_TOKENS = 16
MEMORY_SLACK = 64 << 20  # bytes the coordinator or a drafter actor may grow over the run
CHAOS_GRACE_S = 120  # the load goes on past LOAD_S until the chaos is over, at most this long


def pool_actors() -> dict:
    """The coordinator actor and the drafter actors, by name."""
    return {"coordinator": coordinator()} | named_drafters()


@pytest.fixture(scope="module")
def expected(target):
    return [plain_text(target, m, MAX_TOKENS) for m in CHAT_PROMPTS]


def chaos(service, events: list[str], done: threading.Event) -> None:
    """Add a drafter, kill one (Ray restarts it), remove the added one: spread over the run. The
    clients keep loading the service until all three have happened (`done`)."""
    import ray

    from tests.service.test_service_admin import admin

    pause = LOAD_S / 4
    try:
        time.sleep(pause)
        status, _ = admin(service, "POST", "/drafters", {"name": "load-ngram", "kind": "ngram"})
        events.append(f"add load-ngram: {status}")
        time.sleep(pause)
        ray.kill(named_drafters()["suffix"], no_restart=False)
        events.append("kill suffix")
        time.sleep(pause)
        status, _ = admin(service, "DELETE", "/drafters/load-ngram")
        events.append(f"remove load-ngram: {status}")
    finally:
        done.set()


def test_sixteen_streaming_clients_under_chaos_lose_nothing_and_leak_nothing(service, expected):
    import ray
    from openai import OpenAI

    from tests.service.test_service_faults import coordinator_stats, wait_until

    memory_before = {name: ray.get(h.rss_bytes.remote()) for name, h in pool_actors().items()}
    results: list[tuple[bool, float]] = []  # (answer exact, seconds)
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + LOAD_S
    hard_deadline = deadline + CHAOS_GRACE_S

    def client(index: int) -> None:
        openai = OpenAI(base_url=f"{service.url}/v1", api_key=service.api_key, max_retries=0, timeout=600)
        turn = index
        while time.monotonic() < hard_deadline and (time.monotonic() < deadline or not chaos_done.is_set()):
            prompt = turn % len(CHAT_PROMPTS)
            turn += 1
            start = time.monotonic()
            try:
                chunks = openai.chat.completions.create(model="smollm2-135m", messages=CHAT_PROMPTS[prompt],
                                                        max_tokens=MAX_TOKENS, temperature=0, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            except Exception as err:  # noqa: BLE001 - every failure is counted, none may happen
                with lock:
                    failures.append(repr(err)[:200])
                continue
            with lock:
                results.append((text == expected[prompt], time.monotonic() - start))

    chaos_done, events = threading.Event(), []
    saboteur = threading.Thread(target=chaos, args=(service, events, chaos_done))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in [saboteur, *threads]:
        t.start()
    for t in threads:
        t.join()
    saboteur.join()

    latencies = sorted(seconds for _, seconds in results)
    print(f"\nload: {len(results)} requests, {len(failures)} failed, "
          f"{sum(not ok for ok, _ in results)} inexact, p50 {statistics.median(latencies):.2f} s, "
          f"p99 {latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]:.2f} s; chaos: {events}")
    assert failures == [] and len(results) >= CLIENTS
    assert all(ok for ok, _ in results)
    assert events == ["add load-ngram: 201", "kill suffix", "remove load-ngram: 200"]

    wait_until(lambda: coordinator_stats()["active_requests"] == 0 and coordinator_stats()["down"] == [],
               what="the coordinator to settle")
    actors = pool_actors()
    hosted = ray.get(actors["coordinator"].hosted_drafters.remote())
    assert "load-ngram" not in actors and "load-ngram" not in hosted

    def open_sessions() -> dict[str, int]:
        in_coordinator = ray.get(actors["coordinator"].hosted_drafters.remote())
        return {name: ray.get(h.open_sessions.remote()) for name, h in actors.items() if name != "coordinator"} | {
            name: d["open_sessions"] for name, d in in_coordinator.items()}

    wait_until(lambda: not any(open_sessions().values()), timeout_s=30,
               what=f"every drafter session to be released (open: {open_sessions()})")
    growth = {name: ray.get(h.rss_bytes.remote()) - memory_before[name] for name, h in actors.items()
              if name != "suffix"}  # suffix was restarted mid-run: a new process
    print(f"coordinator and drafter actor memory growth (MiB): { {n: round(g / 2**20, 1) for n, g in growth.items()} }")
    assert all(g < MEMORY_SLACK for g in growth.values()), growth
