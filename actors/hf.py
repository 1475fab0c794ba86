"""Model drafter: a small causal LM that shares the target's tokenizer.

Keeps its own KV cache per request (transformers', or a compact model's: actors/compact_step.py,
whose logits cover its reduced head's tokens only, mapped back to token ids). On each call it
crops the cache to the longest common prefix of what it has cached (including its own rejected
drafts) and the committed context, prefills only the rest, then drafts k tokens one forward at a
time. Greedy drafting takes the argmax and sends its temperature-1 distribution (top `q_top_n`,
for the BD reward); sampled drafting draws from the top `q_top_n` of its warped distribution,
renormalised, and sends exactly that q, so verification stays lossless. With `min_confidence` > 0
the draft ends after a token the drafter gave less than that probability (as transformers'
assistant confidence threshold): the tokens it would likely lose are neither drafted nor verified.
A drafter whose vocabulary differs from the target's is refused (the pool gives one loaded with
its own tokenizer to actors/cross_vocab.py).
"""
from __future__ import annotations

import secrets
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from actors.compact_step import CompactLM
from actors.errors import InvalidRequestError
from actors.kv_cache import common_prefix_length, crop_cache
from actors.proposal import Proposal, SparseDist
from actors.sampling import SamplingParams, warp_probs
from actors.session import SessionStore


@dataclass
class _DraftState:
    cache: object  # transformers DynamicCache
    cached: list[int] = field(default_factory=list)  # tokens whose K/V are in `cache`
    generator: torch.Generator | None = None


def sparse_top(probs: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """probs: [V] -> (ids [n], renormalised probs [n]) of the top_n non-zero entries."""
    values, ids = torch.topk(probs, min(top_n, probs.shape[-1]))
    keep = values > 0
    values, ids = values[keep], ids[keep]
    return ids, values / values.sum()


def drafting_generator(sampling: SamplingParams, drafter: str) -> torch.Generator:
    """A sampled request's drafting randomness: from its seed (made distinct per drafter) when it has one."""
    seed = secrets.randbits(62) if sampling.seed is None else (sampling.seed ^ zlib.crc32(drafter.encode()))
    return torch.Generator().manual_seed(seed)


def draft_position(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None, top_n: int,
                   vocabulary: torch.Tensor | None = None) -> tuple[int, SparseDist, float]:
    """One drafted position from a model drafter's logits [V]: the token (the argmax under greedy,
    else drawn from the top_n of the warped distribution, renormalised), the q it was drawn from
    (under greedy the temperature-1 one, for the BD reward) and the warped probability of the
    token. `vocabulary` maps the logits' indices to token ids (a reduced head's)."""
    probs = warp_probs(logits, sampling)  # [V]; temperature 1 under greedy
    ids, q_probs = sparse_top(probs, top_n)
    index = int(torch.argmax(logits)) if sampling.greedy else int(ids[torch.multinomial(q_probs, 1, generator=generator)])
    confidence = float(probs[index])
    if vocabulary is not None:
        index, ids = int(vocabulary[index]), vocabulary[ids]
    return index, SparseDist(tuple(ids.tolist()), tuple(q_probs.tolist())), confidence


def new_draft_state(model: torch.nn.Module | CompactLM) -> _DraftState:
    """A session's drafting state: an empty KV cache for `model` (transformers', or a compact model's own)."""
    if isinstance(model, CompactLM):
        return _DraftState(cache=model.new_cache())
    from transformers import DynamicCache

    return _DraftState(cache=DynamicCache(config=model.config))


def append_tokens(model: torch.nn.Module, state: _DraftState, token_ids: Sequence[int]) -> torch.Tensor:
    """Append tokens to the drafter's cache. -> logits of the last position [V] (float32, CPU)."""
    device = model.device if isinstance(model, CompactLM) else next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)  # [1, n]
    out = model(input_ids=ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
    state.cached.extend(token_ids)
    return out.logits[0, -1].float().cpu()


def catch_up(model: torch.nn.Module, state: _DraftState, tokens: Sequence[int]) -> torch.Tensor:
    """The cache cropped to its longest common prefix with `tokens` (its own rejected drafts go),
    the rest prefilled (at least the last token). -> logits after `tokens` [V]."""
    keep = min(common_prefix_length(state.cached, tokens), len(tokens) - 1)
    crop_cache(state.cache, keep)
    del state.cached[keep:]
    return append_tokens(model, state, tokens[keep:])


class HFModelProposer:
    model_free = False

    def __init__(self, model: torch.nn.Module, name: str = "hf", target_vocab_size: int | None = None, q_top_n: int = 64,
                 min_confidence: float = 0.0) -> None:
        vocab = model.vocab_size if isinstance(model, CompactLM) else int(model.get_output_embeddings().weight.shape[0])
        if target_vocab_size is not None and vocab != target_vocab_size:
            raise InvalidRequestError(
                "drafters",
                f"drafter {name!r} has a vocabulary of {vocab} tokens but the target has {target_vocab_size}; "
                "an hf drafter must share the target's tokenizer",
            )
        self.name, self.model, self.q_top_n, self.min_confidence = name, model, q_top_n, min_confidence
        self.vocabulary = model.vocabulary if isinstance(model, CompactLM) else None  # a reduced head's token ids
        self.sessions = SessionStore()

    def _new_state(self) -> _DraftState:
        return new_draft_state(self.model)

    @torch.inference_mode()
    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=self._new_state)
        tokens, state = entry.tokens, entry.state
        if not tokens or k <= 0:
            return Proposal(drafter=self.name)
        if state.generator is None and not sampling.greedy:
            state.generator = drafting_generator(sampling, self.name)
        logits = catch_up(self.model, state, tokens)
        draft: list[int] = []
        q: list[SparseDist] = []
        for j in range(k):
            token, dist, confidence = draft_position(logits, sampling, state.generator, self.q_top_n, self.vocabulary)
            draft.append(token)
            q.append(dist)
            if confidence < self.min_confidence:
                break
            if j < k - 1:
                logits = append_tokens(self.model, state, [token])
        return Proposal(self.name, tuple(draft), tuple(q), time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
