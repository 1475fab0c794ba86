"""How sure a bench's comparisons are, from the per-prompt samples every row carries.

A row's `samples` are `[prompt id, task, tokens, seconds(, profiled seconds)]`, one per prompt. Runs are interleaved
(every run generates prompt i before any run generates prompt i+1), so two runs can be compared
prompt by prompt; what remains is the noise of each generation (on a shared machine, 5-10%).

- `ratio_interval(a, b, singles)`: the 95% interval of tokens_per_s(a) / tokens_per_s(b) under a
  bootstrap over prompts, resampled within each task (the same resampled prompts for every run;
  seeded, so a report is reproducible). `b` may be `ORACLE`: the per-task best single drafter,
  chosen again in each resample.
- `cross_validated_oracle(singles)`: the oracle without the winner's curse. The plain oracle picks
  each task's best single drafter on the same timings it then reports, so when several drafters
  are close on a task, noise alone lifts it (the maximum of noisy figures is biased upwards).
  Here each task's prompts are split in two halves (alternate prompts in bench order); the drafter
  that was best on one half is timed on the other, and the other way round.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ORACLE = "oracle"
RESAMPLES = 2000
SEED = 0


def _matrix(rows: Sequence[dict], profiled: bool = False) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(task of each prompt, tokens [run, prompt], seconds [run, prompt]; profiled seconds if asked)
    in the first row's prompt order."""
    order = [s[0] for s in rows[0]["samples"]]
    tasks = [s[1] for s in rows[0]["samples"]]
    tokens = np.zeros((len(rows), len(order)))
    seconds = np.zeros((len(rows), len(order)))
    for r, row in enumerate(rows):
        by_id = {s[0]: s for s in row["samples"]}
        tokens[r] = [by_id[p][2] for p in order]
        seconds[r] = [by_id[p][4 if profiled else 3] for p in order]
    return tasks, tokens, seconds


def _oracle_rate(weights: np.ndarray, tasks: list[str], tokens: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """weights [b, prompt] -> per resample, tokens per second of each task's best single (rows 0..)."""
    total_tokens = np.zeros(weights.shape[0])
    total_seconds = np.zeros(weights.shape[0])
    for task in sorted(set(tasks)):
        mask = np.array([t == task for t in tasks], dtype=float)
        task_tokens = (weights * mask) @ tokens.T  # [b, single]
        task_seconds = (weights * mask) @ seconds.T
        rate = np.divide(task_tokens, task_seconds, out=np.zeros_like(task_tokens), where=task_seconds > 0)
        best = np.argmax(rate, axis=1)
        picked = np.arange(weights.shape[0])
        total_tokens += task_tokens[picked, best]
        total_seconds += task_seconds[picked, best]
    return total_tokens / total_seconds


def _resample_weights(tasks: list[str], resamples: int, seed: int) -> np.ndarray:
    """[resamples, prompt]: how often each prompt is drawn, drawing each task's count of prompts
    from that task's prompts with replacement."""
    rng = np.random.default_rng(seed)
    weights = np.zeros((resamples, len(tasks)))
    for task in sorted(set(tasks)):
        members = np.flatnonzero([t == task for t in tasks])
        weights[:, members] = rng.multinomial(len(members), np.full(len(members), 1 / len(members)), size=resamples)
    return weights


def ratio_interval(a: dict, b: dict | str, singles: Sequence[dict], resamples: int = RESAMPLES,
                   seed: int = SEED, profiled: bool = False) -> tuple[float, float]:
    """95% bootstrap interval of tokens_per_s(a) / tokens_per_s(b) (profiled: on the rows' profiled
    seconds); b = ORACLE: the per-task best of `singles`, chosen again in every resample."""
    rows = [a, *singles] if b == ORACLE else [a, b]
    tasks, tokens, seconds = _matrix(rows, profiled)
    weights = _resample_weights(tasks, resamples, seed)
    rate_a = (weights @ tokens[0]) / (weights @ seconds[0])
    rate_b = _oracle_rate(weights, tasks, tokens[1:], seconds[1:]) if b == ORACLE else (weights @ tokens[1]) / (weights @ seconds[1])
    low, high = np.percentile(rate_a / rate_b, [2.5, 97.5])
    return round(float(low), 3), round(float(high), 3)


def cross_validated_oracle(singles: Sequence[dict]) -> dict:
    """{"tokens_per_s", "chosen": {task: [drafter on the first half, on the second]}}: each task's
    halves timed with the single drafter that was best on the other half."""
    tasks, tokens, seconds = _matrix(singles)
    position = {}
    halves = np.zeros(len(tasks), dtype=int)
    for i, task in enumerate(tasks):  # alternate prompts of each task, in bench order
        halves[i] = position.get(task, 0) % 2
        position[task] = position.get(task, 0) + 1
    total_tokens = total_seconds = 0.0
    chosen: dict[str, list[str]] = {}
    for task in sorted(set(tasks)):
        for half in (0, 1):
            timed = np.array([t == task and h == half for t, h in zip(tasks, halves)])
            picked_on = np.array([t == task and h != half for t, h in zip(tasks, halves)])
            if not timed.any():
                continue
            if not picked_on.any():  # a task of one prompt: the drafter best over all tasks
                picked_on = np.ones(len(tasks), dtype=bool)
            best = int(np.argmax(tokens[:, picked_on].sum(axis=1) / seconds[:, picked_on].sum(axis=1)))
            chosen.setdefault(task, []).append(singles[best]["name"])
            total_tokens += tokens[best, timed].sum()
            total_seconds += seconds[best, timed].sum()
    return {"tokens_per_s": round(total_tokens / total_seconds, 3), "chosen": chosen}
