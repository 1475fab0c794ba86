"""The drafting contract: what a drafter returns (`Proposal`) and what it implements (`Proposer`).

A Proposal is plain data (tuples of ints and floats), so it crosses an RPC boundary unchanged.
`q` holds one `SparseDist` per drafted position, or is None for a point mass (n-gram, suffix,
greedy drafting). Under sampling, q is exactly the distribution each token was sampled from
(zero outside `ids`); under greedy decoding verification ignores q, and a model drafter sends its
temperature-1 distribution so the BD reward can compare it with the target's.

A drafter that drafts a token tree (the eagle head) sends one chain with the other root-to-leaf
chains as `branches`; the engine verifies them as one tree (deploy/engine/draft_tree.py). Under
sampling the chains are independent draws, each token from its q given its own chain.
`confidence` is the drafter's own probability of each token given the ones before it, which the
engine calibrates against what the target accepts (deploy/engine/draft_length.py), per depth and
per `ranks` (each token's rank among its source's candidates) when the drafter states them.

A Proposer keeps one session per request. Each `propose` call carries `context_delta`: the
committed tokens (prompt, then accepted output) the drafter has not seen yet for that session;
its own earlier draft tokens are never committed unless the target accepted them, in which case
they arrive again in a later delta. `release` ends the session with the last unseen tokens, so
drafters that learn from finished requests (suffix cache) see the whole sequence. `model_free`
marks a drafter that drafts without a model (n-gram, suffix): cheap enough for the coordinator to
ask every round and score counterfactually (policy/coordinator.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from actors.sampling import SamplingParams

BRANCH = "branch"  # the source of a draft tree's chains after its first (`Proposal.chains`)


@dataclass(frozen=True)
class SparseDist:
    """A distribution that is zero outside `ids`; probs sum to 1."""

    ids: tuple[int, ...]
    probs: tuple[float, ...]


@dataclass(frozen=True)
class Proposal:
    drafter: str
    token_ids: tuple[int, ...] = ()
    q: tuple[SparseDist, ...] | None = None  # None = point mass on each drafted token
    draft_s: float = 0.0
    match_length: int = 0  # context tokens the draft's source matched (n-gram tail, datastore tail); 0 = unknown
    source: str = ""  # which of a composite drafter's sources drafted it ("" = the drafter itself)
    confidence: tuple[float, ...] | None = None  # per token, the drafter's P(it is right | the tokens before it are)
    branches: tuple["Proposal", ...] = ()  # a draft tree's other root-to-leaf chains (greedy: more likely first)
    ranks: tuple[int, ...] | None = None  # per token, its rank among its source's candidates there (0: the best)

    def __post_init__(self) -> None:
        if self.q is not None and len(self.q) != len(self.token_ids):
            raise ValueError("q must have one distribution per drafted token")
        if self.confidence is not None and len(self.confidence) != len(self.token_ids):
            raise ValueError("confidence must have one value per drafted token")
        if self.ranks is not None and len(self.ranks) != len(self.token_ids):
            raise ValueError("ranks must have one value per drafted token")

    def cut(self, length: int) -> "Proposal":
        """The draft's first `length` tokens (with their q): itself a draft, so verifying it is lossless."""
        if length >= len(self.token_ids):
            return self
        return replace(self, token_ids=self.token_ids[:length], q=None if self.q is None else self.q[:length],
                       confidence=None if self.confidence is None else self.confidence[:length],
                       ranks=None if self.ranks is None else self.ranks[:length])

    def chains(self) -> tuple["Proposal", ...]:
        """The draft as chains: itself, then each branch (the branches carry none of their own)."""
        if not self.branches:
            return (self,)
        return (replace(self, branches=()), *(replace(b, source=BRANCH) for b in self.branches))


@runtime_checkable
class Proposer(Protocol):
    name: str
    model_free: bool

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        """Draft at most k tokens continuing the session's committed context."""
        ...

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        """The request is over: see the last tokens, learn if the drafter learns, free the session."""
        ...


def is_model_free(drafter: object) -> bool:
    """Whether a drafter says it runs no model (drafts for free); one that does not say is a model."""
    return getattr(drafter, "model_free", False) is True


def needs_predictions(drafter: object) -> bool:
    """Whether a drafter learns from the target's own predictions (`needs_predictions = True`,
    actors/recycling.py): it has a `recycle(tenant, tokens, ids, probs)` method, which the
    coordinator calls with the top-k of the target's verification logits before it drafts."""
    return getattr(drafter, "needs_predictions", False) is True


def needs_features(drafter: object) -> bool:
    """Whether a drafter reads the target's features (`needs_features = True`, actors/eagle.py): its
    `propose` takes a fifth argument, the features of the committed positions it has not seen. Only
    a drafter that says so gets them."""
    return getattr(drafter, "needs_features", False) is True
