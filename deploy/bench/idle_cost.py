"""What an idle service costs the target's forward on this machine.

`python -m deploy.bench.idle_cost [--rounds N] [--tokens T] [--compare] [--out FILE]` alternates,
N times: plain greedy decoding of a few prompts in a fresh process with no Ray up, then the same
with the local service (Ray, the drafter actors, the coordinator actor, the Serve replica and
proxies; the default config) started as `specfleet serve` starts it (a quiet Ray,
cluster/local.py) and left idle; with `--compare` also beside one on Ray's default settings.
The figure is the ratio of the decoding speeds (median over rounds; 1.0: the idle service costs
nothing). While the service idles, each process's CPU share and wakeups per second over
`--settle` seconds are sampled (psutil), so the report also says who spends it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

QUIET, RAY_DEFAULTS = "quiet", "ray-defaults"
PROMPTS = ("The history of the printing press begins", "def quicksort(items):\n",
           "Q: What is the capital of Japan?\nA:")


def decode_speed(tokens: int) -> float:
    """Plain greedy decoding of PROMPTS, `tokens` each, in this process. -> tokens per second."""
    from actors.models import load_causal_lm
    from deploy.engine.target import TargetModel

    target = TargetModel(load_causal_lm())
    target.forward(target.new_cache(), target.encode(prompt="Warm up the kernels."))
    produced, start = 0, time.perf_counter()
    for prompt in PROMPTS:
        cache = target.new_cache()
        logits = target.forward(cache, target.encode(prompt=prompt))
        for _ in range(tokens):
            logits = target.forward(cache, [int(logits[-1].argmax())])
            produced += 1
    return produced / (time.perf_counter() - start)


def _measure_in_fresh_process(tokens: int) -> float:
    done = subprocess.run([sys.executable, "-c", f"from deploy.bench.idle_cost import decode_speed; print(decode_speed({tokens}))"],
                          check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def cpu_by_process(seconds: float) -> dict[str, list[float]]:
    """Each process's [CPU share (1.0 = one core), wakeups per second (voluntary context
    switches of all its threads)] over `seconds`, by name, the busiest first."""
    import psutil

    processes, before = list(psutil.process_iter(["name", "cmdline"])), {}
    for process in processes:
        try:
            process.cpu_percent(None)
            before[process.pid] = process.num_ctx_switches().voluntary
        except psutil.Error:
            pass
    time.sleep(seconds)
    figures: dict[str, list[float]] = {}
    for process in processes:
        try:
            share = process.cpu_percent(None) / 100
            wakeups = (process.num_ctx_switches().voluntary - before[process.pid]) / seconds
            cmdline = process.info["cmdline"] or [process.info["name"]]
        except (psutil.Error, KeyError):
            continue
        name = next((part for part in cmdline if part.startswith("ray::")), process.info["name"])
        total = figures.setdefault(name, [0.0, 0.0])
        total[0] += share
        total[1] += wakeups
    return {name: [round(share, 3), round(wakeups)] for name, (share, wakeups)
            in sorted(figures.items(), key=lambda item: -item[1][0]) if share >= 0.005 or wakeups >= 5}


def measure(rounds: int, tokens: int, settle_s: float, modes: Sequence[str] = (QUIET,)) -> dict:
    """Per round: decoding with no Ray up, then beside an idle service in each of `modes`
    (QUIET: as specfleet starts it; RAY_DEFAULTS: Ray's own settings). -> the report."""
    without, idle, shares = [], {mode: [] for mode in modes}, {mode: [] for mode in modes}
    for _ in range(rounds):
        without.append(_measure_in_fresh_process(tokens))
        for mode in modes:
            with _idle_service(mode == QUIET):
                shares[mode].append(cpu_by_process(settle_s))
                idle[mode].append(_measure_in_fresh_process(tokens))
    report = {"tokens_per_s_without_ray": [round(v, 2) for v in without]}
    for mode in modes:
        ratio = statistics.median(i / w for i, w in zip(idle[mode], without))
        report[mode] = {"tokens_per_s_beside_an_idle_service": [round(v, 2) for v in idle[mode]],
                        "ratio_median": round(ratio, 4), "slowdown": round(1 - ratio, 4),
                        "idle_cpu_by_process": shares[mode]}
    return report


@contextmanager
def _idle_service(quiet: bool):
    """The default service on a fresh local Ray, quiet or with Ray's defaults (its environment too)."""
    from cluster.local import QUIET_ENV
    from deploy.bench.service import free_port
    from deploy.service.app import start_local_service, stop_local_service

    saved = {name: os.environ.pop(name) for name in QUIET_ENV if name in os.environ}
    try:
        start_local_service({}, port=free_port(), quiet_ray=quiet)
        try:
            yield
        finally:
            stop_local_service({})
    finally:
        for name in QUIET_ENV:
            os.environ.pop(name, None)
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="what an idle local service costs the target's forward")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of without / beside an idle service")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per prompt in each measurement")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds the service idles (CPU sampled) before measuring")
    parser.add_argument("--compare", action="store_true",
                        help="also measure beside a service on Ray's default settings (each round: without, quiet, defaults)")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    report = measure(args.rounds, args.tokens, args.settle, (QUIET, RAY_DEFAULTS) if args.compare else (QUIET,))
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
