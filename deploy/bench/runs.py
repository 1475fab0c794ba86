"""`specfleet bench`: every run side by side on the same prompts, model and machine, in one process.

Runs (docs/design.md): `ar` (plain target decoding, always first: the baseline), `peer:<name>`
(Hugging Face transformers' own decoding, deploy/bench/peers.py), `single:<drafter>`,
`policy:<name>[@<verify>]`, `batch:<name>[@<verify>]` (the same policy on the engine's batch
scheduler in a process of its own, no Ray: deploy/bench/batch_run.py), `serve:<name>[@<verify>]`
(the same policy through the HTTP service, deploy/bench/service.py) and the computed `oracle`
(per task, the best measured single drafter).

Two phases. First the in-process runs one request at a time, with no Ray cluster up (as a user
runs them), prompts interleaved: for each prompt every run generates in turn, so machine noise
hits all runs alike; each run keeps its own fresh drafter pool (suffix caches learn only from
that run's earlier prompts) and its own engine. Then the sweeps, at every concurrency level:
per level, each `serve:` run on a fresh service, each `batch:` run in a fresh process, then each
batching peer (`peer:hf-batch` also runs in the first phase; `peer:hf-cb` only here), `repeat`
times, alternated on request. A swept run's row is `<run>@c<level>` (its repetitions' medians),
and the summary's `under_load` its ratios against drafting off and `peer:hf-batch`.
"""
from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.pool import DEFAULT_DRAFTERS, parse_drafter_names
from actors.sampling import SamplingParams
from deploy.bench.batch_run import BatchRun
from deploy.bench.cost_profile import CostProfile
from deploy.bench.engines import make_engine
from deploy.bench.load_report import swept_row, sweep_ratios
from deploy.bench.peers import SWEPT_ONLY, SWEPT_PEERS, HFBatchPeer, HFContinuousPeer, HFPeer, HFServePeer, available_peers
from deploy.bench.prompts import BenchPrompt
from deploy.bench.report import Samples, oracle_row, run_row, summarize
from deploy.bench.sample import Sample
from deploy.bench.service import ServiceRun
from deploy.engine.defaults import K
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.target import TargetModel
from policy.registry import BASE_POLICY_NAMES, DEFAULT_POLICY, DEFAULT_VERIFY, parse_policy, run_drafters, split_run_policy

DEFAULT_RUNS = f"ar,peer:*,single:*,policy:{DEFAULT_POLICY}@{DEFAULT_VERIFY},policy:metasd-ucb-cost,policy:metasd-ucb,policy:thompson"
MAX_CONCURRENCY = 64
MAX_REPEAT = 9


def expand_runs(patterns: str | Sequence[str], drafters: Sequence[str], has_draft_model: bool = False) -> list[str]:
    """Run names from a comma list with globs; `ar` always runs first (it is the baseline)."""
    items = [p.strip() for p in (patterns.split(",") if isinstance(patterns, str) else patterns) if p.strip()]
    known = (["ar"] + [f"peer:{p}" for p in available_peers(has_draft_model)]
             + [f"single:{d}" for d in drafters if d != NO_DRAFT] + [f"policy:{p}" for p in BASE_POLICY_NAMES])
    runs = ["ar"]
    for pattern in items:
        matched = fnmatch.filter(known, pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not matched:
            raise InvalidRequestError("runs", f"{pattern!r} matches no run; known: {known}")
        for run in matched:
            kind, _, name = run.partition(":")
            if kind == "single" and name not in drafters:
                raise InvalidRequestError("runs", f"{run!r}: drafter not in the pool {list(drafters)}")
            if kind == "peer" and name not in available_peers(has_draft_model):
                raise InvalidRequestError("runs", f"{run!r}: known peers here are {available_peers(has_draft_model)}"
                                                  " (hf-assistant needs --draft-model)")
            if kind in ("policy", "serve", "batch"):
                policy, verify = split_run_policy(name)
                parse_policy(policy, run_drafters(name, drafters), verify)
            elif run != "ar" and kind not in ("single", "peer"):
                raise InvalidRequestError("runs", f"unknown run {run!r}; runs are ar, peer:<name>, single:<drafter>, "
                                                  "policy:<name>, batch:<name>, serve:<name>")
            if run not in runs:
                runs.append(run)
    if any(run.startswith(("serve:", "batch:")) for run in runs) and "hf" in drafters:
        raise InvalidRequestError("runs", "serve and batch runs support the model-free drafters only")
    return runs


def parse_concurrency(levels: str | Sequence[int]) -> tuple[int, ...]:
    items = levels.split(",") if isinstance(levels, str) else list(levels)
    try:
        values = tuple(sorted({int(x) for x in items if str(x).strip()}))
    except ValueError as err:
        raise InvalidRequestError("concurrency", f"must be a comma list of integers, got {levels!r}") from err
    if not values or not all(1 <= v <= MAX_CONCURRENCY for v in values):
        raise InvalidRequestError("concurrency", f"each level must be in 1..{MAX_CONCURRENCY}, got {levels!r}")
    return values


def sweep_order(levels: Sequence[int], swept: Sequence[str], in_process: Sequence[str], repeat: int = 1,
                alternate: bool = False) -> list[tuple[int, str]]:
    """(level, run) in the order the sweeps run: per level, every swept run `repeat` times (every
    other repetition reversed when `alternate`); a run measured in process skips level 1."""
    order = []
    for level in levels:
        here = [run for run in swept if level > 1 or run not in in_process]
        for repetition in range(repeat):
            order += [(level, run) for run in (here[::-1] if alternate and repetition % 2 else here)]
    return order


def run_bench(
    target: TargetModel,
    prompts: Sequence[BenchPrompt],
    runs: str | Sequence[str] = DEFAULT_RUNS,
    max_tokens: int = 128,
    k: int = K,
    drafters: str | Sequence[str] = DEFAULT_DRAFTERS,
    draft_model=None,
    progress: bool = True,
    concurrency: str | Sequence[int] = (1,),
    trace_prompt: str | None = None,
    cost_profile: str | None = None,
    cut_drafts: bool = True,
    tree_budget: int | None = None,
    repeat: int = 1,
    alternate: bool = False,
) -> dict:
    """repeat: each level's swept runs run this many times (a row: their medians, deploy/bench/load_report.py);
    alternate: every other repetition runs them in reverse order (A B, B A, ...), so drift hits all alike."""
    from tqdm import tqdm

    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise InvalidRequestError("repeat", f"must be an integer in 1..{MAX_REPEAT}, got {repeat!r}")
    drafter_names = parse_drafter_names(drafters)
    profile = CostProfile.load(cost_profile) if cost_profile else None
    run_names = expand_runs(runs, drafter_names, draft_model is not None)
    levels = parse_concurrency(concurrency)
    trace_id = trace_prompt or prompts[0].id
    if trace_id not in {p.id for p in prompts}:
        raise InvalidRequestError("trace_prompt", f"no prompt with id {trace_id!r}")
    serve_runs = [r for r in run_names if r.startswith("serve:")]
    batch_runs = [r for r in run_names if r.startswith("batch:")]
    swept_only = [run for run in run_names if run.removeprefix("peer:") in SWEPT_ONLY]
    for run in serve_runs + batch_runs + swept_only:
        run_names.remove(run)  # swept only: after the in-process phase, at every level
    generators, swept_peers = {}, {}
    draft_scale = 1.0  # a model drafter's drafting seconds here -> on the profile's device
    for run in run_names + swept_only:
        if run.removeprefix("peer:") in SWEPT_PEERS:
            swept_peers[run] = {"peer:hf-cb": HFContinuousPeer, "peer:hf-serve": HFServePeer}.get(run, HFBatchPeer)(target)
            generators[run] = swept_peers[run].generate
        elif run.startswith("peer:"):
            generators[run] = HFPeer(run.removeprefix("peer:"), target, draft_model).generate
        else:
            engine = make_engine(run, target, drafter_names, k, draft_model, cut_drafts, profile, tree_budget)
            if profile is not None and run != "ar":  # ar runs without the profile
                draft_scale = engine.costs.draft_scale
            generators[run] = _engine_generator(engine, profile)
    generators["ar"](BenchPrompt("warmup", "warmup", prompt="Warm up the kernels."), 8)
    services = {run: ServiceRun.configure(run.removeprefix("serve:"), drafter_names, k, target.name)
                for run in serve_runs}
    batches = {run: BatchRun(run.removeprefix("batch:"), target.name, drafter_names, k, cut_drafts) for run in batch_runs}
    results: dict[str, Samples] = {run: [] for run in run_names}
    sweeps = sweep_order(levels, serve_runs + batch_runs + list(swept_peers), run_names, repeat, alternate)
    bar = tqdm(total=len(prompts) * (len(run_names) + len(sweeps)), desc="bench", unit="gen", disable=not progress)
    swept: dict[tuple[str, int], list[tuple[Samples, float, dict]]] = {}  # (run, level) -> its repetitions
    try:
        for item in prompts:
            for run in run_names:
                bar.set_postfix_str(f"{item.id} {run}")
                results[run].append((item, generators[run](item, max_tokens)))
                bar.update(1)
        if "peer:hf-serve" in swept_peers and "ar" in results:  # it answers text: ar's ids stand for an equal text
            swept_peers["peer:hf-serve"].reference = {item.id: sample.token_ids for item, sample in results["ar"]}
        for level, run in sweeps:  # each level: every service (restarted, then stopped), batch process, batching peer
            bar.set_postfix_str(f"{run} at concurrency {level}")
            runner = services.get(run) or batches.get(run) or swept_peers[run]
            samples, wall_s = runner.sweep(list(prompts), max_tokens, level)
            if run in services:
                services[run].stop()
            swept.setdefault((run, level), []).append((list(zip(prompts, samples)), wall_s, getattr(runner, "load", {})))
            bar.update(len(prompts))
    finally:
        bar.close()
        for service in services.values():
            service.stop()
    ar_ids = {p.id: x.token_ids for p, x in results["ar"]}
    rows = [run_row("ar", results["ar"], ar_ids, None)]
    rows += [run_row(run, results[run], ar_ids, rows[0]) for run in run_names[1:]]
    rows += [swept_row(f"{run}@c{level}", repetitions, ar_ids, rows[0], level)
             for (run, level), repetitions in sorted(swept.items(), key=lambda item: (item[0][1], item[0][0]))]
    oracle = oracle_row(rows)
    if oracle:
        rows.append(oracle)
    summary = summarize(rows)
    if ratios := sweep_ratios(rows):
        summary["under_load"] = ratios
    traced = next(p for p in prompts if p.id == trace_id)
    eagle = eagle_head_params(target.name, list(ar_ids.values())) if "eagle" in drafter_names else {}
    return {
        "model": target.name,
        "params": {"max_tokens": max_tokens, "temperature": 0.0, "k": k, "drafters": list(drafter_names),
                   "prompts": len(prompts), "splits": sorted({p.split for p in prompts}),
                   "concurrency": list(levels) if sweeps else [1], "cut_drafts": cut_drafts,
                   **({"repeat": repeat, "alternate": alternate} if sweeps and repeat > 1 else {}),
                   **({"tree_budget": tree_budget} if tree_budget is not None else {}),
                   **({"cost_profile": {"file": str(cost_profile), "device": profile.device,
                                        "plain_step_s": profile.plain_step_s, "draft_scale": round(draft_scale, 4)}}
                      if profile else {}), **eagle},
        "runs": rows,
        "summary": summary,
        "trace": {"prompt": trace_id, "task": traced.task,
                  "runs": {run: [list(r) for r in x.trace] for run in run_names if run.startswith("policy:")
                           for p, x in results[run] if p.id == trace_id}},
    }


def eagle_head_params(target: str, outputs: list[list[int]]) -> dict:
    """The eagle head the pool loaded (as the pool finds it) and its vocabulary's share of plain decoding's tokens."""
    from actors.eagle_head import find_head, saved_head_ids

    path = find_head(target)
    if path is None:
        return {}
    vocabulary = set(saved_head_ids(path).tolist())
    tokens = [t for output in outputs for t in output]
    return {"eagle_head": {"path": str(path), "vocabulary": len(vocabulary),
                           "vocabulary_coverage": round(sum(t in vocabulary for t in tokens) / max(len(tokens), 1), 4)}}


def _engine_generator(engine: SpeculativeEngine, profile: CostProfile | None = None):
    def generate(item: BenchPrompt, max_tokens: int) -> Sample:
        start = time.perf_counter()
        result = engine.generate(prompt=item.prompt, messages=item.messages,
                                 sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
        return Sample.from_result(result, time.perf_counter() - start, profile)

    return generate
