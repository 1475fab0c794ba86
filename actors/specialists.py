"""Where built task specialists live, which exist, and how a specialist drafter's name maps to them.

A specialist drafter is named `<kind>-<task>`: `retrieval-<task>` (a REST-style datastore,
actors/retrieval.py) or `distill-<task>` (a distilled drafter model, actors/distilled.py). Both are
built once by `specfleet specialists` (`make specialists`) under $SPECFLEET_CACHE/specialists/<task>/
(`datastore.npz`, `distill/`); nothing large is kept in git. `othervocab` is the generic drafter of
another vocabulary the same build makes (deploy/specialists/other_vocab.py; a transformers
directory with its own tokenizer under specialists/othervocab/). On a cluster, every node that
runs a specialist drafter needs the same directory.
"""
from __future__ import annotations

import re
from pathlib import Path

from actors.models import cache_root

SPECIALIST_KINDS = ("retrieval", "distill")
SPECIALIST_NAME = re.compile(r"^(retrieval|distill)-([a-z0-9_]+)$")
DATASTORE_FILE = "datastore.npz"
DISTILL_DIR = "distill"
MANIFEST_FILE = "manifest.json"
OTHER_VOCAB = "othervocab"  # the drafter of another vocabulary (its directory's name too)
OTHER_VOCAB_EXAMPLES = 3845  # the eagle corpus's answers it trains on, all of them (one epoch: about 11 minutes here)


def specialists_root() -> Path:
    return cache_root() / "specialists"


def specialist_path(name: str) -> Path:
    """retrieval-<task> -> its datastore file; distill-<task>, othervocab -> its model directory."""
    if name == OTHER_VOCAB:
        return specialists_root() / OTHER_VOCAB
    kind, task = SPECIALIST_NAME.match(name).groups()
    return specialists_root() / task / (DATASTORE_FILE if kind == "retrieval" else DISTILL_DIR)


def is_specialist(name: str) -> bool:
    return name == OTHER_VOCAB or SPECIALIST_NAME.match(name) is not None


def built_specialists() -> tuple[str, ...]:
    """The specialist drafters built on this machine, retrieval first, tasks sorted."""
    root = specialists_root()
    tasks = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != OTHER_VOCAB) if root.is_dir() else []
    names = [f"{kind}-{task}" for kind in SPECIALIST_KINDS for task in tasks] + [OTHER_VOCAB]
    return tuple(n for n in names if specialist_path(n).exists())
