"""Incremental detokenising: a streamed output's new text from its new tokens, each token decoded once.

`IncrementalDetokenizer(target).add(tokens) -> str`: the text these tokens complete. With a fast
tokenizer it is tokenizers' `DecodeStream` (it decodes a short window of the latest tokens, so a
token costs the same however long the output is, and holds back an incomplete UTF-8 character until
its last byte comes). The pieces concatenate to `target.decode(every token)`. A tokenizer without a
fast backend falls back to decoding the whole output on each call and returning what is new (held
at a trailing replacement character): the same pieces, at a cost that grows with the output.
"""
from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    def __init__(self, target) -> None:  # target: deploy.engine.target.TargetModel (tokenizer, decode)
        backend = getattr(target.tokenizer, "backend_tokenizer", None)
        self._target, self._backend = target, backend
        if backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)
        else:
            self._tokens: list[int] = []
            self._emitted = 0  # characters of the whole decoded text already returned

    def add(self, tokens: Sequence[int]) -> str:
        if not tokens:
            return ""
        if self._backend is not None:
            return self._stream.step(self._backend, list(tokens)) or ""
        self._tokens.extend(tokens)
        text = self._target.decode(self._tokens)
        end = len(text)
        while end > self._emitted and text[end - 1] == "\ufffd":  # an incomplete UTF-8 character, so far
            end -= 1
        piece, self._emitted = text[self._emitted : end], max(self._emitted, end)
        return piece
