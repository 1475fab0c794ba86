"""KV-cache helpers shared by the target and model drafters (transformers DynamicCache).

`crop_cache` rolls a cache back to `length` positions; `common_prefix_length` finds how much of a
cached token sequence is still valid for a new committed context.
"""
from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def crop_cache(cache: object, length: int) -> None:
    """Drop cached positions beyond `length` (transformers 5 crops by a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
