"""Where task specialists live, which exist, and how a specialist drafter's name maps to them.

A specialist drafter is named `<kind>-<task>`: `retrieval-<task>` (a REST-style datastore,
actors/retrieval.py, built when the drafter loads from the task's corpus of token ids,
`<task>/corpus.npz`, plus the standard library's sources for the tasks of
actors/task_corpus.STDLIB_TASKS) or `distill-<task>` (a distilled drafter model saved as its
difference from the target, `<task>/distill/`, actors/distilled.py). They are found where
`specfleet specialists` builds them on this machine ($SPECFLEET_CACHE/specialists/, first), else
among those the repository ships for the target (actors/data/specialists/<target>/: the embedded
default's five tasks, a few MB in all). `othervocab` is the generic drafter of another
vocabulary the same build makes (deploy/specialists/other_vocab.py; a transformers directory with
its own tokenizer under specialists/othervocab/, built here only). On a cluster, every node that
runs a specialist drafter built here needs the same directory.
"""
from __future__ import annotations

import re
from pathlib import Path

from actors.distilled import is_distilled_dir
from actors.models import DEFAULT_MODEL, cache_root, target_key

SPECIALIST_KINDS = ("retrieval", "distill")
SPECIALIST_NAME = re.compile(r"^(retrieval|distill)-([a-z0-9_]+)$")
CORPUS_FILE = "corpus.npz"
DISTILL_DIR = "distill"
MANIFEST_FILE = "manifest.json"
SHIPPED_SPECIALISTS = Path(__file__).resolve().parent / "data" / "specialists"  # <target>/<task>/..., manifest.json
OTHER_VOCAB = "othervocab"  # the drafter of another vocabulary (its directory's name too)
OTHER_VOCAB_EXAMPLES = 3845  # the eagle corpus's answers it trains on, all of them (one epoch: about 11 minutes here)


def specialists_root() -> Path:
    """Where `specfleet specialists` builds on this machine."""
    return cache_root() / "specialists"


def shipped_specialists(target: str = DEFAULT_MODEL) -> Path:
    """Where the repository keeps the specialists built for the target named `target` (as --model gives it)."""
    return SHIPPED_SPECIALISTS / target_key(target)


def _exists(kind: str, path: Path) -> bool:
    return path.is_file() if kind == "retrieval" else is_distilled_dir(path)


def specialist_path(name: str, target: str = DEFAULT_MODEL) -> Path | None:
    """retrieval-<task> -> its corpus; distill-<task>, othervocab -> its directory: built here, else shipped; None if neither."""
    if name == OTHER_VOCAB:
        path = specialists_root() / OTHER_VOCAB
        return path if path.is_dir() else None
    kind, task = SPECIALIST_NAME.match(name).groups()
    for root in (specialists_root(), shipped_specialists(target)):
        path = root / task / (CORPUS_FILE if kind == "retrieval" else DISTILL_DIR)
        if _exists(kind, path):
            return path
    return None


def is_specialist(name: str) -> bool:
    return name == OTHER_VOCAB or SPECIALIST_NAME.match(name) is not None


def available_specialists(target: str = DEFAULT_MODEL) -> tuple[str, ...]:
    """The specialist drafters built here or shipped for `target`, retrieval first, tasks sorted, othervocab last."""
    roots = [root for root in (specialists_root(), shipped_specialists(target)) if root.is_dir()]
    tasks = sorted({p.name for root in roots for p in root.iterdir() if p.is_dir() and p.name != OTHER_VOCAB})
    names = [f"{kind}-{task}" for kind in SPECIALIST_KINDS for task in tasks] + [OTHER_VOCAB]
    return tuple(n for n in names if specialist_path(n, target) is not None)


def task_datastore(corpus: Path, task: str, target: str = DEFAULT_MODEL):
    """The retrieval datastore of `task`: its corpus's sequences, plus the standard library's sources
    (tokenized by the target's tokenizer) for a task of STDLIB_TASKS. Seconds (the code task's 0.5M tokens: ~5 s here)."""
    from actors.retrieval import TokenDatastore
    from actors.task_corpus import STDLIB_TASKS, load_corpus, python_sources

    sequences = [e.token_ids for e in load_corpus(corpus)]
    if task in STDLIB_TASKS:
        from actors.models import load_tokenizer

        texts = python_sources(STDLIB_TASKS[task])
        sequences += load_tokenizer(target)(texts, add_special_tokens=False)["input_ids"]
    return TokenDatastore.build(sequences)
