"""`specfleet bench`: every run side by side on the same prompts, model and machine, in one process.

Runs (DESIGN.md §7): `ar` (plain target decoding), `single:<drafter>`, `policy:<name>`,
`serve:<name>` (the same policy through the HTTP service: Ray drafter actors, the coordinator
actor, the Serve replica; at most one per bench) and the computed `oracle` (per task, the best
measured single drafter). Prompts are interleaved: for each
prompt every run generates in turn, so machine noise hits all runs alike; each run keeps its own
fresh drafter pool (suffix caches learn only from that run's earlier prompts) and its own engine
(warm-start statistics). `lossless` compares every prompt's greedy token ids with `ar`.
"""
from __future__ import annotations

import fnmatch
import json
import socket
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from actors.no_draft import NO_DRAFT
from actors.pool import DEFAULT_DRAFTERS, build_drafters, parse_drafter_names
from deploy.engine import GenerationResult, SpeculativeEngine
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams
from deploy.target import TargetModel
from policy.registry import BASE_POLICY_NAMES, DEFAULT_POLICY, parse_policy

DEFAULT_PROMPTS = Path(__file__).parent / "prompts" / "mixed.jsonl"
DEFAULT_RUNS = f"ar,single:*,policy:{DEFAULT_POLICY},policy:metasd-ucb"


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    task: str
    messages: list[dict] | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class Sample:
    """One prompt's outcome in one run: what the report aggregates."""

    token_ids: list[int]
    seconds: float
    rounds: int
    per_drafter: dict
    coordinator_s: float  # the target's draft calls, round trip
    verify_s: float

    @classmethod
    def from_result(cls, result: GenerationResult, seconds: float) -> "Sample":
        s = result.summary
        return cls(result.token_ids, seconds, s["rounds"], s["per_drafter"], s["draft_s"], s["verify_s"])

    @classmethod
    def from_http(cls, body: dict, seconds: float) -> "Sample":
        metrics = body["metrics"]
        return cls(body["choices"][0]["token_ids"], seconds, metrics["timing"]["rounds"],
                   metrics["speculative_decoding"]["per_drafter"], metrics["timing"]["coordinator_s"],
                   metrics["timing"]["verify_s"])


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    items = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidRequestError("prompts", f"line {line_no}: not JSON ({err})") from err
        if not isinstance(row.get("id"), str) or not isinstance(row.get("task"), str):
            raise InvalidRequestError("prompts", f"line {line_no}: needs string fields id and task")
        if ("messages" in row) == ("prompt" in row):
            raise InvalidRequestError("prompts", f"line {line_no}: needs exactly one of messages or prompt")
        items.append(BenchPrompt(row["id"], row["task"], row.get("messages"), row.get("prompt")))
    if not items:
        raise InvalidRequestError("prompts", f"{path} holds no prompts")
    return items


def expand_runs(patterns: str | Sequence[str], drafters: Sequence[str]) -> list[str]:
    """Run names from a comma list with globs; `ar` always runs first (it is the baseline)."""
    items = [p.strip() for p in (patterns.split(",") if isinstance(patterns, str) else patterns) if p.strip()]
    known = ["ar"] + [f"single:{d}" for d in drafters if d != NO_DRAFT] + [f"policy:{p}" for p in BASE_POLICY_NAMES]
    runs = ["ar"]
    for pattern in items:
        matched = fnmatch.filter(known, pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not matched:
            raise InvalidRequestError("runs", f"{pattern!r} matches no run; known: {known}")
        for run in matched:
            if run.startswith("single:") and run.removeprefix("single:") not in drafters:
                raise InvalidRequestError("runs", f"{run!r}: drafter not in the pool {list(drafters)}")
            if run.startswith(("policy:", "serve:")):
                parse_policy(run.split(":", 1)[1], drafters)
            elif run != "ar" and not run.startswith("single:"):
                raise InvalidRequestError(
                    "runs", f"unknown run {run!r}; runs are ar, single:<drafter>, policy:<name>, serve:<name>")
            if run not in runs:
                runs.append(run)
    if sum(run.startswith("serve:") for run in runs) > 1:
        raise InvalidRequestError("runs", "at most one serve:<policy> run per bench (one coordinator per service)")
    if any(run.startswith("serve:") for run in runs) and "hf" in drafters:
        raise InvalidRequestError("runs", "serve runs support the model-free drafters only")
    return runs


def make_engine(run: str, target: TargetModel, drafters: Sequence[str], k: int, draft_model=None) -> SpeculativeEngine:
    vocab = target.vocab_size
    if run == "ar":
        return SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}", k=k)
    if run.startswith("single:"):
        name = run.removeprefix("single:")
        return SpeculativeEngine(target, build_drafters([name], draft_model, vocab), policy=f"fixed:{name}", k=k)
    return SpeculativeEngine(target, build_drafters(drafters, draft_model, vocab), policy=run.removeprefix("policy:"), k=k)


def _aggregate(samples: list[tuple[BenchPrompt, Sample]], ar_tps: float | None) -> dict:
    tokens = sum(len(x.token_ids) for _, x in samples)
    seconds = sum(x.seconds for _, x in samples)
    rounds = sum(x.rounds for _, x in samples)
    tps = tokens / seconds if seconds else 0.0
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tps, 3),
        "speedup_vs_ar": round(tps / ar_tps, 3) if ar_tps else 1.0,
        "mean_accepted_length": round(tokens / rounds, 3) if rounds else None,
    }


def _run_row(name: str, samples: list[tuple[BenchPrompt, Sample]], ar_ids: dict[str, list[int]], ar_row: dict | None) -> dict:
    is_ar = name == "ar"
    row = {"name": name, **_aggregate(samples, None if is_ar else ar_row["tokens_per_s"])}
    row["lossless"] = all(x.token_ids == ar_ids[p.id] for p, x in samples)
    if is_ar:
        row["mean_accepted_length"] = None
    row["per_task"] = {}
    for task in sorted({p.task for p, _ in samples}):
        agg = _aggregate([s for s in samples if s[0].task == task],
                         None if is_ar else ar_row["per_task"][task]["tokens_per_s"])
        if is_ar:
            agg["mean_accepted_length"] = None
        row["per_task"][task] = agg
    pulls: dict[str, int] = {}
    for _, x in samples:
        for drafter, stats in x.per_drafter.items():
            pulls[drafter] = pulls.get(drafter, 0) + stats["steps"]
    row["drafter_rounds"] = pulls
    rounds = sum(x.rounds for _, x in samples)
    coordinator_s = sum(x.coordinator_s for _, x in samples)
    verify_s = sum(x.verify_s for _, x in samples)
    if rounds and not is_ar:  # what one round's draft call costs, and its share of the round
        row["draft_ms_per_round"] = round(1000 * coordinator_s / rounds, 3)
        row["draft_share_of_round"] = round(coordinator_s / (coordinator_s + verify_s), 4)
    return row


def _oracle_row(rows: list[dict]) -> dict | None:
    singles = [r for r in rows if r["name"].startswith("single:")]
    if not singles:
        return None
    ar = rows[0]
    per_task, tokens, seconds, chosen = {}, 0, 0.0, {}
    for task in ar["per_task"]:
        best = max(singles, key=lambda r: r["per_task"][task]["tokens_per_s"])
        per_task[task] = dict(best["per_task"][task])
        chosen[task] = best["name"]
        tokens += per_task[task]["tokens"]
        seconds += per_task[task]["seconds"]
    tps = tokens / seconds if seconds else 0.0
    return {
        "name": "oracle", "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tps, 3),
        "speedup_vs_ar": round(tps / ar["tokens_per_s"], 3),
        "lossless": all(r["lossless"] for r in singles), "mean_accepted_length": None,
        "per_task": per_task, "chosen": chosen,
    }


def run_bench(
    target: TargetModel,
    prompts: Sequence[BenchPrompt],
    runs: str | Sequence[str] = DEFAULT_RUNS,
    max_tokens: int = 128,
    k: int = 7,
    drafters: str | Sequence[str] = DEFAULT_DRAFTERS,
    draft_model=None,
    progress: bool = True,
) -> dict:
    from tqdm import tqdm

    drafter_names = parse_drafter_names(drafters)
    run_names = expand_runs(runs, drafter_names)
    engines = {run: make_engine(run, target, drafter_names, k, draft_model)
               for run in run_names if not run.startswith("serve:")}
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    engines["ar"].generate(prompt="Warm up the kernels.", sampling=SamplingParams(max_tokens=8))
    service = _ServiceRun(next((r for r in run_names if r.startswith("serve:")), None), drafter_names, k, target.name)
    results: dict[str, list[tuple[BenchPrompt, Sample]]] = {run: [] for run in run_names}
    bar = tqdm(total=len(prompts) * len(run_names), desc="bench", unit="gen", disable=not progress)
    try:
        for item in prompts:
            for run in run_names:
                bar.set_postfix_str(f"{item.id} {run}")
                if run.startswith("serve:"):
                    sample = service.generate(item, max_tokens)
                else:
                    start = time.perf_counter()
                    result = engines[run].generate(prompt=item.prompt, messages=item.messages, sampling=sampling)
                    sample = Sample.from_result(result, time.perf_counter() - start)
                results[run].append((item, sample))
                bar.update(1)
    finally:
        bar.close()
        service.stop()
    ar_ids = {p.id: x.token_ids for p, x in results["ar"]}
    rows: list[dict] = []
    for run in run_names:
        rows.append(_run_row(run, results[run], ar_ids, rows[0] if rows else None))
    oracle = _oracle_row(rows)
    if oracle:
        rows.append(oracle)
    return {
        "model": target.name,
        "params": {"max_tokens": max_tokens, "temperature": 0.0, "k": k, "drafters": list(drafter_names),
                   "prompts": len(prompts)},
        "runs": rows,
    }


class _ServiceRun:
    """A `serve:<policy>` run: the local HTTP service (Ray actors + Serve) fed one prompt at a time."""

    def __init__(self, run: str | None, drafters: Sequence[str], k: int, model: str) -> None:
        self.url = None
        if run is None:
            return
        from deploy.app import start_local_service

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.model = model
        self.args = {"target": {"model": model}, "policy": run.removeprefix("serve:"), "k": k,
                     "drafters": [{"name": d, "kind": d} for d in drafters]}
        self.url = start_local_service(self.args, port=port)
        self._post("/v1/completions", {"prompt": "Warm up.", "max_tokens": 4})

    def _post(self, path: str, body: dict) -> dict:
        body = {"model": self.model, "temperature": 0.0, "return_token_ids": True, **body}
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        start = time.perf_counter()
        if item.messages is not None:
            body = self._post("/v1/chat/completions", {"messages": item.messages, "max_tokens": max_tokens})
        else:
            body = self._post("/v1/completions", {"prompt": item.prompt, "max_tokens": max_tokens})
        return Sample.from_http(body, time.perf_counter() - start)

    def stop(self) -> None:
        if self.url is not None:
            from deploy.app import stop_local_service

            stop_local_service(self.args)
            self.url = None


def render_table(report: dict) -> str:
    """A Markdown table: overall and per-task speedup vs ar for every run."""
    tasks = list(report["runs"][0]["per_task"])
    head = "| run | tok/s | speedup | lossless | mean acc. len | " + " | ".join(tasks) + " |"
    sep = "|" + "---|" * (5 + len(tasks))
    lines = [head, sep]
    for row in report["runs"]:
        mal = "" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
        cells = " | ".join(f"{row['per_task'][t]['speedup_vs_ar']:.2f}x" for t in tasks)
        lines.append(f"| {row['name']} | {row['tokens_per_s']:.1f} | {row['speedup_vs_ar']:.2f}x | "
                     f"{'yes' if row['lossless'] else 'NO'} | {mal} | {cells} |")
    return "\n".join(lines)
