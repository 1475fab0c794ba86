"""Losing a target replica under load, measured: what happens to the requests on it, how fast the
service recovers, and whether the replacement drafts as well as the survivor.

`python -m deploy.bench.replica_kill [--rounds 5] [--clients 16] [--requests 32] [--max-tokens 64]
[--first 10] [--out FILE]` starts the default service with 2 target replicas on a fresh local Ray
and, each round: `--clients` clients stream `--requests` chat requests (deploy/prompts/
mixed_test.jsonl, cycled) over raw SSE; once a request is streaming, the replica serving it (the
`specfleet-replica` header) is killed (`ray.kill`, Serve then starts a replacement). A round
reports: requests that hung (none ended within `--timeout-s`), failed ones and whether each was
on the killed replica and ended cleanly (an SSE error event, then `data: [DONE]`) and how long
after the kill, completed answers that differ from plain decoding (computed in this process),
seconds until a request sent after the kill had succeeded and until Serve's replacement
had answered one, whether the coordinator actor
is the one from before, and seconds until the coordinator had no request open (the dead
replica's drafter sessions released, after `--request-ttl-s`). Then the yield: prompts of
deploy/prompts/styles_test.jsonl (not the load's; each round goes on where the last stopped),
each sent twice at once, until `--first` of them were answered by both the replacement and the
survivor: the replacement's tokens per forward over them against the survivor's over the same
prompts (each response's metrics; the service runs with `request_metrics` on).
`kill_round` and the helpers are what tests/cluster_stage/test_replicas.py runs.
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from deploy.service.openai_api import REPLICA_HEADER

HUNG_S = 180.0  # a request not ended this long after it was sent counts as hung
CLEAN_END_S = 10.0  # a request on the killed replica must end this soon after the kill
RECOVERY_S = 60.0  # new requests succeed and the replacement runs within this


def stream_chat(url: str, messages: list[dict], max_tokens: int, record: dict, timeout_s: float = HUNG_S) -> None:
    """One streamed greedy chat completion over raw SSE; `record` gets the replica that answered,
    the text, whether an error event came, whether [DONE] came, whether it hung, and when it ended."""
    import requests

    body = {"model": "smollm2-135m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    record.update(text="", error=False, done=False, hung=False, replica=None, sent=time.monotonic())
    try:
        with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=timeout_s) as reply:
            record["replica"] = reply.headers.get(REPLICA_HEADER)
            for raw in reply.iter_lines():
                line = raw.decode("utf-8")
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    record["done"] = True
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    record["error"] = True
                elif event.get("choices"):
                    record["text"] += event["choices"][0]["delta"].get("content") or ""
    except requests.Timeout:
        record["hung"] = True
    except requests.RequestException:
        record["error"] = True  # the connection broke: not a clean end (no [DONE])
    finally:
        record["ended"] = time.monotonic()


class Answer(NamedTuple):
    """One greedy chat completion's answer."""

    replica: str | None  # the replica that answered (the `specfleet-replica` header)
    text: str
    tokens: int  # completion tokens
    forwards: int | None  # target forwards it took (the response's per-request metrics; None without them)


def answered(url: str, messages: list[dict], max_tokens: int) -> Answer:
    """One greedy chat completion (not streamed); raises on any failure. The forwards need the
    service's `request_metrics` on."""
    import requests

    body = {"model": "smollm2-135m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    reply = requests.post(f"{url}/v1/chat/completions", json=body, timeout=HUNG_S)
    reply.raise_for_status()
    answer = reply.json()
    return Answer(reply.headers.get(REPLICA_HEADER), answer["choices"][0]["message"]["content"],
                  answer["usage"]["completion_tokens"],
                  answer["metrics"]["timing"]["rounds"] if "metrics" in answer else None)


def replica_actor(replica_id: str):
    """The Serve replica actor whose id (the `specfleet-replica` header) is `replica_id`."""
    import ray

    [named] = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith("#" + replica_id)]
    return ray.get_actor(named["name"], namespace=named["namespace"])


def coordinator_state() -> tuple[str, dict]:
    """(the coordinator actor's id, its statistics)."""
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.local import NAMESPACE

    handle = ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
    return handle._actor_id.hex(), ray.get(handle.stats.remote(), timeout=30)


def per_replica(url: str) -> dict[str, dict[str, float]]:
    """replica -> {"requests", "tokens", "forwards"} from one scrape of /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"specfleet:request_success_total": "requests", "specfleet:generation_tokens_total": "tokens",
             "specfleet:target_forwards_total": "forwards"}
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                row = found.setdefault(sample.labels["replica"], {"requests": 0.0, "tokens": 0.0, "forwards": 0.0})
                row[names[sample.name]] += sample.value
    return found


def kill_round(url: str, prompts: Sequence[list[dict]], expected: Sequence[str], clients: int, max_tokens: int,
               request_ttl_s: float) -> dict:
    """One round (the module's docstring); -> its report. `expected[i]`: plain decoding's answer to prompts[i]."""
    import ray

    coordinator_before, _ = coordinator_state()
    serving_before = set(per_replica(url))
    records: list[dict] = [{} for _ in prompts]
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(stream_chat, url, messages, max_tokens, record) for messages, record in zip(prompts, records)]
        deadline = time.monotonic() + HUNG_S

        def streaming() -> dict | None:
            return next((r for r in records if r.get("replica") and r.get("text") and "ended" not in r), None)

        while streaming() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        victim = (streaming() or {}).get("replica")
        killed_at = time.monotonic()
        if victim is not None:
            ray.kill(replica_actor(victim), no_restart=True)
        for future in futures:
            future.result()
    failed = [r for r in records if r["error"] or not r["done"] or r["hung"]]
    wrong = sum(1 for r, answer in zip(records, expected) if r not in failed and r["text"] != answer)
    # new requests: the first one sent after the kill that succeeded (a probe when the load sent none)
    after = [r["ended"] - killed_at for r in records if r["sent"] > killed_at and r not in failed]
    recovered_s = min(after) if after else None
    replacement_s = None  # until a replica not serving before the kill has answered a request
    while time.monotonic() - killed_at < RECOVERY_S + 90:
        try:
            if answered(url, prompts[0], max_tokens).text == expected[0] and recovered_s is None:
                recovered_s = time.monotonic() - killed_at
        except Exception:  # noqa: BLE001 - not yet
            pass
        if any(r not in serving_before and row["requests"] for r, row in per_replica(url).items()):
            replacement_s = time.monotonic() - killed_at  # (its series reach a scrape up to 2 s late)
        if recovered_s is not None and replacement_s is not None:
            break
    coordinator_after, _ = coordinator_state()
    released_s = None  # the dead replica's requests expire request_ttl_s after their last round
    deadline = max(killed_at + request_ttl_s + 60, time.monotonic() + 5)
    while time.monotonic() < deadline:
        if not coordinator_state()[1]["active_requests"]:
            released_s = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    return {
        "victim": victim, "requests": len(records), "hung": sum(r["hung"] for r in records), "failed": len(failed),
        "failed_on_another_replica": sum(1 for r in failed if r["replica"] != victim),
        "failed_unclean": sum(1 for r in failed if not (r["error"] and r["done"])),
        "slowest_failure_s": round(max((r["ended"] - killed_at for r in failed), default=0.0), 2),
        "wrong": wrong, "recovered_s": None if recovered_s is None else round(recovered_s, 1),
        "replacement_serving_s": None if replacement_s is None else round(replacement_s, 1),
        "coordinator_kept": coordinator_after == coordinator_before,
        "sessions_released_s": None if released_s is None else round(released_s, 1),
    }


def round_passed(report: dict) -> bool:
    """The issue's floors for one round."""
    return (report["victim"] is not None and report["hung"] == 0 and report["wrong"] == 0
            and report["failed_on_another_replica"] == 0 and report["failed_unclean"] == 0
            and report["slowest_failure_s"] <= CLEAN_END_S and report["coordinator_kept"]
            and report["recovered_s"] is not None and report["recovered_s"] <= RECOVERY_S
            and report["replacement_serving_s"] is not None and report["replacement_serving_s"] <= RECOVERY_S
            and report["sessions_released_s"] is not None)


def replacement_yield(url: str, before: set[str], prompts: Sequence[list[dict]], max_tokens: int, first: int,
                      limit_s: float = 600.0) -> dict:
    """Each prompt sent twice at once (balancing, the router mostly gives the two to different
    replicas) until `first` prompts were answered by both the replacement (the replica not in
    `before`) and the survivor: each one's tokens per forward over those same prompts. Pairs that
    both went to one replica are left out."""
    totals: dict[str, list[int]] = {}  # replica -> [tokens, forwards] over the split pairs
    pairs = sent = 0
    deadline = time.monotonic() + limit_s
    with ThreadPoolExecutor(2) as pool:
        while pairs < first and time.monotonic() < deadline:
            messages = prompts[sent % len(prompts)]
            sent += 1
            answers = list(pool.map(lambda _: answered(url, messages, max_tokens), range(2)))
            replicas = {answer.replica for answer in answers}
            if len(replicas) < 2 or not replicas - before:
                continue
            pairs += 1
            for answer in answers:
                row = totals.setdefault(answer.replica, [0, 0])
                row[0] += answer.tokens
                row[1] += answer.forwards
    rates = {replica: round(tokens / forwards, 3) for replica, (tokens, forwards) in totals.items()}
    replacement = next((r for r in rates if r not in before), None)
    survivor = next((r for r in rates if r in before), None)
    ratio = round(rates[replacement] / rates[survivor], 3) if replacement and survivor else None
    return {"replacement": replacement, "survivor": survivor, "pairs": pairs, "sent": sent,
            "tokens_per_forward": rates, "ratio": ratio}


def plain_answers(prompts: Sequence[list[dict]], max_tokens: int) -> list[str]:
    from actors.models import load_causal_lm
    from actors.sampling import SamplingParams
    from deploy.bench.engines import make_engine
    from deploy.engine.target import TargetModel

    engine = make_engine("ar", TargetModel(load_causal_lm()), [], 1)
    return [engine.generate(messages=m, sampling=SamplingParams(max_tokens=max_tokens)).text for m in prompts]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="kill a target replica under load, several times; report each round")
    parser.add_argument("--rounds", type=int, default=5, help="kills, one a round, on one service")
    parser.add_argument("--clients", type=int, default=16, help="streaming clients during a round")
    parser.add_argument("--requests", type=int, default=32, help="requests a round")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--first", type=int, default=10,
                        help="prompts the replacement and the survivor both answer for the yield")
    parser.add_argument("--request-ttl-s", type=float, default=15.0, help="the service's request_ttl_s (session release)")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    args = parser.parse_args(argv)

    from deploy.bench.prompts import MIXED_TEST_PROMPTS, STYLES_TEST_PROMPTS, load_prompts
    from deploy.bench.service import free_port
    from deploy.service.app import DEFAULT_CONFIG, load_serve_config, start_local_service, stop_local_service

    items = [p.messages for p in load_prompts(MIXED_TEST_PROMPTS) if p.messages]
    pairs = [p.messages or [{"role": "user", "content": p.prompt}] for p in load_prompts(STYLES_TEST_PROMPTS)]
    pairs, used = pairs * (1 + args.rounds * 4 * args.first // len(pairs)), 0  # the yield's prompts so far
    prompts = [items[i % len(items)] for i in range(args.requests)]
    expected = plain_answers(prompts, args.max_tokens)
    config = load_serve_config(DEFAULT_CONFIG)[0]
    service_args = config | {"target": dict(config.get("target") or {}) | {"replicas": 2},
                             "request_ttl_s": args.request_ttl_s, "request_metrics": True}
    url = start_local_service(service_args, port=free_port())
    report = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "rounds": []}
    try:
        for _ in range(args.rounds):
            while len(before := set(per_replica(url))) < 2:  # both replicas have served and published
                answered(url, prompts[0], args.max_tokens)
                time.sleep(1)
            outcome = kill_round(url, prompts, expected, args.clients, args.max_tokens, args.request_ttl_s)
            outcome["passed"] = round_passed(outcome)
            outcome["yield"] = replacement_yield(url, before, pairs[used:], args.max_tokens, args.first)
            used += outcome["yield"]["sent"]
            report["rounds"].append(outcome)
            print(json.dumps(outcome), flush=True)
    finally:
        stop_local_service(service_args)
    report["all_passed"] = all(r["passed"] for r in report["rounds"])
    report["yield_ratios"] = [r["yield"]["ratio"] for r in report["rounds"]]
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
