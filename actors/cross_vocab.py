"""Model drafter of another vocabulary: a small LM with its own tokenizer drafts text for the target.

Lossless speculative decoding with heterogeneous vocabularies (arXiv 2502.05202, string-level
exact match; transformers' universal assisted generation): the committed context (target token
ids) is decoded to text and encoded with the drafter's tokenizer; the drafter keeps its own KV
cache per request and, like `HFModelProposer`, prefills only what differs from what it cached
(its own rejected drafts are cropped). It then drafts its own tokens one forward at a time; their
text is encoded with the target's tokenizer, and that token sequence is the draft.

Token boundaries: the committed context ends on a target token boundary, so the draft's text is
encoded on its own. Its end is not safe: the text after it could merge into its last target token
("Ġwor" + "ld" is the target's "Ġworld", not "Ġwor", "ld"), so the last target token is dropped
unless the drafter ended the text itself (its end-of-text token); bytes of an unfinished UTF-8
character are dropped too. The drafter drafts until the text holds k + 1 target tokens (or
`max_draft_tokens` of its own). Special tokens (the chat template's markers) cross as their text.

The draft is a point mass on each target token (q = None): under greedy decoding verification
compares tokens, and under sampling the drafter draws its text from its own warped distribution
and rejection sampling against a point mass keeps the output exactly the target's distribution
(accept x with p(x), else draw from p without x), whatever drew x. The drafter's own q over its
tokens is not a distribution over the target's tokens, so it is not sent.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from actors.hf import _DraftState, append_tokens, catch_up, draft_position, drafting_generator, new_draft_state
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from actors.session import SessionStore

UNFINISHED = "\ufffd"  # what a byte-level decoder writes for an incomplete UTF-8 character


def target_draft(text: str, target_tokenizer, ended: bool, k: int) -> tuple[int, ...]:
    """The draft's text as at most k target tokens, cut to the last safe boundary: an unfinished
    character dropped, and the last token too unless the drafter `ended` the text."""
    text = text.rstrip(UNFINISHED)
    if not text:
        return ()
    ids = target_tokenizer.encode(text, add_special_tokens=False)
    if not ended:
        ids = ids[:-1]
    return tuple(int(t) for t in ids[:k])


class CrossVocabularyProposer:
    model_free = False

    def __init__(self, model: torch.nn.Module, draft_tokenizer, target_tokenizer, name: str = "othervocab",
                 q_top_n: int = 64, min_confidence: float = 0.0, max_draft_tokens: int | None = None) -> None:
        """model: the drafter's causal LM over draft_tokenizer's vocabulary; target_tokenizer: the
        target's. max_draft_tokens: the most of its own tokens drafted a round (default 2k + 2)."""
        self.name, self.model, self.q_top_n, self.min_confidence = name, model, q_top_n, min_confidence
        self.draft_tokenizer, self.target_tokenizer, self.max_draft_tokens = draft_tokenizer, target_tokenizer, max_draft_tokens
        self.end_ids = frozenset(int(t) for t in (draft_tokenizer.eos_token_id, *_ids(draft_tokenizer, ("<|im_end|>", "<|endoftext|>")))
                                 if t is not None)
        self.sessions = SessionStore()

    def _new_state(self) -> _DraftState:
        return new_draft_state(self.model)

    @torch.inference_mode()
    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=self._new_state)
        if not entry.tokens or k <= 0:
            return Proposal(drafter=self.name)
        state = entry.state
        if state.generator is None and not sampling.greedy:
            state.generator = drafting_generator(sampling, self.name)
        context = self.draft_tokenizer.encode(self.target_tokenizer.decode(entry.tokens, skip_special_tokens=False),
                                              add_special_tokens=False)
        if not context:
            return Proposal(drafter=self.name)
        logits = catch_up(self.model, state, context)
        drafted: list[int] = []
        draft: tuple[int, ...] = ()
        for _ in range(self.max_draft_tokens or 2 * k + 2):
            token, _, confidence = draft_position(logits, sampling, state.generator, self.q_top_n)
            ended = token in self.end_ids
            drafted.append(token)
            draft = target_draft(self.draft_tokenizer.decode(drafted, skip_special_tokens=False), self.target_tokenizer, ended, k)
            if ended or len(draft) >= k or confidence < self.min_confidence:
                break
            logits = append_tokens(self.model, state, [token])
        return Proposal(self.name, draft, None, time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)


def _ids(tokenizer, tokens: Sequence[str]) -> list[int | None]:
    vocab = tokenizer.get_vocab()
    return [vocab.get(t) for t in tokens]
