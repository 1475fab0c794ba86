"""Bench shards -> one report, as if the shards had run as one bench.

A bench too long for one sitting runs in shards over disjoint tasks of one prompt set (`specfleet
bench --tasks code,math ...`, then `--tasks qa,chat ...`), each shard interleaving its runs prompt
by prompt as a whole bench does. `merge_reports(shards)` joins their in-process rows (`ar`,
`single:`, `policy:`, the in-process peers): each run's samples and per-task figures side by side,
its totals, its speed against the merged `ar`, its rounds and drafting figures recomputed; then the
`oracle` row and the summary (best single drafter, per-task oracle, bootstrap intervals, regret)
again over every task. A task's figures come from one shard, so each still compares runs that ran
side by side; only the totals add shards measured at different times.

Not merged: swept rows (`serve:`, `batch:`, batching peers at a concurrency: their figure is a
level's wall clock), acceptance by draft position (its counts are not in the report) and profiled
figures. Shards must agree on the model, the generation settings and the in-process runs, and
cover disjoint tasks; otherwise `InvalidRequestError` names what differs.

    python -m deploy.bench.merge bench-out/a.json bench-out/b.json --out bench-out/all.json
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from actors.errors import InvalidRequestError
from deploy.bench.report import oracle_row, render_table, summarize

SHARED_PARAMS = ("max_tokens", "temperature", "k", "drafters", "cut_drafts", "tree_budget")


def _in_process(report: dict) -> list[dict]:
    return [row for row in report["runs"] if "concurrency" not in row and row["name"] != "oracle"]


def _check_shards(reports: Sequence[dict]) -> list[str]:
    """The shared in-process run names, or an error naming the field the shards differ in."""
    if len(reports) < 2:
        raise InvalidRequestError("reports", f"merging needs at least two bench reports, got {len(reports)}")
    first = reports[0]
    names = [row["name"] for row in _in_process(first)]
    if not names or names[0] != "ar":
        raise InvalidRequestError("runs", "each shard must have run `ar` first (the baseline every ratio needs)")
    seen: set[str] = set()
    for i, report in enumerate(reports):
        rows = _in_process(report)
        if report["model"] != first["model"]:
            raise InvalidRequestError("model", f"shard {i} ran {report['model']!r}, shard 0 {first['model']!r}")
        for key in SHARED_PARAMS:
            if report["params"].get(key) != first["params"].get(key):
                raise InvalidRequestError(key, f"shard {i} ran with {report['params'].get(key)!r}, "
                                               f"shard 0 with {first['params'].get(key)!r}")
        if [row["name"] for row in rows] != names:
            raise InvalidRequestError("runs", f"shard {i} ran other in-process runs than shard 0")
        tasks = set(rows[0]["per_task"])
        if overlap := tasks & seen:
            raise InvalidRequestError("tasks", f"shard {i} repeats task(s) {sorted(overlap)}: shards must cover disjoint tasks")
        seen |= tasks
    return names


def _drafting(part: dict) -> tuple[float, float, float, float]:
    """(rounds, drafting seconds, verifying seconds, drafted tokens) behind one shard's row."""
    mal, dmr, share, dmt = (part.get(k) for k in ("mean_accepted_length", "draft_ms_per_round",
                                                   "draft_share_of_round", "draft_ms_per_token"))
    rounds = part["tokens"] / mal if mal else 0.0
    drafting = (dmr or 0.0) * rounds / 1000
    verifying = drafting * (1 / share - 1) if share else 0.0
    drafted = 1000 * drafting / dmt if dmt else 0.0
    return rounds, drafting, verifying, drafted


def _merge_row(parts: Sequence[dict], ar: dict | None) -> dict:
    """One run's rows from every shard -> its row over all their prompts (ar: the merged baseline)."""
    tokens = sum(p["tokens"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    tps = tokens / seconds if seconds else 0.0
    samples = [s for p in parts for s in p["samples"]]
    latencies = [s[3] for s in samples]
    row = {"name": parts[0]["name"], "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tps, 3),
           "speedup_vs_ar": round(tps / ar["tokens_per_s"], 3) if ar else 1.0,
           "lossless": all(p["lossless"] for p in parts), "samples": samples,
           "latency_p50_s": round(float(np.percentile(latencies, 50)), 3),
           "latency_p99_s": round(float(np.percentile(latencies, 99)), 3),
           "per_task": {task: figures for p in parts for task, figures in p["per_task"].items()}}
    rounds, drafting, verifying, drafted = (sum(x) for x in zip(*(_drafting(p) for p in parts)))
    row["mean_accepted_length"] = round(tokens / rounds, 3) if ar and rounds else None
    row["drafter_rounds"] = {}
    for p in parts:
        for drafter, count in p.get("drafter_rounds", {}).items():
            row["drafter_rounds"][drafter] = row["drafter_rounds"].get(drafter, 0) + count
    if all("prompt_rounds" in p for p in parts):
        row["prompt_rounds"] = {prompt: counts for p in parts for prompt, counts in p["prompt_rounds"].items()}
    if ar and rounds and drafting + verifying > 0:
        row["draft_ms_per_round"] = round(1000 * drafting / rounds, 3)
        row["draft_share_of_round"] = round(drafting / (drafting + verifying), 4)
        row["draft_ms_per_token"] = round(1000 * drafting / drafted, 3) if drafted else None
    return row


def merge_reports(reports: Sequence[dict]) -> dict:
    """Shards of one bench over disjoint tasks -> one report (the module docstring says what is merged)."""
    names = _check_shards(reports)
    shards = [{row["name"]: row for row in _in_process(report)} for report in reports]
    rows: list[dict] = []
    for name in names:
        rows.append(_merge_row([shard[name] for shard in shards], rows[0] if rows else None))
    if oracle := oracle_row(rows):
        rows.append(oracle)
    params = {key: value for key, value in reports[0]["params"].items() if key not in ("concurrency", "repeat", "alternate")}
    params.update(prompts=sum(r["params"]["prompts"] for r in reports),
                  splits=sorted({s for r in reports for s in r["params"].get("splits", [])}),
                  concurrency=[1], merged_shards=len(reports))
    params.pop("cost_profile", None)
    return {"model": reports[0]["model"], "params": params, "runs": rows, "summary": summarize(rows),
            "trace": reports[0].get("trace", {})}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="bench reports (--out JSON) of disjoint tasks of one prompt set")
    parser.add_argument("--out", required=True, help="the merged report's JSON (its Markdown table beside it, .md)")
    args = parser.parse_args(argv)
    merged = merge_reports([json.loads(Path(path).read_text()) for path in args.reports])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=1))
    table = render_table(merged)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
