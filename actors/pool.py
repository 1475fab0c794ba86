"""Build a drafter pool from names: the only place that knows every drafter kind.

Kinds: `ngram` (prompt lookup), `suffix` (cache of past requests), `hierarchy` (context, then past
requests, then the model drafter if any), `hf` (a model drafter; needs a draft model), and `none`
(the no-draft arm). Unknown names raise InvalidRequestError naming `drafters`.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.hf import HFModelProposer
from actors.hierarchy import HierarchyProposer
from actors.ngram import NgramProposer
from actors.no_draft import NO_DRAFT, NoDraftProposer
from actors.proposal import Proposer
from actors.suffix import SuffixProposer
from deploy.errors import InvalidRequestError

DRAFTER_KINDS = ("ngram", "suffix", "hierarchy", "hf", NO_DRAFT)
DEFAULT_DRAFTERS = ("ngram", "suffix", "hierarchy", NO_DRAFT)


def parse_drafter_names(names: str | Sequence[str]) -> tuple[str, ...]:
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not items:
        raise InvalidRequestError("drafters", "needs at least one drafter")
    unknown = [n for n in items if n not in DRAFTER_KINDS]
    if unknown:
        raise InvalidRequestError("drafters", f"unknown drafter(s) {unknown}; known: {list(DRAFTER_KINDS)}")
    if len(set(items)) != len(items):
        raise InvalidRequestError("drafters", f"duplicate drafter in {items}")
    return tuple(items)


def build_drafters(
    names: str | Sequence[str] = DEFAULT_DRAFTERS,
    draft_model: torch.nn.Module | None = None,
    target_vocab_size: int | None = None,
) -> dict[str, Proposer]:
    """Fresh drafters (empty caches, no sessions), keyed by name."""
    pool: dict[str, Proposer] = {}
    for name in parse_drafter_names(names):
        if name == "ngram":
            pool[name] = NgramProposer()
        elif name == "suffix":
            pool[name] = SuffixProposer()
        elif name == NO_DRAFT:
            pool[name] = NoDraftProposer()
        elif name == "hf":
            if draft_model is None:
                raise InvalidRequestError("drafters", "'hf' needs a draft model (--draft-model)")
            pool[name] = HFModelProposer(draft_model, name="hf", target_vocab_size=target_vocab_size)
        elif name == "hierarchy":
            sources: list[Proposer] = [NgramProposer(name="hierarchy.ngram"), SuffixProposer(name="hierarchy.suffix", min_match=4)]
            if draft_model is not None:
                sources.append(HFModelProposer(draft_model, name="hierarchy.hf", target_vocab_size=target_vocab_size))
            pool[name] = HierarchyProposer(sources)
    return pool
