"""A task corpus from the target itself: its greedy answers to the task's training prompts.

`target_outputs(target, prompts, max_new_tokens, batch_size)` runs the target's own `generate`
over left-padded batches (several prompts a forward: a corpus of ~20k tokens takes minutes on
two CPU cores) and returns one `Example` (prompt ids, output ids up to its first EOS) per
prompt. The prompts are encoded exactly as the engine encodes chat requests (TargetModel.encode).
`python_sources(limit_chars)` reads the Python standard library's own sources on this machine:
a code corpus that needs no download. Corpora are stored as JSON lines of token ids.
"""
from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from deploy.engine.target import TargetModel


@dataclass(frozen=True)
class Example:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.output_ids


@torch.inference_mode()
def target_outputs(
    target: TargetModel, prompts: Sequence[Sequence[dict]], max_new_tokens: int = 128, batch_size: int = 16,
    progress: bool = False,
) -> list[Example]:
    from tqdm import tqdm

    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(target.eos_ids)
    encoded = [target.encode(messages=messages) for messages in prompts]
    examples: list[Example] = []
    for start in tqdm(range(0, len(encoded), batch_size), desc="target outputs", disable=not progress):
        batch = encoded[start : start + batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=target.device)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=target.device)
        out = target.model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=pad)
        for ids, row in zip(batch, out[:, width:].tolist()):
            end = next((i for i, t in enumerate(row) if t in target.eos_ids), len(row))
            examples.append(Example(tuple(ids), tuple(row[:end])))
    return examples


def save_examples(examples: Iterable[Example], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for example in examples:
            out.write(json.dumps({"prompt_ids": example.prompt_ids, "output_ids": example.output_ids}) + "\n")


def load_examples(path: Path) -> list[Example]:
    with path.open() as lines:
        return [Example(tuple(d["prompt_ids"]), tuple(d["output_ids"])) for d in map(json.loads, lines)]


def python_sources(limit_chars: int) -> list[str]:
    """Texts of the standard library's .py files (sorted by path, skipping tests), up to limit_chars in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("[a-z]*/*.py")):
        if total >= limit_chars or "test" in path.parts[-2:-1] or path.name.startswith("test"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text[: limit_chars - total])
        total += len(texts[-1])
    return texts
