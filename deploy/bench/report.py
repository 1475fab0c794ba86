"""Bench report: samples -> the JSON rows of docs/design.md, the `oracle` row, a summary, Markdown.

Every row has `tokens, seconds, tokens_per_s, speedup_vs_ar, lossless, mean_accepted_length,
per_task` (§7) plus `latency_p50_s`, `latency_p99_s` and `drafter_rounds`. A row run at
concurrency c > 1 (`serve:<policy>@c<c>`) adds `concurrency` and `wall_s`; its `tokens_per_s`
is throughput (tokens over wall time), its per-task figures are per-request speeds. A row whose
every request saw its first token (streamed service runs, the batching peers) adds
`ttft_p50_s` and `ttft_p99_s`, the time to first token.
`lossless` compares every prompt's greedy token ids with `ar`; `samples` lists each prompt's
`[id, task, tokens, seconds]` (plus its profiled seconds, with a cost profile), from which the
summary's `uncertainty` is computed (95% bootstrap intervals of the best policy's ratios, a
cross-validated oracle: deploy/bench/uncertainty.py). With a cost profile, in-process rows
add `profiled: {tokens_per_s, speedup_vs_ar, per_task: {task: speedup_vs_ar}}`: the same rounds
re-timed with another device's verification costs (deploy/bench/cost_profile.py). The summary
compares the best multi-draft run (several drafters' drafts verified as one tree each round:
`policy:<policy>@tree`) with the best one-drafter policy or single drafter (with a 95%
interval),
and each specialist (`single:retrieval-<task>`, `single:distill-<task>`) on its own task with the
generic drafters and the other tasks' specialists: tokens per forward (acceptance) and drafting
cost per drafted token. A `policy:` row keeps `prompt_rounds` ({prompt id: {drafter: rounds}}),
and with `single:` rows beside it the summary's `regret` gives each policy's regret against each
request's best fixed arm (deploy/bench/regret.py).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from actors.no_draft import NO_DRAFT
from deploy.bench.prompts import BenchPrompt
from deploy.bench.regret import request_regret
from deploy.bench.sample import Sample
from deploy.bench.spec_bench import is_spec_bench, spec_bench_table
from deploy.bench.uncertainty import ORACLE, cross_validated_oracle, ratio_interval
from policy.registry import TREE, split_run_policy

Samples = list[tuple[BenchPrompt, Sample]]
SPECIALIST = re.compile(r"^single:(?:retrieval|distill)-([a-z0-9_]+)$")


def is_multi_draft(run: str) -> bool:
    """A run that verifies several drafters' drafts a round (`policy:<policy>@tree`)."""
    return run.startswith("policy:") and split_run_policy(run.removeprefix("policy:"))[1] == TREE


def _profiled_tps(samples: Samples) -> float:
    seconds = sum(x.profiled_s for _, x in samples)
    return sum(len(x.token_ids) for _, x in samples) / seconds if seconds else 0.0


def _aggregate(samples: Samples, baseline_tps: float | None, seconds: float | None = None) -> dict:
    tokens = sum(len(x.token_ids) for _, x in samples)
    seconds = sum(x.seconds for _, x in samples) if seconds is None else seconds
    rounds = sum(x.rounds for _, x in samples)
    tps = tokens / seconds if seconds else 0.0
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tps, 3),
        "speedup_vs_ar": round(tps / baseline_tps, 3) if baseline_tps else 1.0,
        "mean_accepted_length": round(tokens / rounds, 3) if rounds else None,
    }


def acceptance_by_position(samples: Samples) -> list[float]:
    """Of the rounds that drafted at least i tokens, the share whose first i were accepted, for i =
    1, 2, ... (one drafter's chain drafts: its acceptance as papers report it, with `--no-cut` at the full k)."""
    rounds = [(drafted, accepted) for _, x in samples for _, drafted, accepted in x.trace if drafted]
    depth = max((drafted for drafted, _ in rounds), default=0)
    return [round(sum(a >= i for d, a in rounds if d >= i) / sum(d >= i for d, _ in rounds), 3)
            for i in range(1, depth + 1)]


def run_row(name: str, samples: Samples, ar_ids: dict[str, list[int]], ar_row: dict | None,
            concurrency: int = 1, wall_s: float | None = None) -> dict:
    is_ar = ar_row is None
    row = {"name": name, **_aggregate(samples, None if is_ar else ar_row["tokens_per_s"], wall_s)}
    row["lossless"] = all(x.token_ids == ar_ids[p.id] for p, x in samples)
    row["samples"] = [[p.id, p.task, len(x.token_ids), round(x.seconds, 4)]
                      + ([round(x.profiled_s, 5)] if x.profiled_s is not None else []) for p, x in samples]
    latencies = [x.seconds for _, x in samples]
    row["latency_p50_s"] = round(float(np.percentile(latencies, 50)), 3)
    row["latency_p99_s"] = round(float(np.percentile(latencies, 99)), 3)
    first_tokens = [x.first_token_s for _, x in samples if x.first_token_s is not None]
    if first_tokens and len(first_tokens) == len(samples):  # runs that see their first tokens
        row["ttft_p50_s"] = round(float(np.percentile(first_tokens, 50)), 3)
        row["ttft_p99_s"] = round(float(np.percentile(first_tokens, 99)), 3)
    if wall_s is not None:  # a swept run: its figure is throughput at that concurrency
        row["concurrency"], row["wall_s"] = concurrency, round(wall_s, 3)
    row["per_task"] = {}
    for task in sorted({p.task for p, _ in samples}):
        baseline = None if is_ar else ar_row["per_task"][task]["tokens_per_s"]
        row["per_task"][task] = _aggregate([s for s in samples if s[0].task == task], baseline)
        if is_ar:
            row["per_task"][task]["mean_accepted_length"] = None
    if is_ar:
        row["mean_accepted_length"] = None  # docs/design.md: the baseline drafts nothing
    pulls: dict[str, int] = {}
    for _, x in samples:
        for drafter, stats in x.per_drafter.items():
            pulls[drafter] = pulls.get(drafter, 0) + stats["steps"]
    row["drafter_rounds"] = pulls
    if name.startswith("single:") and (positions := acceptance_by_position(samples)):
        row["acceptance_by_position"] = positions
    if name.startswith("policy:"):  # for its regret against each request's best fixed arm (deploy/bench/regret.py)
        row["prompt_rounds"] = {p.id: {d: stats["steps"] for d, stats in x.per_drafter.items()} for p, x in samples}
    rounds = sum(x.rounds for _, x in samples)
    coordinator_s = sum(x.coordinator_s for _, x in samples)
    verify_s = sum(x.verify_s for _, x in samples)
    if rounds and not is_ar and coordinator_s + verify_s > 0:  # one round's draft call, and its share of the round
        row["draft_ms_per_round"] = round(1000 * coordinator_s / rounds, 3)
        row["draft_share_of_round"] = round(coordinator_s / (coordinator_s + verify_s), 4)
        drafted = sum(stats.get("drafted", 0) for _, x in samples for stats in x.per_drafter.values())
        row["draft_ms_per_token"] = round(1000 * coordinator_s / drafted, 3) if drafted else None
    if samples and all(x.profiled_s is not None for _, x in samples) and (is_ar or "profiled" in ar_row):
        tps = _profiled_tps(samples)
        per_task = {task: _profiled_tps([s for s in samples if s[0].task == task]) for task in row["per_task"]}
        base = {"": tps, **per_task} if is_ar else {"": ar_row["profiled"]["tokens_per_s"], **ar_row["profiled"]["per_task_tokens_per_s"]}
        row["profiled"] = {"tokens_per_s": round(tps, 3), "speedup_vs_ar": round(tps / base[""], 3),
                           "per_task_tokens_per_s": {t: round(v, 3) for t, v in per_task.items()},
                           "per_task": {t: round(v / base[t], 3) for t, v in per_task.items()}}
    return row


def oracle_row(rows: Sequence[dict]) -> dict | None:
    """Per task, the best measured single drafter: the bound a drafter-choosing policy aims at."""
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


def specialist_summary(rows: Sequence[dict]) -> dict:
    """Each specialist single drafter on its own task against the generic drafters and the other
    tasks' specialists (the best of them by tokens per forward there)."""
    singles = {r["name"]: r for r in rows if r["name"].startswith("single:") and r["name"] != "single:none"}
    out = {}
    for name, row in singles.items():
        found = SPECIALIST.match(name)
        if not found or found.group(1) not in row["per_task"]:
            continue
        task = found.group(1)
        acceptance = {n: r["per_task"][task]["mean_accepted_length"] or 0.0 for n, r in singles.items()}
        rivals = [n for n in singles if n != name and SPECIALIST.sub(r"\1", n) != task]  # generic or another task's
        rival = max(rivals, key=acceptance.get, default=None)
        out[name] = {"task": task, "tokens_per_forward": acceptance[name], "draft_ms_per_token": row.get("draft_ms_per_token"),
                     "best_other": rival, "best_other_tokens_per_forward": acceptance[rival] if rival else None,
                     "beats_others": rival is None or acceptance[name] > acceptance[rival]}
    return out


def summarize(rows: Sequence[dict]) -> dict:
    """The best in-process policy against ar, the best single drafter, the oracle and the best peer."""
    def best(prefix: str) -> dict | None:
        group = [r for r in rows if r["name"].startswith(prefix) and "concurrency" not in r]
        return max(group, key=lambda r: r["tokens_per_s"]) if group else None

    specialists = specialist_summary(rows)
    policy = best("policy:")
    if policy is None:  # a bench of single drafters still measures the specialists
        return {"all_lossless": all(r["lossless"] for r in rows), **({"specialists": specialists} if specialists else {})}
    out = {"best_policy": policy["name"], "all_lossless": all(r["lossless"] for r in rows)}
    for label, other in (("ar", rows[0]), ("best_single", best("single:")), ("oracle", best("oracle")),
                         ("best_peer", best("peer:"))):
        if other is not None:
            out[f"{label}_name"] = other["name"]
            out[f"vs_{label}"] = round(policy["tokens_per_s"] / other["tokens_per_s"], 3)
    policies = [r for r in rows if r["name"].startswith("policy:")]
    multi = [r for r in policies if is_multi_draft(r["name"])]
    # one drafter drafts and is verified each round: the other policies, and each single drafter
    one = [r for r in rows if r["name"].startswith(("policy:", "single:")) and not is_multi_draft(r["name"])]
    if multi and one:
        for key, profiled in (("multi_draft", False), ("profiled_multi_draft", True)):
            def speed(r: dict, profiled: bool = profiled) -> float | None:
                return r.get("profiled", {}).get("tokens_per_s") if profiled else r["tokens_per_s"]

            if speed(multi[0]) is None:
                continue
            best_multi, best_one = max(multi, key=speed), max(one, key=speed)
            out[key] = {"best_multi": best_multi["name"], "best_one_drafter": best_one["name"],
                        "ratio": round(speed(best_multi) / speed(best_one), 3)}
            if "samples" in best_multi and "samples" in best_one:
                out[key]["ci95"] = ratio_interval(best_multi, best_one, [], profiled=profiled)
    if specialists:
        out["specialists"] = specialists
    singles = [r for r in rows if r["name"].startswith("single:") and "samples" in r]
    if singles:
        arms = {r["name"].removeprefix("single:"): r for r in singles}
        arms.setdefault(NO_DRAFT, rows[0])  # plain decoding is the no-draft arm
        regrets = {r["name"]: request_regret(r, arms) for r in policies if "prompt_rounds" in r}
        out["regret"] = {name: figures for name, figures in regrets.items() if figures}
    if singles and "samples" in policy:
        out["uncertainty"] = {
            "vs_best_single_ci95": ratio_interval(policy, max(singles, key=lambda r: r["tokens_per_s"]), singles),
            "vs_oracle_ci95": ratio_interval(policy, ORACLE, singles),
            "oracle_cv": (cv := cross_validated_oracle(singles)),
            "vs_oracle_cv": round(policy["tokens_per_s"] / cv["tokens_per_s"], 3),
        }
    return out


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def render_table(report: dict) -> str:
    """Markdown: overall and per-task speedup vs ar for every run; a latency table for service
    runs; the summary line."""
    runs = report["runs"]
    tasks = list(runs[0]["per_task"])
    profiled = "profiled" in runs[0]
    extra = [f"profiled ({report['params']['cost_profile']['device']})"] if profiled else []
    lines = ["| run | tok/s | speedup | lossless | tokens/forward | " + " | ".join(extra + tasks) + " |",
             "|" + "---|" * (5 + len(extra) + len(tasks))]
    for row in runs:
        if "concurrency" in row:
            continue
        mal = "" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
        cells = [f"{row['per_task'][t]['speedup_vs_ar']:.2f}x" for t in tasks]
        if profiled:
            cells.insert(0, f"{row['profiled']['speedup_vs_ar']:.2f}x" if "profiled" in row else "")
        lines.append(f"| {row['name']} | {row['tokens_per_s']:.1f} | {row['speedup_vs_ar']:.2f}x | "
                     f"{'yes' if row['lossless'] else 'NO'} | {mal} | {' | '.join(cells)} |")
    if profiled:
        lines += ["", f"Profiled ({report['params']['cost_profile']['device']}) per task, vs ar:", "",
                  "| run | " + " | ".join(tasks) + " |", "|" + "---|" * (1 + len(tasks))]
        lines += [f"| {row['name']} | " + " | ".join(f"{row['profiled']['per_task'][t]:.2f}x" for t in tasks) + " |"
                  for row in runs if "profiled" in row]
    swept = sorted((r for r in runs if r["name"].startswith("serve:") or "concurrency" in r),
                   key=lambda r: (r.get("concurrency", 1), r["name"]))
    if swept:
        lines += ["", "| run | concurrency | requests | tok/s (throughput) | vs ar | tokens/forward | p50 latency s | "
                      "p99 latency s | TTFT p50 s | TTFT p99 s | lossless |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        requests = report["params"]["prompts"]
        for row in swept:
            mal = "" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
            lines.append(f"| {row['name']} | {row.get('concurrency', 1)} | {requests} | {row['tokens_per_s']:.1f} | "
                         f"{row['speedup_vs_ar']:.2f}x | {mal} | {row['latency_p50_s']:.2f} | {row['latency_p99_s']:.2f} | "
                         f"{_seconds(row.get('ttft_p50_s'))} | {_seconds(row.get('ttft_p99_s'))} | "
                         f"{'yes' if row['lossless'] else 'NO'} |")
    summary = report.get("summary") or {}
    if summary:
        ratios = ", ".join(f"{summary[f'vs_{k}']:.3f}x {summary[f'{k}_name']}"
                           for k in ("ar", "best_single", "oracle", "best_peer") if f"vs_{k}" in summary)
        lossless = 'all runs lossless' if summary['all_lossless'] else 'NOT ALL RUNS LOSSLESS'
        lines += ["", f"Best policy {summary['best_policy']}: {ratios}; {lossless}." if "best_policy" in summary
                  else f"No policy run; {lossless}."]
        if "uncertainty" in summary:
            u = summary["uncertainty"]
            lines.append(f"95% intervals (bootstrap over prompts within tasks): vs {summary['best_single_name']} "
                         f"[{u['vs_best_single_ci95'][0]:.3f}, {u['vs_best_single_ci95'][1]:.3f}], vs oracle "
                         f"[{u['vs_oracle_ci95'][0]:.3f}, {u['vs_oracle_ci95'][1]:.3f}]; cross-validated oracle "
                         f"{u['oracle_cv']['tokens_per_s']:.1f} tok/s, best policy {u['vs_oracle_cv']:.3f}x it.")
        for key, label in (("multi_draft", "measured"), ("profiled_multi_draft", "profiled")):
            if key in summary:
                m = summary[key]
                interval = f" (95% interval {m['ci95'][0]:.3f}-{m['ci95'][1]:.3f})" if "ci95" in m else ""
                lines.append(f"Multi-draft ({label}): {m['best_multi']} is {m['ratio']:.3f}x {m['best_one_drafter']}{interval}.")
        if "specialists" in summary:
            lines += ["", ("| specialist | own task | tokens/forward there | best generic or other-task drafter there | "
                           "its tokens/forward | beats them | draft ms per drafted token |"), "|---|---|---|---|---|---|---|"]
            for name, s in summary["specialists"].items():
                cost = "" if s["draft_ms_per_token"] is None else f"{s['draft_ms_per_token']:.2f}"
                lines.append(f"| {name} | {s['task']} | {s['tokens_per_forward']:.2f} | {s['best_other']} | "
                             f"{s['best_other_tokens_per_forward'] or 0:.2f} | {'yes' if s['beats_others'] else 'NO'} | {cost} |")
    if is_spec_bench(tasks):
        lines += spec_bench_table(runs)
    by_position = [r for r in runs if r.get("acceptance_by_position")]
    if by_position:
        depth = max(len(r["acceptance_by_position"]) for r in by_position)
        lines += ["", "Acceptance by draft position (of the rounds that drafted at least i tokens, the share whose "
                      "first i were accepted):", "", "| run | " + " | ".join(str(i) for i in range(1, depth + 1)) + " |",
                  "|" + "---|" * (1 + depth)]
        lines += [f"| {r['name']} | " + " | ".join(f"{v:.2f}" for v in r["acceptance_by_position"])
                  + " |" * (depth - len(r["acceptance_by_position"])) + " |" for r in by_position]
    if summary.get("regret"):
        lines += ["", "Regret against each request's best fixed arm (an upper estimate: the best arm is picked on "
                      "the timings it is scored on):", "",
                  "| policy | time a per-request oracle saves | its speed vs the per-request oracle | rounds off the "
                  "best arm | rounds on an arm slower than plain decoding |", "|---|---|---|---|---|"]
        for name, r in summary["regret"].items():
            lines.append(f"| {name} | {r['seconds_lost_share']:.1%} | {r['vs_request_oracle']:.3f}x | "
                         f"{_share(r['rounds_off_best'])} | {_share(r['rounds_dominated'])} |")
    if "splits" in report["params"]:
        lines += ["", f"Prompts: {report['params']['prompts']}, split {' and '.join(report['params']['splits'])}"
                      + (", a task at a time in turn" if report["params"].get("interleaved") else "") +
                      " (dev: the defaults may have been tuned on them; test: never tuned on)."]
    return "\n".join(lines)
