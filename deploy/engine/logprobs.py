"""The target's log-probabilities of the tokens it emits (OpenAI's `logprobs` / `top_logprobs`).

`token_logprobs(logits, rows, tokens, top)`: for each emitted token, the log-softmax of the target's
raw logits at the forward row that decided it (before temperature, top-k and top-p: vLLM's default
`raw_logprobs`), the token's own log-probability and the `top` most likely alternatives. They come
from the verification forward that already ran, so asking for them costs no extra forward.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


def token_logprobs(logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int], top: int) -> tuple[TokenLogprob, ...]:
    """logits: [R, V] of one forward; rows[i]: the row whose distribution emitted tokens[i]."""
    log_p = torch.log_softmax(logits[list(rows)].float(), dim=-1)  # [n, V]
    chosen = log_p[torch.arange(len(tokens)), torch.tensor(list(tokens), dtype=torch.long)].tolist()
    if top:
        values, ids = torch.topk(log_p, top, dim=-1)
        alternatives = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        alternatives = [()] * len(tokens)
    return tuple(TokenLogprob(int(t), lp, alt) for t, lp, alt in zip(tokens, chosen, alternatives))
