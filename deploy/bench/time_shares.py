"""Where one served request's time goes: the same requests, one client at a time, three ways.

    python -m deploy.bench.time_shares --prompts deploy/prompts/mixed_test.jsonl --limit 8

runs, each in a process of its own (torch's OpenMP threads slow down for good once a second
thread of a process has run torch: deploy/engine/scheduler.py):

    in-process   the batch scheduler in this process, no Ray running
    beside       the same, while an idle service (Ray, Serve, the coordinator) runs beside it
    service      the service over HTTP, streamed (the bench's `serve:` requests)

and prints, per speculative round, the wall time and its parts as each request's own metrics
give them: the target's forwards, the coordinator call (selection and drafting, in process or
through Ray) and the rest (prefill, emitting; for the service, the HTTP and Serve hops). The
forward's growth from in-process to beside is what the idle cluster costs the target on a
machine whose cores it shares; the coordinator call's growth from beside to service is the
Ray round trip; the rest's growth, the front and proxy hops. Greedy, `--max-tokens` 128, the
default policy and pool unless given. docs/design.md ("Where a served request's time goes")
quotes its figures.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass

from actors.pool import DEFAULT_DRAFTERS
from actors.sampling import SamplingParams
from deploy.bench.prompts import BenchPrompt, load_prompts
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY

WAYS = ("in-process", "beside", "service")


@dataclass
class Shares:
    tokens: int = 0
    rounds: int = 0
    seconds: float = 0.0
    forward_s: float = 0.0
    coordinator_s: float = 0.0

    def add(self, tokens: int, rounds: int, seconds: float, forward_s: float, coordinator_s: float) -> None:
        self.tokens += tokens
        self.rounds += rounds
        self.seconds += seconds
        self.forward_s += forward_s
        self.coordinator_s += coordinator_s

    def line(self, way: str) -> str:
        per_round = 1e3 / max(self.rounds, 1)
        rest = self.seconds - self.forward_s - self.coordinator_s
        return (f"| {way} | {self.tokens / self.seconds:.1f} | {self.rounds} | {self.seconds * per_round:.1f} | "
                f"{self.forward_s * per_round:.1f} | {self.coordinator_s * per_round:.1f} | {rest * per_round:.1f} |")


def in_process(prompts: list[BenchPrompt], label: str, max_tokens: int) -> Shares:
    """The batch scheduler, one request at a time; its thread builds the target and the engine."""
    from actors.models import load_causal_lm
    from deploy.bench.engines import make_engine
    from deploy.engine.scheduler import BatchScheduler
    from deploy.engine.target import TargetModel

    built = {}

    def build():
        built["target"] = TargetModel(load_causal_lm("smollm2-135m"))
        return make_engine(f"policy:{label}", built["target"], DEFAULT_DRAFTERS, 7)

    scheduler = BatchScheduler(build)
    target, shares = built["target"], Shares()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    scheduler.run(target.encode(prompt="Warm up."), SamplingParams(max_tokens=4, temperature=0.0))
    for item in prompts:
        start = time.perf_counter()
        result = scheduler.run(target.encode(prompt=item.prompt, messages=item.messages), sampling)
        summary = result.summary
        shares.add(len(result.token_ids), summary["rounds"], time.perf_counter() - start, summary["verify_s"],
                   summary["draft_s"])
    return shares


def measure(way: str, prompts: list[BenchPrompt], label: str, max_tokens: int) -> Shares:
    if way == "in-process":
        return in_process(prompts, label, max_tokens)
    from deploy.bench.service import ServiceRun

    service = ServiceRun.configure(label, DEFAULT_DRAFTERS, 7, "smollm2-135m")
    service.restart()
    try:
        if way == "beside":
            return in_process(prompts, label, max_tokens)
        shares = Shares()
        for item in prompts:
            sample = service.generate(item, max_tokens)
            shares.add(len(sample.token_ids), sample.rounds, sample.seconds, sample.verify_s, sample.coordinator_s)
        return shares
    finally:
        service.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--policy", default=f"{DEFAULT_POLICY}@{DEFAULT_VERIFY}")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"some of {','.join(WAYS)}")
    parser.add_argument("--way", default=None, help=argparse.SUPPRESS)  # one way, in this process
    args = parser.parse_args(argv)
    prompts = load_prompts(args.prompts)[: args.limit]
    if args.way is not None:
        print(measure(args.way, prompts, args.policy, args.max_tokens).line(args.way), flush=True)
        return
    print("| way | tok/s | rounds | ms per round | forward | coordinator call | rest |\n|---|---|---|---|---|---|---|")
    for way in args.ways.split(","):
        if way not in WAYS:
            parser.error(f"--ways: {way!r} is not one of {list(WAYS)}")
        done = subprocess.run([sys.executable, "-m", "deploy.bench.time_shares", *(argv or sys.argv[1:]), "--way", way],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
