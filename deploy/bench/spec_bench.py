"""Spec-Bench's columns in a bench report, with its published mean accepted tokens beside them.

A report over Spec-Bench prompts (deploy/prompts/spec_bench_dev.jsonl, or its held-out half in
the same format) gets a table in Spec-Bench's own layout: speedup vs plain decoding on multi-turn
(MT-bench), translation, summarization, QA, math and RAG, the mean accepted tokens (tokens per
target forward, which is this bench's `mean_accepted_length`) and overall. Below the measured
rows, Spec-Bench's leaderboard figures for the same column (`PUBLISHED`: Vicuna-7B on one A100,
greedy, fp16) are listed for reference, labelled as published: they are never runs of this bench
and their speedups belong to another model and device, so only their mean accepted tokens are
given.
"""
from __future__ import annotations

COLUMNS = (("mt_bench", "multi-turn"), ("translation", "translation"), ("summarization", "summarization"),
           ("qa", "QA"), ("math_reasoning", "math"), ("rag", "RAG"))
PUBLISHED = (  # (method, mean accepted tokens) from Spec-Bench's leaderboard: Vicuna-7B, one A100, greedy, fp16
    ("Lookahead", 1.64), ("prompt lookup (PLD)", 1.75), ("REST", 1.82), ("small draft model (SpS)", 2.28),
    ("Token Recycling", 2.73), ("EAGLE", 3.58), ("EAGLE-2", 4.34), ("SAM-Decoding + EAGLE-2", 4.58),
)


def is_spec_bench(tasks: list[str]) -> bool:
    """Whether a report's tasks are Spec-Bench's (all six, or some of them and nothing else)."""
    known = {task for task, _ in COLUMNS}
    return bool(tasks) and set(tasks) <= known


def spec_bench_table(runs: list[dict]) -> list[str]:
    """Markdown lines: every in-process row in Spec-Bench's columns, then the published reference."""
    tasks = [(task, label) for task, label in COLUMNS if task in runs[0]["per_task"]]
    lines = ["", "Spec-Bench's columns (speedup vs ar; mean accepted tokens = tokens per target forward):", "",
             "| run | " + " | ".join(label for _, label in tasks) + " | mean accepted tokens | overall |",
             "|" + "---|" * (3 + len(tasks))]
    for row in runs:
        if "concurrency" in row:
            continue
        mat = 1.0 if row["mean_accepted_length"] is None else row["mean_accepted_length"]
        cells = [f"{row['per_task'][task]['speedup_vs_ar']:.2f}x" for task, _ in tasks]
        lines.append(f"| {row['name']} | {' | '.join(cells)} | {mat:.2f} | {row['speedup_vs_ar']:.2f}x |")
    blank = " |" * len(tasks)
    lines += [f"| published: {name} (Spec-Bench leaderboard, Vicuna-7B, A100; not a run) |{blank} {mat:.2f} | |"
              for name, mat in PUBLISHED]
    return lines
