"""Bench prompt files: JSONL, one prompt a line, `{"id", "task", "messages": [...]}` (chat
template applied) or `{"id", "task", "prompt": "..."}` (raw completion), each with an optional
`split`: `dev` (the default: prompts any default, threshold or prior may be tuned on) or `test`
(prompts only reported on, never tuned on). Problems raise InvalidRequestError naming `prompts`
and the line.

The shipped sets (docs/benchmarks.md, "Development and test prompts"): `mixed.jsonl`, 7 tasks x 5,
is the development set the defaults were chosen on; `mixed_test.jsonl` holds 4 new prompts of
each of those tasks and `styles_test.jsonl` 32 prompts of 4 styles no default was chosen on
(long multi-turn chat, JSON and tool calls, editing a given text, dialogue in other languages),
both written before any tuning on them.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from actors.errors import InvalidRequestError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
MIXED_PROMPTS = PROMPTS_DIR / "mixed.jsonl"  # 7 tasks x 5 prompts, split dev
MIXED_TEST_PROMPTS = PROMPTS_DIR / "mixed_test.jsonl"  # the same 7 tasks x 4, split test
STYLES_TEST_PROMPTS = PROMPTS_DIR / "styles_test.jsonl"  # 4 new styles x 8, split test
TASK_SWITCH_PROMPTS = PROMPTS_DIR / "task_switch.jsonl"  # answers that change task midway
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    task: str
    messages: list[dict] | None = None
    prompt: str | None = None
    split: str = "dev"


def json_lines(path: str | Path, field: str) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-blank JSON line of path; a line that is not JSON raises
    InvalidRequestError naming `field` and the line."""
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidRequestError(field, f"line {line_no}: not JSON ({err})") from err


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    items = []
    for line_no, row in json_lines(path, "prompts"):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("task"), str):
            raise InvalidRequestError("prompts", f"line {line_no}: needs string fields id and task")
        if ("messages" in row) == ("prompt" in row):
            raise InvalidRequestError("prompts", f"line {line_no}: needs exactly one of messages or prompt")
        split = row.get("split", "dev")
        if split not in SPLITS:
            raise InvalidRequestError("prompts", f"line {line_no}: split must be one of {', '.join(SPLITS)}, got {split!r}")
        items.append(BenchPrompt(row["id"], row["task"], row.get("messages"), row.get("prompt"), split))
    if not items:
        raise InvalidRequestError("prompts", f"{path} holds no prompts")
    if len({p.id for p in items}) != len(items):
        raise InvalidRequestError("prompts", f"{path}: prompt ids must be unique")
    return items


def in_turns(prompts: Sequence[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts taken a task at a time in turn (each task's in the file's order), as mixed
    traffic arrives, not in the file's blocks of one task (`specfleet bench --interleave`)."""
    by_task: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        by_task.setdefault(prompt.task, []).append(prompt)
    longest = max((len(group) for group in by_task.values()), default=0)
    return [group[i] for i in range(longest) for group in by_task.values() if i < len(group)]


def first_per_task(prompts: Sequence[BenchPrompt], n: int) -> list[BenchPrompt]:
    """The first n prompts of each task, in the file's order (`specfleet bench --per-task N`)."""
    taken: dict[str, int] = {}
    kept = []
    for prompt in prompts:
        taken[prompt.task] = taken.get(prompt.task, 0) + 1
        if taken[prompt.task] <= n:
            kept.append(prompt)
    return kept
