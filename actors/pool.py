"""Build a drafter pool from names: the only place that knows every drafter kind.

Kinds: `ngram` (prompt lookup), `suffix` (cache of past requests), `hierarchy` (context, then past
requests, then the model drafter if any), `hf` (a model drafter; needs a draft model: one of the
target's vocabulary drafts its tokens, one of another family, loaded with its own tokenizer,
drafts text across the vocabularies, actors/cross_vocab.py), `none`
(the no-draft arm), `eagle` (an EAGLE-style head on the target's features, trained for the target by
`specfleet train-eagle`; actors/eagle.py), `recycling` (Token Recycling: a draft tree from the target's
own earlier predictions, over the prior `specfleet recycling-prior` builds; actors/recycling.py), and the task specialists
(shipped for the embedded default, or built by `specfleet specialists`; actors/specialists.py),
which like `hierarchy` draft from the request's own context first (prompt lookup) and then from
their task knowledge: `retrieval-<task>` (its datastore, when it matches a longer tail) and
`distill-<task>` (its distilled model), and `othervocab` (the same build's LM of another
vocabulary, drafting through actors/cross_vocab.py). Unknown or unbuilt names raise
InvalidRequestError naming `drafters`.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.errors import InvalidRequestError
from actors.hf import HFModelProposer
from actors.hierarchy import HierarchyProposer
from actors.models import DEFAULT_MODEL
from actors.ngram import NgramProposer
from actors.no_draft import NO_DRAFT, NoDraftProposer
from actors.proposal import Proposer
from actors.recycling import RECYCLING
from actors.specialists import OTHER_VOCAB, available_specialists, is_specialist, specialist_path
from actors.suffix import SuffixProposer

DRAFTER_KINDS = ("ngram", "suffix", "hierarchy", "hf", "eagle", RECYCLING, NO_DRAFT)
DEFAULT_DRAFTERS = ("ngram", "suffix", "hierarchy", NO_DRAFT)  # the default pool on CPU
# on a GPU, where a verification forward over a 30-node tree costs about a plain step, the default pool drafts
# Token Recycling's tree too (chosen on the development prompts: docs/benchmarks.md, "Token Recycling")
GPU_DEFAULT_DRAFTERS = ("ngram", "suffix", "hierarchy", RECYCLING, NO_DRAFT)
POOLS = ("default", "specialists")
DISTILL_MIN_CONFIDENCE = 0.4  # a distilled specialist stops drafting after a token it is less sure of


def is_drafter_kind(name: str) -> bool:
    return name in DRAFTER_KINDS or is_specialist(name)


def needs_model(kind: str, model: str | None = None) -> bool:
    """Whether a drafter of `kind` (with `model` configured) runs a model: `hf`, `eagle`, a
    distilled specialist, a `hierarchy` with a model source. The others look tokens up (or, `none`,
    draft nothing) in microseconds."""
    return (kind in ("hf", "eagle", OTHER_VOCAB) or kind.startswith("distill-")
            or (kind == "hierarchy" and model is not None))


def default_drafters(device: str | None = None) -> tuple[str, ...]:
    """The default pool for a target on `device` ("cpu", "cuda"; None: this process's default device):
    on a GPU the generic drafters and `recycling`, on CPU the generic drafters (there the recycled
    tree's larger forwards and its planning cost more than it yields)."""
    if device is None:
        from actors.models import default_device

        device = default_device().type
    return GPU_DEFAULT_DRAFTERS if str(device).startswith("cuda") else DEFAULT_DRAFTERS


def pool_drafters(pool: str, target: str = DEFAULT_MODEL) -> tuple[str, ...]:
    """`default`: the generic drafters (default_drafters); `specialists`: those plus every specialist
    built here or shipped for `target` (actors/specialists.py)."""
    if pool not in POOLS:
        raise InvalidRequestError("pool", f"must be one of {list(POOLS)}, got {pool!r}")
    if pool == "default":
        return default_drafters()
    available = available_specialists(target)
    if not available:
        raise InvalidRequestError("pool", f"no specialists are built here or shipped for {target!r}: "
                                          f"run `specfleet specialists --model {target}` first")
    return default_drafters() + available


def parse_drafter_names(names: str | Sequence[str]) -> tuple[str, ...]:
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not items:
        raise InvalidRequestError("drafters", "needs at least one drafter")
    unknown = [n for n in items if not is_drafter_kind(n)]
    if unknown:
        raise InvalidRequestError("drafters", f"unknown drafter(s) {unknown}; known: {list(DRAFTER_KINDS)} "
                                              f"and the specialists retrieval-<task>, distill-<task>, {OTHER_VOCAB}")
    if len(set(items)) != len(items):
        raise InvalidRequestError("drafters", f"duplicate drafter in {items}")
    return tuple(items)


def build_drafters(
    names: str | Sequence[str] = DEFAULT_DRAFTERS,
    draft_model: torch.nn.Module | None = None,
    target_vocab_size: int | None = None,
    target: str = DEFAULT_MODEL,
    eagle_head: str | None = None,
) -> dict[str, Proposer]:
    """Fresh drafters (empty caches, no sessions), keyed by name. `target`: the target's name as
    --model gives it; `eagle` loads the head built for it on this machine or shipped in the
    repository (actors/eagle_head.find_head), or the head directory `eagle_head` when given."""
    pool: dict[str, Proposer] = {}
    for name in parse_drafter_names(names):
        if name == "ngram":
            pool[name] = NgramProposer()
        elif name == "suffix":
            pool[name] = SuffixProposer()
        elif name == NO_DRAFT:
            pool[name] = NoDraftProposer()
        elif name == RECYCLING:
            pool[name] = _recycling(target, target_vocab_size)
        elif name == "hf":
            if draft_model is None:
                raise InvalidRequestError("drafters", "'hf' needs a draft model (--draft-model)")
            pool[name] = _model_drafter(draft_model, "hf", target_vocab_size, target)
        elif name == "eagle":
            pool[name] = _eagle(target, target_vocab_size, eagle_head)
        elif name == "hierarchy":
            sources: list[Proposer] = [NgramProposer(name="hierarchy.ngram", min_n=2), SuffixProposer(name="hierarchy.suffix", min_match=4)]
            if draft_model is not None:
                sources.append(_model_drafter(draft_model, "hierarchy.hf", target_vocab_size, target))
            pool[name] = HierarchyProposer(sources)
        else:
            pool[name] = _specialist(name, target_vocab_size, target)
    return pool


def _model_drafter(model: torch.nn.Module, name: str, target_vocab_size: int | None, target: str,
                   min_confidence: float = 0.0) -> Proposer:
    """A model drafter: over the target's tokens when it shares the target's vocabulary, else
    across vocabularies as text (actors/cross_vocab.py) with the tokenizer it was loaded with
    (actors/models.load_draft_model)."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    tokenizer = getattr(model, "tokenizer", None)
    if target_vocab_size is None or vocab == target_vocab_size or tokenizer is None:
        return HFModelProposer(model, name=name, target_vocab_size=target_vocab_size, min_confidence=min_confidence)
    from actors.cross_vocab import CrossVocabularyProposer
    from actors.models import load_tokenizer

    return CrossVocabularyProposer(model, tokenizer, load_tokenizer(target), name=name, min_confidence=min_confidence)


def _recycling(target: str, target_vocab_size: int | None) -> Proposer:
    """Token Recycling over the prior built for `target` (on this machine, else shipped), or, for a
    target without one, over an empty prior of its vocabulary (it then drafts from what its
    tenants' requests write)."""
    from actors.recycling import RecyclingProposer
    from actors.recycling_table import RecyclingTable, empty_prior, find_prior, load_prior

    path = find_prior(target)
    if path is not None:
        prior = load_prior(path)
        if target_vocab_size is not None and prior.vocab_size < target_vocab_size:
            raise InvalidRequestError("drafters", f"the recycling prior at {path} has {prior.vocab_size} rows, the "
                                                  f"target {target_vocab_size} tokens: rebuild it (specfleet recycling-prior)")
    else:
        from actors.models import model_vocab_size

        prior = empty_prior(target_vocab_size or model_vocab_size(target))
    return RecyclingProposer(RecyclingTable(prior))


def _eagle(target: str, target_vocab_size: int | None, head_dir: str | None) -> Proposer:
    from pathlib import Path

    from actors.eagle import EagleProposer
    from actors.eagle_head import find_head, is_head_dir, load_head
    from actors.models import default_device, load_embeddings

    path = Path(head_dir).expanduser() if head_dir else find_head(target)
    if head_dir and not is_head_dir(path):
        raise InvalidRequestError("model", f"{head_dir!r} is not an eagle head directory (specfleet train-eagle --out)")
    if path is None:
        raise InvalidRequestError("drafters", f"'eagle' has no head for the target {target!r}: "
                                              f"run `specfleet train-eagle --model {target}` (or `make eagle`)")
    config, embeddings = load_embeddings(target)
    if target_vocab_size is not None and embeddings.shape[0] != target_vocab_size:
        raise InvalidRequestError("drafters", f"the target {target!r} has {embeddings.shape[0]} tokens, "
                                              f"the engine's {target_vocab_size}")
    try:
        head = load_head(path, config, embeddings, default_device())
    except ValueError as err:
        raise InvalidRequestError("drafters", f"{err}: train it again for this target") from err
    return EagleProposer(head)


def _specialist(name: str, target_vocab_size: int | None, target: str) -> Proposer:
    from actors.compact_step import for_drafting
    from actors.models import load_draft_model
    from actors.retrieval import RetrievalProposer
    from actors.specialists import task_datastore

    path = specialist_path(name, target)
    if path is None:
        raise InvalidRequestError("drafters", f"{name!r} is neither built on this machine nor shipped for {target!r}: "
                                              f"run `make specialists`")
    if name == OTHER_VOCAB:  # a model of its own vocabulary (deploy/specialists/other_vocab.py)
        model = load_draft_model(str(path))  # on the default device, as every loaded model
        from actors.cross_vocab import CrossVocabularyProposer
        from actors.models import load_tokenizer

        return CrossVocabularyProposer(for_drafting(model), model.tokenizer, load_tokenizer(target), name=name)
    if name.startswith("retrieval-"):
        return RetrievalProposer(task_datastore(path, name.removeprefix("retrieval-"), target), name=name)
    model = HFModelProposer(for_drafting(load_draft_model(str(path))), name=f"{name}.model",
                            target_vocab_size=target_vocab_size, min_confidence=DISTILL_MIN_CONFIDENCE)
    return HierarchyProposer([NgramProposer(name=f"{name}.context", min_n=2), model], name=name)
