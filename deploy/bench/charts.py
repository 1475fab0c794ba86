"""PNG charts beside a bench report (matplotlib, no display needed).

`speedup_chart`: speedup vs `ar` per task and overall, one bar per run (concurrency sweeps
left out: their figure is throughput). `drafter_chart`: for the traced prompt, the drafter each
policy chose in every round (placed at its position in the answer), coloured by how many of its tokens the target accepted.
`concurrency_chart`: throughput against client concurrency, one line per swept run (its
concurrency-1 point from the interleaved runs when it has none of its own), `ar` as a line.
`reliability_chart`: per swept row with an engine load report, each batch size's share of draft
nodes accepted against the planner's P(accepted), by decile.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _title(report: dict) -> str:
    return f"{report['model']}, greedy, max_tokens {report['params']['max_tokens']}, {report['params']['prompts']} prompts"


def speedup_chart(report: dict, path: Path) -> Path:
    runs = [r for r in report["runs"] if "concurrency" not in r and r["name"] != "ar"]
    groups = list(report["runs"][0]["per_task"]) + ["all"]
    width = 0.8 / max(len(runs), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(groups) + 0.25 * len(runs)), 4.8))
    for i, row in enumerate(runs):
        values = [row["per_task"][g]["speedup_vs_ar"] if g != "all" else row["speedup_vs_ar"] for g in groups]
        ax.bar([x + (i - (len(runs) - 1) / 2) * width for x in range(len(groups))], values, width, label=row["name"])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("speedup vs plain decoding (ar)")
    ax.set_title(_title(report))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def concurrency_chart(report: dict, path: Path) -> Path | None:
    swept = [r for r in report["runs"] if "concurrency" in r]
    if not swept:
        return None
    lines: dict[str, dict[int, float]] = {}
    for row in swept:
        lines.setdefault(row["name"].rsplit("@c", 1)[0], {})[row["concurrency"]] = row["tokens_per_s"]
    for row in report["runs"]:  # the interleaved run at concurrency 1
        if "concurrency" not in row and row["name"] in lines:
            lines[row["name"]].setdefault(1, row["tokens_per_s"])
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, points in lines.items():
        levels = sorted(points)
        ax.plot(levels, [points[c] for c in levels], marker="o", label=name)
    ar = next(r for r in report["runs"] if r["name"] == "ar")
    ax.axhline(ar["tokens_per_s"], color="black", linewidth=0.8, linestyle="--", label="ar (one stream)")
    ax.set_xscale("log", base=2)
    levels = sorted({c for points in lines.values() for c in points})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("clients at once")
    ax.set_ylabel("throughput, tokens/s")
    ax.set_title(_title(report))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def drafter_chart(report: dict, path: Path) -> Path | None:
    trace = report.get("trace") or {}
    runs = {name: rounds for name, rounds in trace.get("runs", {}).items() if rounds}
    if not runs:
        return None
    drafters = sorted({d for rounds in runs.values() for d, _, _ in rounds})
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.2 + 1.1 * len(runs) * max(1, len(drafters) / 3)),
                             sharex=True, squeeze=False)
    for ax, (name, rounds) in zip(axes[:, 0], runs.items()):
        xs, position = [], 0  # where in the answer each round starts
        for _, _, accepted in rounds:
            xs.append(position)
            position += accepted + 1
        ys = [drafters.index(d) for d, _, _ in rounds]
        accepted = [a for _, _, a in rounds]
        points = ax.scatter(xs, ys, c=accepted, cmap="viridis", vmin=0, vmax=report["params"]["k"], s=18)
        ax.set_yticks(range(len(drafters)), drafters, fontsize=8)
        ax.set_ylim(-0.5, len(drafters) - 0.5)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("output token position at the start of the round")
    fig.colorbar(points, ax=axes[:, 0].tolist(), label="accepted draft tokens")
    fig.suptitle(f"drafter chosen per round: prompt {trace['prompt']} ({trace['task']})", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reliability_chart(report: dict, path: Path) -> Path | None:
    """Per swept row with a load report, one panel: each batch size's share accepted against the
    planner's P(accepted), by decile (the diagonal: calibrated)."""
    rows = [r for r in report["runs"] if r.get("load", {}).get("calibration")]
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4.2), squeeze=False)
    for ax, row in zip(axes[0], rows):
        for bucket, c in row["load"]["calibration"].items():
            bins = [b for b in c["bins"] if b[1] >= 5]
            ax.plot([b[2] for b in bins], [b[3] for b in bins], marker="o", label=f"{bucket} rows ({c['nodes']} nodes)")
        ax.plot([0, 1], [0, 1], color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel("planner's P(accepted)")
        ax.set_ylabel("share accepted")
        ax.set_title(row["name"], fontsize=8)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
