"""The target's own predictions, recycled: the top-k of a verification forward's logits at every
verified position, for a drafter that learns from them (actors/recycling.py, Token Recycling).

`top_predictions` reads logits the verification has already computed (no extra forward, no
extra vocabulary projection): one `topk` and one `logsumexp` over the verified rows. Padding
rows (throwaway positions of a padded forward) are left out. The rows off the accepted path
come first and the accepted path's last, so where one token was the input of several rows, the
context the output actually took is written last and wins (the table keeps the latest row).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from actors.recycling_table import EMPTY, TOP_K

# tokens [n] int32, ids [n, k] int32, probs [n, k] float16, previous [n] int32 (the token before each; EMPTY: unknown)
Predictions = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def top_predictions(input_ids: Sequence[int], logits: torch.Tensor, verified: int, accepted_rows: Sequence[int],
                    k: int = TOP_K, parents: Sequence[int] | None = None, before: int = EMPTY) -> Predictions:
    """input_ids: the forward row's input tokens; logits: [>= verified, V] its logits; verified: the
    rows that are the root and the draft's nodes (the rest is padding); accepted_rows: the rows on
    the accepted path; parents: each row's parent row (-1: the root's; None: a chain, each row the
    previous one's child); before: the committed token before the root. -> each verified row's
    input token with the target's k most likely next tokens there and their probabilities
    (temperature 1) and the token before it, the accepted path last."""
    on_path = [row for row in accepted_rows if row < verified]
    off_path = sorted(set(range(verified)) - set(on_path))
    rows = off_path + on_path
    scores = logits[rows].float()  # [n, V]
    top = torch.topk(scores, min(k, scores.shape[-1]), dim=-1)
    probs = (top.values - torch.logsumexp(scores, dim=-1, keepdim=True)).exp()
    tokens = np.asarray([input_ids[row] for row in rows], dtype=np.int32)
    parent = [(row - 1 if parents is None else parents[row]) for row in rows]
    previous = np.asarray([before if p < 0 else input_ids[p] for p in parent], dtype=np.int32)
    return tokens, top.indices.numpy().astype(np.int32), probs.numpy().astype(np.float16), previous


def joined(chunks: Sequence[Predictions]) -> Predictions:
    """Several rounds' predictions as one, in order."""
    if len(chunks) == 1:
        return chunks[0]
    return tuple(np.concatenate(parts) for parts in zip(*chunks))  # type: ignore[return-value]
