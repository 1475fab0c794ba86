"""`batch:<policy>[@<verify>]` runs: the engine's continuous-batching scheduler
(deploy/engine/scheduler.py) in a process of its own, no Ray, fed by client threads, so that the
engine's speed under load shows apart from the service's overhead (`serve:` runs the same
scheduler behind Ray Serve).

At concurrency c, c client threads each submit a request and wait for its result; the run's
tokens/s is throughput (all tokens over the wall time), each sample's seconds that request's
latency and `first_token_s` the time to its first emitted tokens; `load` after a sweep is the
engine's report per batch size (acceptance calibration, the guard). Every level runs in a fresh
subprocess (this module's `main`): a fresh pool (empty suffix caches, no bandit
statistics), and the scheduler's thread the only one of the process that ever ran torch (a
second thread running torch makes torch's OpenMP runtime throttle its threads: see
deploy/engine/scheduler.py), as in a server. The process leaves without teardown once its answer
is written (`os._exit`); a process that fails says so, and whether its answer was written.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from deploy.bench.prompts import BenchPrompt
from deploy.bench.sample import Sample


class BatchRun:
    def __init__(self, label: str, model: str, drafters: Sequence[str], k: int, cut_drafts: bool = True) -> None:
        """label: `<policy>[@<verify>][-without-<drafters>]`, as a `policy:` run's."""
        self.label, self.model, self.drafters, self.k, self.cut_drafts = label, model, list(drafters), k, cut_drafts
        self.load: dict = {}  # the last sweep's engine load report (SpeculativeEngine.load_report)

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        return self.sweep([item], max_tokens, 1)[0][0]

    def sweep(self, prompts: Sequence[BenchPrompt], max_tokens: int, concurrency: int) -> tuple[list[Sample], float]:
        """Every prompt through `concurrency` client threads, in a fresh process. -> (samples in prompt order, wall seconds)."""
        with tempfile.TemporaryDirectory() as work:
            job, out = Path(work) / "job.json", Path(work) / "out.json"
            job.write_text(json.dumps({"label": self.label, "model": self.model, "drafters": self.drafters, "k": self.k,
                                       "cut_drafts": self.cut_drafts, "max_tokens": max_tokens, "concurrency": concurrency,
                                       "prompts": [asdict(p) for p in prompts]}))
            done = subprocess.run([sys.executable, "-c", "from deploy.bench.batch_run import main; main()", str(job), str(out)])
            if done.returncode != 0:
                written = out.exists() and out.stat().st_size > 0
                raise RuntimeError(f"the batch run's process (concurrency {concurrency}) ended with status "
                                   f"{done.returncode}; its answer {'was' if written else 'was not'} written")
            answer = json.loads(out.read_text())
        samples = [Sample(**(s | {"trace": tuple(tuple(r) for r in s["trace"])})) for s in answer["samples"]]
        self.load = answer.get("load", {})
        return samples, answer["wall_s"]


def sweep_here(job: dict) -> dict:
    """The sweep a `BatchRun` asks for, run in this process. -> {"samples": [...], "wall_s": ...}."""
    from actors.models import load_causal_lm
    from actors.sampling import SamplingParams
    from deploy.bench.engines import make_engine
    from deploy.engine.scheduler import BatchScheduler
    from deploy.engine.target import TargetModel

    def build():
        target = TargetModel(load_causal_lm(job["model"]))
        return make_engine(f"policy:{job['label']}", target, job["drafters"], job["k"], cut_drafts=job["cut_drafts"])

    scheduler = BatchScheduler(build, max_batch=job["concurrency"])
    target = scheduler.target
    prompts = [BenchPrompt(**p) for p in job["prompts"]]
    encoded = [target.encode(prompt=p.prompt, messages=p.messages) for p in prompts]
    greedy = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0)
    scheduler.run(target.encode(prompt="Warm up the kernels."), SamplingParams(max_tokens=8))

    def one(ids: list[int]) -> Sample:
        start = time.perf_counter()
        first: list[float] = []  # on_tokens runs in the scheduler's one thread

        def on_tokens(tokens: list[int]) -> None:
            if not first:
                first.append(time.perf_counter() - start)

        result = scheduler.run(ids, greedy, on_tokens)
        return replace(Sample.from_result(result, time.perf_counter() - start), first_token_s=first[0] if first else None)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=job["concurrency"]) as clients:
        samples = list(clients.map(one, encoded))
    wall_s = time.perf_counter() - start
    return {"samples": [asdict(s) for s in samples], "wall_s": wall_s, "load": scheduler.engine.load_report()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one level of a bench `batch:` run (deploy/bench/batch_run.py)")
    parser.add_argument("job", help="the sweep as JSON (written by BatchRun.sweep)")
    parser.add_argument("out", help="where the samples go, as JSON")
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(sweep_here(json.loads(Path(args.job).read_text()))))
    # the answer is written: leave without the interpreter's and the C++ libraries' teardown. The scheduler's
    # daemon thread still holds torch's thread pools; tearing them down at exit aborted this process once in a
    # test run (SIGABRT, "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
