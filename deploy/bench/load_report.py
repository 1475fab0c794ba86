"""A bench under load: repeated sweeps made one row, their ratios side by side, and the engine's
load report (acceptance calibration and guard per batch size) as tables and a chart.

`swept_row` makes one row of a swept run's repetitions at a level (`--repeat N`): its figures are
the repetitions' medians (throughput, latencies, tokens per forward), `repeats` keeps each one's,
and `load` sums the engine's load reports (`SpeculativeEngine.load_report`; `batch:` runs).
`sweep_ratios` compares, at every level, each swept run with the same kind's run with drafting
off (`batch:fixed:none`, `serve:fixed:none`) and with `peer:hf-batch`: the ratio of medians and,
where both ran the same repetitions, each repetition's own (the runs of one repetition ran back
to back). `render_load` writes both as Markdown (deploy/bench/charts.py `reliability_chart`
plots expected against accepted per batch size).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deploy.bench.report import Samples, run_row

OFF = "fixed:none"  # the policy that never drafts
PEER = "peer:hf-batch"
_MEDIANS = ("latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s", "mean_accepted_length")


def swept_row(name: str, repetitions: Sequence[tuple[Samples, float, dict]], ar_ids: dict[str, list[int]],
              ar_row: dict, level: int) -> dict:
    """One row of a swept run's repetitions ([(samples, wall seconds, load report)]) at `level`."""
    rows = [run_row(name, samples, ar_ids, ar_row, level, wall_s) for samples, wall_s, _ in repetitions]
    loads = [load for *_, load in repetitions if load]
    if len(rows) == 1:
        row = rows[0]
    else:
        throughputs = [r["tokens_per_s"] for r in rows]
        median = float(np.median(throughputs))
        row = dict(min(rows, key=lambda r: abs(r["tokens_per_s"] - median)))  # its samples and per-task figures
        row["tokens_per_s"], row["speedup_vs_ar"] = round(median, 3), round(median / ar_row["tokens_per_s"], 3)
        for key in _MEDIANS:
            values = [r.get(key) for r in rows]
            if all(v is not None for v in values):
                row[key] = round(float(np.median(values)), 3)
        row["lossless"] = all(r["lossless"] for r in rows)
        row["repeats"] = {"tokens_per_s": throughputs, "latency_p99_s": [r["latency_p99_s"] for r in rows],
                          "mean_accepted_length": [r["mean_accepted_length"] for r in rows]}
    if loads:
        row["load"] = merge_loads(loads)
    return row


def merge_loads(loads: Sequence[dict]) -> dict:
    """Load reports of repetitions summed: nodes and counts added, means weighted by them."""
    calibration: dict[str, dict] = {}
    guard: dict[str, dict] = {}
    for load in loads:
        for bucket, c in load.get("calibration", {}).items():
            into = calibration.setdefault(bucket, {"nodes": 0, "expected": 0.0, "accepted": 0.0, "bins": {}})
            into["expected"] += c["expected"] * c["nodes"]
            into["accepted"] += c["accepted"] * c["nodes"]
            into["nodes"] += c["nodes"]
            for edge, nodes, expected, accepted, ratio in c["bins"]:
                b = into["bins"].setdefault(edge, [0, 0.0, 0.0, []])
                b[0] += nodes
                b[1] += expected * nodes
                b[2] += accepted * nodes
                b[3].append(ratio)
        for bucket, g in load.get("guard", {}).items():
            into = guard.setdefault(bucket, {"drafted_iterations": 0, "drafted_gain": 0.0, "plain_iterations": 0,
                                             "plain_gain": 0.0, "drafting": []})
            for arm in ("drafted", "plain"):
                into[f"{arm}_gain"] += g[f"{arm}_gain"] * g[f"{arm}_iterations"]
                into[f"{arm}_iterations"] += g[f"{arm}_iterations"]
            into["drafting"].append(g["drafting"])
    for c in calibration.values():
        c["expected"], c["accepted"] = round(c["expected"] / c["nodes"], 4), round(c["accepted"] / c["nodes"], 4)
        c["bins"] = [[edge, n, round(e / n, 4), round(a / n, 4), round(float(np.mean(r)), 4)]
                     for edge, (n, e, a, r) in sorted(c["bins"].items())]
    for g in guard.values():
        for arm in ("drafted", "plain"):
            g[f"{arm}_gain"] = round(g[f"{arm}_gain"] / g[f"{arm}_iterations"], 4) if g[f"{arm}_iterations"] else 0.0
    return {"calibration": calibration, "guard": guard}


def _kind_and_policy(name: str) -> tuple[str, str, int] | None:
    """'batch:metasd@tree@c8' -> ('batch', 'metasd@tree', 8); None for a row not swept."""
    if "@c" not in name:
        return None
    run, _, level = name.rpartition("@c")
    kind, _, policy = run.partition(":")
    return kind, policy, int(level)


def _paired(a: dict, b: dict) -> list[float] | None:
    """Each repetition's own ratio, when both rows ran the same number of repetitions."""
    ra, rb = a.get("repeats", {}).get("tokens_per_s"), b.get("repeats", {}).get("tokens_per_s")
    if not ra or not rb or len(ra) != len(rb):
        return None
    return [round(x / y, 3) for x, y in zip(ra, rb)]


def sweep_ratios(rows: Sequence[dict]) -> list[dict]:
    """Per level and swept run that drafts: its throughput against drafting off (the same kind
    of run) and against peer:hf-batch, and its p99 latency against drafting off's."""
    swept = {key: row for row in rows if (key := _kind_and_policy(row["name"]))}
    out = []
    for (kind, policy, level), row in sorted(swept.items(), key=lambda item: (item[0][2], item[0][0], item[0][1])):
        if kind == "peer" or policy == OFF:
            continue
        entry = {"run": row["name"], "concurrency": level, "tokens_per_s": row["tokens_per_s"]}
        if "repeats" in row:
            entry["spread"] = [min(row["repeats"]["tokens_per_s"]), max(row["repeats"]["tokens_per_s"])]
        off, peer = swept.get((kind, OFF, level)), swept.get(("peer", PEER.removeprefix("peer:"), level))
        if off is not None:
            entry["vs_off"] = round(row["tokens_per_s"] / off["tokens_per_s"], 3)
            entry["p99_vs_off"] = round(row["latency_p99_s"] / off["latency_p99_s"], 3)
            if (paired := _paired(row, off)) is not None:
                entry["vs_off_each"] = paired
        if peer is not None:
            entry["vs_hf_batch"] = round(row["tokens_per_s"] / peer["tokens_per_s"], 3)
            if (paired := _paired(row, peer)) is not None:
                entry["vs_hf_batch_each"] = paired
        out.append(entry)
    return out


def _ratio(entry: dict, key: str) -> str:
    if key not in entry:
        return ""
    each = entry.get(f"{key}_each")
    return f"{entry[key]:.3f}x" + (f" ({', '.join(f'{v:.2f}' for v in each)})" if each else "")


def render_load(report: dict) -> list[str]:
    """Markdown lines: the sweep ratios, and per swept row with a load report its calibration and guard."""
    lines: list[str] = []
    ratios = report.get("summary", {}).get("under_load")
    repeat = report["params"].get("repeat", 1)
    if ratios:
        medians = f"medians of {repeat} repetitions" + (", alternated" if report["params"].get("alternate") else "")
        lines += ["", f"Under load ({medians}; in brackets each repetition's own ratio):", "",
                  "| clients | run | tok/s | spread | vs drafting off | vs peer:hf-batch | p99 latency vs drafting off's |",
                  "|---|---|---|---|---|---|---|"]
        for e in ratios:
            spread = f"{e['spread'][0]:.1f}-{e['spread'][1]:.1f}" if "spread" in e else ""
            p99 = f"{e['p99_vs_off']:.2f}x" if "p99_vs_off" in e else ""
            lines.append(f"| {e['concurrency']} | {e['run']} | {e['tokens_per_s']:.1f} | {spread} | "
                         f"{_ratio(e, 'vs_off')} | {_ratio(e, 'vs_hf_batch')} | {p99} |")
    for row in report["runs"]:
        load = row.get("load")
        if not load:
            continue
        lines += ["", f"{row['name']}: per batch size, the planner's P(accepted) of the draft nodes verified against "
                      "the share accepted (correction: accepted / expected of recent iterations, shrunk toward 1), "
                      "and the guard (gain: throughput against a plain forward of the same rows):", "",
                  "| batch rows | nodes verified | expected | accepted | drafted iterations (gain) | plain iterations (gain) | drafting at the end |",
                  "|---|---|---|---|---|---|---|"]
        for bucket in sorted(set(load["calibration"]) | set(load["guard"]), key=lambda b: int(b.split("-")[0])):
            c, g = load["calibration"].get(bucket), load["guard"].get(bucket)
            calibration = f"{c['nodes']} | {c['expected']:.3f} | {c['accepted']:.3f}" if c else " | | "
            guard = (f"{g['drafted_iterations']} ({g['drafted_gain']:.3f}) | {g['plain_iterations']} ({g['plain_gain']:.3f}) | "
                     f"{_drafting(g['drafting'])}") if g else " | | "
            lines.append(f"| {bucket} | {calibration} | {guard} |")
    return lines


def _drafting(value: bool | None | list) -> str:
    values = value if isinstance(value, list) else [value]
    return ", ".join("not measured" if v is None else ("yes" if v else "no") for v in values)
