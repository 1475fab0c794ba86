"""`make soak`: a long run of mixed traffic against the real Ray service, with the drafter pool
changing under it, reporting what was lost and whether memory stays flat. Not part of `make test`.

`python -m deploy.bench.soak --minutes 30 --out FILE` starts the service on 127.0.0.1 (the shipped
config, API keys and an admin token on), computes plain greedy answers for a few prompts in this
process, then runs `--clients` threads for `--minutes`, each request one of KINDS (by weight):
greedy chat checked token for token against plain decoding, sampled chat, streamed completions,
streams the client drops after two events (the service must cancel them), and bad requests
(a bad field, invalid JSON, an oversized body, no key, an unknown model) that must get their 4xx.
Every CHAOS_PERIOD_S the pool changes: a drafter `soak-N` is added (admin API), killed (Ray
restarts it) and removed. With `--replicas N` (N >= 2) the target has N replicas and every
`--replica-kill-period-s` (REPLICA_KILL_PERIOD_S) the one started last is killed (Serve replaces
it; the first lives throughout): a request that was on it and ends within CLEAN_END_S of the kill
with the front's "target replica is unavailable" (503, or an SSE error event then [DONE]) is
counted as lost with its replica, expected; any other failure is unexpected. Every
SAMPLE_PERIOD_S it records the resident memory of the service's processes: each target replica
(by pid: a replacement is a series of its own, warmed up from its start), the front, the
coordinator and each standing drafter actor.

The report (JSON, and a summary on stdout): requests by kind and outcome, the unexpected ones by
reason (5xx, wrong status, timeout, connection error, inexact answer), p50/p99 latency per kind,
each process's memory at the end of warm-up and at the end with its least-squares slope (MiB per
hour) over the samples after warm-up, chaos events, and what was left open (coordinator requests,
drafter sessions). It exits 1 when anything unexpected happened, something was left open, or a
process grew more than MEMORY_BOUND_MIB after warm-up (a process holding drafters that keep past
outputs, `suffix` and `hierarchy`, may add their trie's cap, `MAX_TRIE_BYTES`, on top for each: the
coordinator, which hosts both in the default pool). The drafter the chaos adds asks a CPU share,
so it is an actor of its own that can be killed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import requests

from actors.suffix import MAX_TRIE_BYTES
from deploy.bench.replica_kill import replica_actor
from deploy.service.front import REPLICA_UNAVAILABLE

KINDS = {"greedy": 30, "sampled": 15, "stream": 25, "cancel": 15, "bad": 15}  # weights
MAX_TOKENS = 32
CHAOS_PERIOD_S = 240  # add, kill and remove a drafter once per period
SAMPLE_PERIOD_S = 30
WARMUP_S = 120  # memory growth is measured from here (allocator and caches fill first)
MEMORY_BOUND_MIB = 64
# the processes holding drafters that keep past outputs (the suffix trie; hierarchy chains one): they
# may grow by the trie's own cap on top for each (actors/suffix.py MAX_TRIE_BYTES, shared by all
# tenants); the default pool's lookups, suffix and hierarchy among them, are hosted by the coordinator
TRIES_HELD = {"coordinator": 2, "drafter suffix": 1, "drafter hierarchy": 1}
TRIE_MIB = MAX_TRIE_BYTES / 2**20
TIMEOUT_S = 300
REPLICA_KILL_PERIOD_S = 300  # with several target replicas: one killed this often
CLEAN_END_S = 10  # a request on a killed replica ends (cleanly) this soon after the kill
REPLICA_LOST = "lost with its replica"  # the front's 503 / SSE error for a replica that died mid-request
GREEDY_PROMPTS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "Summarize: The council met on Tuesday to discuss the new park. Residents raised concerns about parking.",
    "Translate to French: The weather is nice today.",
]


def bad_requests(url: str, key: str, model: str, limit: int) -> list[tuple[str, dict]]:
    """(name, requests.request kwargs with the expected status under "expect")."""
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    chat = f"{url}/v1/chat/completions"
    message = [{"role": "user", "content": "hi"}]
    return [
        ("bad temperature", {"url": chat, "headers": auth, "expect": 400,
                             "json": {"model": model, "messages": message, "temperature": -1}}),
        ("huge seed", {"url": chat, "headers": auth, "expect": 400,
                       "json": {"model": model, "messages": message, "seed": 2**70}}),
        ("invalid JSON", {"url": chat, "headers": auth, "expect": 400, "data": b"{not json"}),
        ("oversized body", {"url": chat, "headers": auth, "expect": 413, "data": b"x" * (limit + 1)}),
        ("no key", {"url": chat, "headers": {"Content-Type": "application/json"}, "expect": 401,
                    "json": {"model": model, "messages": message}}),
        ("unknown model", {"url": chat, "headers": auth, "expect": 404,
                           "json": {"model": "gpt-nothing", "messages": message}}),
    ]


class Soak:
    def __init__(self, url: str, key: str, admin_token: str, model: str, references: list[str],
                 max_request_bytes: int, seed: int) -> None:
        self.url, self.key, self.admin_token, self.model = url, key, admin_token, model
        self.references = references
        self.bad = bad_requests(url, key, model, max_request_bytes)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()  # (kind, outcome)
        self.unexpected: Counter = Counter()  # reason
        self.examples: list[str] = []  # the first few unexpected answers, for the report
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.events: list[str] = []
        self.kills: list[float] = []  # when a target replica was killed (monotonic seconds)
        self.replica_kills: list[str] = []

    # ---- one request of each kind -----------------------------------------------------------
    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}

    def _chat(self, prompt: str, **fields) -> requests.Response:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS}
        return requests.post(f"{self.url}/v1/chat/completions", json=body | fields, headers=self._headers(),
                             timeout=TIMEOUT_S, stream=fields.get("stream", False))

    def request(self, kind: str, rng: random.Random) -> str:
        """-> the outcome ("ok", "refused as expected", "cancelled"); raises Unexpected otherwise."""
        if kind == "greedy":
            index = rng.randrange(len(GREEDY_PROMPTS))
            answer = self._chat(GREEDY_PROMPTS[index], temperature=0)
            expect(answer, 200)
            if answer.json()["choices"][0]["message"]["content"] != self.references[index]:
                raise Unexpected("inexact answer", GREEDY_PROMPTS[index])
            return "ok"
        if kind == "sampled":
            answer = self._chat(rng.choice(GREEDY_PROMPTS), temperature=0.8, seed=rng.randrange(2**31))
            expect(answer, 200)
            return "ok"
        if kind == "stream":
            body = {"model": self.model, "prompt": rng.choice(GREEDY_PROMPTS), "max_tokens": MAX_TOKENS,
                    "stream": True, "stream_options": {"include_usage": True}}
            with requests.post(f"{self.url}/v1/completions", json=body, headers=self._headers(), timeout=TIMEOUT_S,
                               stream=True) as answer:
                expect(answer, 200)
                events = [line for line in answer.iter_lines() if line]
            errors = [e.decode(errors="replace") for e in events if b'"error"' in e]
            if events[-1] == b"data: [DONE]" and errors and REPLICA_UNAVAILABLE in errors[0]:
                raise Unexpected(REPLICA_LOST, errors[0][:200])
            if events[-1] != b"data: [DONE]" or errors:
                raise Unexpected("stream ended badly", events[-1][:200].decode(errors="replace"))
            return "ok"
        if kind == "cancel":
            with self._chat(rng.choice(GREEDY_PROMPTS), temperature=0, stream=True) as answer:
                expect(answer, 200)
                lines = answer.iter_lines()
                for _ in range(2):
                    next(lines)
            return "cancelled"  # the connection closes here, mid-stream
        name, call = rng.choice(self.bad)
        call = dict(call)
        status = call.pop("expect")
        answer = requests.post(**call, timeout=TIMEOUT_S)
        expect(answer, status, name)
        if "error" not in answer.json():
            raise Unexpected("error not in OpenAI's shape", name)
        return "refused as expected"

    def client(self, index: int, deadline: float) -> None:
        rng = random.Random(self.rng.random() + index)
        kinds, weights = list(KINDS), list(KINDS.values())
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            start = time.monotonic()
            try:
                outcome = self.request(kind, rng)
            except Unexpected as err:
                if err.reason == REPLICA_LOST and self.killed_during(start, time.monotonic()):
                    with self.lock:
                        self.outcomes[(kind, "lost with its killed replica")] += 1
                else:
                    self._unexpected(kind, err.reason, err.detail)
                continue
            except requests.Timeout as err:
                self._unexpected(kind, "timeout", repr(err))
                continue
            except (requests.ConnectionError, StopIteration) as err:
                self._unexpected(kind, "connection error", repr(err))
                continue
            with self.lock:
                self.outcomes[(kind, outcome)] += 1
                if outcome == "ok":
                    self.latency[kind].append(time.monotonic() - start)

    def _unexpected(self, kind: str, reason: str, detail: str) -> None:
        with self.lock:
            self.outcomes[(kind, "unexpected")] += 1
            self.unexpected[reason] += 1
            if len(self.examples) < 10:
                self.examples.append(f"{kind}: {reason}: {detail[:300]}")

    # ---- the pool changing under the load ----------------------------------------------------
    def admin(self, method: str, path: str, body: dict | None = None) -> int:
        answer = requests.request(method, f"{self.url}/admin{path}", json=body, timeout=TIMEOUT_S,
                                  headers={"Authorization": f"Bearer {self.admin_token}"})
        return answer.status_code

    def chaos(self, deadline: float, period_s: float) -> None:
        import ray

        from cluster.drafter_actor import named_drafters

        cycle = 0
        while time.monotonic() + period_s <= deadline:
            name = f"soak-{cycle}"
            # a CPU share makes it an actor of its own (a lookup asking nothing is hosted by the coordinator)
            added = self.admin('POST', '/drafters', {'name': name, 'kind': 'ngram', 'num_cpus': 0.1})
            self.events.append(f"add {name}: {added}")
            time.sleep(period_s / 3)
            ray.kill(named_drafters()[name], no_restart=False)
            self.events.append(f"kill {name}")
            time.sleep(period_s / 3)
            self.events.append(f"remove {name}: {self.admin('DELETE', f'/drafters/{name}')}")
            time.sleep(period_s / 3)
            cycle += 1


    def killed_during(self, sent: float, ended: float) -> bool:
        """Whether a replica was killed while this request ran, at most CLEAN_END_S before it ended
        (a request on the killed replica must end that soon after, cleanly)."""
        with self.lock:
            return any(sent <= kill <= ended <= kill + CLEAN_END_S for kill in self.kills)

    def kill_replicas(self, deadline: float, period_s: float) -> None:
        """Every period_s, the target replica started last is killed (Serve starts a replacement);
        the first replica (the keeper) lives throughout, so its memory covers every kill."""
        import ray

        from cluster.pool import REPLICA_PREFIX

        keeper = None
        while time.monotonic() + period_s <= deadline:
            time.sleep(period_s)
            replicas = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                              if a["name"].startswith(REPLICA_PREFIX))
            keeper = keeper or (replicas[0] if replicas else None)
            victims = [name for name in replicas if name != keeper]
            if not victims:
                self.replica_kills.append("no second replica running: the last kill's replacement did not start "
                                          "within the period")
                continue
            victim = victims[-1].rpartition("#")[2]  # Serve's replica id
            actor = replica_actor(victim)
            with self.lock:
                self.kills.append(time.monotonic())
            ray.kill(actor, no_restart=True)
            self.replica_kills.append(f"killed {victim}")


class Unexpected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def expect(answer: requests.Response, status: int, what: str = "") -> None:
    if answer.status_code == 503 and REPLICA_UNAVAILABLE in answer.text:
        raise Unexpected(REPLICA_LOST, f"{what} 503: {answer.text[:200]}")
    if answer.status_code != status:
        reason = "5xx" if answer.status_code >= 500 else "wrong status"
        raise Unexpected(reason, f"{what} {answer.status_code} (expected {status}): {answer.text[:200]}")


def service_processes() -> dict[str, int]:
    """{process name: pid} for the service's processes on this machine: each target replica (by its
    pid) and the front (Serve replicas, by their process title), the coordinator, and each standing
    drafter."""
    import psutil
    import ray

    from cluster.drafter_actor import named_drafters

    titles = {"SpecfleetServer": "target replica", "SpecfleetFront": "front", "CoordinatorActor": "coordinator"}
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        for title, name in titles.items():
            if line.startswith("ray::") and title in line:  # replicas come and go: each its own series
                found[f"{name} pid {process.pid}" if title == "SpecfleetServer" else name] = process.pid
    for name, handle in named_drafters().items():
        if not name.startswith("soak-"):  # the standing pool, not the drafters the chaos adds
            found[f"drafter {name}"] = ray.get(handle.placement.remote())["pid"]
    return found


def memory_mib(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    rss = {}
    for name, pid in pids.items():
        try:
            rss[name] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.Error:  # it exited (a restart): no sample
            pass
    return rss


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per hour."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [s for s, _ in samples], [m for _, m in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 3600 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def run(minutes: float, clients: int, seed: int, chaos_period_s: float = CHAOS_PERIOD_S, replicas: int = 1,
        replica_kill_period_s: float = REPLICA_KILL_PERIOD_S) -> dict:
    import ray

    from actors.models import load_causal_lm
    from actors.no_draft import NO_DRAFT
    from actors.pool import build_drafters
    from actors.sampling import SamplingParams
    from cluster.coordinator_actor import connect_coordinator
    from cluster.drafter_actor import named_drafters
    from deploy.config import ServiceConfig
    from deploy.engine.engine import SpeculativeEngine
    from deploy.engine.target import TargetModel
    from deploy.service.app import DEFAULT_CONFIG, load_serve_config, start_local_service, stop_local_service

    args = load_serve_config(DEFAULT_CONFIG)[0]
    args |= {"target": dict(args.get("target") or {}) | {"replicas": replicas}}
    config = ServiceConfig.model_validate(args)
    target = TargetModel(load_causal_lm(config.target.model, dtype=config.target.dtype))
    plain = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    references = [plain.generate(messages=[{"role": "user", "content": p}],
                                 sampling=SamplingParams(max_tokens=MAX_TOKENS)).text for p in GREEDY_PROMPTS]
    key, admin_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    os.environ.update({"SPECFLEET_API_KEYS": key, "SPECFLEET_ADMIN_TOKEN": admin_token})
    try:
        from deploy.bench.service import free_port

        url = start_local_service(args, port=free_port())
        soak = Soak(url, key, admin_token, config.model_name, references, config.max_request_bytes, seed)
        start = time.monotonic()
        deadline = start + 60 * minutes
        workers = [threading.Thread(target=soak.client, args=(i, deadline)) for i in range(clients)]
        saboteurs = [threading.Thread(target=soak.chaos, args=(deadline, chaos_period_s))]
        if replicas > 1:
            saboteurs.append(threading.Thread(target=soak.kill_replicas, args=(deadline, replica_kill_period_s)))
        for thread in [*workers, *saboteurs]:
            thread.start()
        pids = service_processes()
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        while time.monotonic() < deadline:
            now = time.monotonic() - start
            pids |= service_processes()  # a replacement replica joins; a dead one's series ends
            for name, mib in memory_mib(pids).items():
                series[name].append((now, mib))
            print(f"soak: {now / 60:5.1f} min, {sum(soak.outcomes.values())} requests, "
                  f"{sum(soak.unexpected.values())} unexpected", flush=True)
            time.sleep(min(SAMPLE_PERIOD_S, max(0.0, deadline - time.monotonic())))
        for thread in [*workers, *saboteurs]:
            thread.join()
        end = time.monotonic() - start
        for name, mib in memory_mib(pids).items():
            series[name].append((end, mib))
        coordinator = connect_coordinator()
        time.sleep(5)  # let cancelled requests' releases land
        stats = coordinator.stats(timeout=30)
        sessions = {name: ray.get(handle.open_sessions.remote()) for name, handle in named_drafters().items()}
        sessions |= {name: d["open_sessions"] for name, d in ray.get(coordinator.handle.hosted_drafters.remote()).items()}
        memory = {}
        for name, samples in series.items():  # warm-up from the process's first sample (a replacement's start)
            first, last = samples[0][0], samples[-1][0]
            warm = [s for s in samples if s[0] >= first + min(WARMUP_S, (last - first) / 2)]
            memory[name] = {"at_warmup_mib": round(warm[0][1], 1), "at_end_mib": round(warm[-1][1], 1),
                            "growth_mib": round(warm[-1][1] - warm[0][1], 1),
                            "slope_mib_per_hour": round(slope_per_hour(warm), 1)}
        latencies = {kind: {"n": len(v), "p50_s": round(percentile(v, 0.5), 3), "p99_s": round(percentile(v, 0.99), 3)}
                     for kind, v in sorted(soak.latency.items()) if v}
        return {
            "minutes": minutes, "clients": clients, "seed": seed, "kinds": KINDS, "max_tokens": MAX_TOKENS,
            "replicas": replicas, "replica_kill_period_s": replica_kill_period_s if replicas > 1 else None,
            "requests": sum(soak.outcomes.values()),
            "outcomes": {f"{kind}: {outcome}": n for (kind, outcome), n in sorted(soak.outcomes.items())},
            "unexpected": dict(soak.unexpected), "unexpected_examples": soak.examples,
            "latency": latencies, "chaos": soak.events, "replica_kills": soak.replica_kills, "memory": memory,
            "memory_bound_mib": MEMORY_BOUND_MIB,
            "left_open": {"coordinator_requests": stats["active_requests"], "down_arms": stats["down"],
                          "drafter_sessions": sessions},
        }
    finally:
        stop_local_service(args)


def verdict(report: dict) -> list[str]:
    """What failed the soak (empty: it passed)."""
    failed = [f"{n} unexpected ({reason})" for reason, n in report["unexpected"].items()]
    if report["left_open"]["coordinator_requests"]:
        failed.append(f"{report['left_open']['coordinator_requests']} coordinator requests left open")
    failed += [f"chaos: {event}" for event in report["chaos"]
               if ":" in event and event.rsplit(": ", 1)[1] not in ("200", "201")]
    failed += [f"replica kills: {event}" for event in report.get("replica_kills", []) if not event.startswith("killed")]
    if any(report["left_open"]["drafter_sessions"].values()):
        failed.append(f"drafter sessions left open: {report['left_open']['drafter_sessions']}")
    failed += [f"{name} grew {m['growth_mib']} MiB after warm-up" for name, m in report["memory"].items()
               if m["growth_mib"] > report["memory_bound_mib"] + TRIE_MIB * TRIES_HELD.get(name, 0)]
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chaos-period-s", type=float, default=CHAOS_PERIOD_S,
                        help="add, kill and remove a drafter once per period (default %(default)s s)")
    parser.add_argument("--replicas", type=int, default=1, help="target replicas (default %(default)s)")
    parser.add_argument("--replica-kill-period-s", type=float, default=REPLICA_KILL_PERIOD_S,
                        help="with several replicas, kill one this often (default %(default)s s)")
    parser.add_argument("--out", default="bench-out/soak.json")
    options = parser.parse_args(argv)
    if options.replicas < 1:
        parser.error("--replicas must be at least 1")
    report = run(options.minutes, options.clients, options.seed, options.chaos_period_s, options.replicas,
                 options.replica_kill_period_s)
    report["failed"] = verdict(report)
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("requests", "outcomes", "unexpected", "latency", "memory", "failed")},
                     indent=1))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
