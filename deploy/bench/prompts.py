"""Bench prompt files: JSONL, one prompt a line, `{"id", "task", "messages": [...]}` (chat
template applied) or `{"id", "task", "prompt": "..."}` (raw completion). Problems raise
InvalidRequestError naming `prompts` and the line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from actors.errors import InvalidRequestError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
MIXED_PROMPTS = PROMPTS_DIR / "mixed.jsonl"  # 7 tasks x 5 prompts
TASK_SWITCH_PROMPTS = PROMPTS_DIR / "task_switch.jsonl"  # answers that change task midway


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    task: str
    messages: list[dict] | None = None
    prompt: str | None = None


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
    if len({p.id for p in items}) != len(items):
        raise InvalidRequestError("prompts", f"{path}: prompt ids must be unique")
    return items
