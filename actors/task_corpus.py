"""A task's corpus as token ids: (prompt ids, output ids) pairs, saved compressed in one .npz.

`Example` is one pair (the target's own answer to one prompt, or a user's text as an output with no
prompt). `save_corpus(examples, path)` writes them as one token array (uint16 when every id fits,
else int32) and two length arrays, compressed; `load_corpus(path)` reads them back. What a
retrieval specialist drafts from is such a corpus, plus, for the tasks in `STDLIB_TASKS`, the
Python standard library's sources on the machine it runs on (`python_sources`: a code corpus that
needs no download), tokenized when the drafter loads.
"""
from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STDLIB_TASKS = {"code": 2_000_000}  # task -> characters of the standard library its datastore adds


@dataclass(frozen=True)
class Example:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.output_ids


def save_corpus(examples: Sequence[Example], path: Path) -> None:
    tokens = [t for e in examples for t in e.token_ids]
    dtype = np.uint16 if max(tokens, default=0) < 2**16 and min(tokens, default=0) >= 0 else np.int32
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:  # a file object: np.savez would append .npz to another suffix
        np.savez_compressed(out, tokens=np.asarray(tokens, dtype=dtype),
                            prompt_lengths=np.asarray([len(e.prompt_ids) for e in examples], dtype=np.int32),
                            output_lengths=np.asarray([len(e.output_ids) for e in examples], dtype=np.int32))


def load_corpus(path: Path) -> list[Example]:
    with np.load(path) as data:
        tokens, prompts, outputs = data["tokens"].astype(np.int64).tolist(), data["prompt_lengths"], data["output_lengths"]
    examples, start = [], 0
    for prompt, output in zip(prompts.tolist(), outputs.tolist()):
        examples.append(Example(tuple(tokens[start : start + prompt]), tuple(tokens[start + prompt : start + prompt + output])))
        start += prompt + output
    return examples


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
