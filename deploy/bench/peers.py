"""Peer runs: what a user would run instead, on the same model object, prompts and machine.

`peer:hf-generate` is Hugging Face transformers' `generate` (greedy, KV cache);
`peer:hf-prompt-lookup` adds its prompt-lookup drafting (`prompt_lookup_num_tokens=10`, the
value its documentation uses, and its default 2-gram matching); `peer:hf-assistant` uses the
configured draft model as its assistant model (its default dynamic draft-length schedule). Each
gets an explicit greedy GenerationConfig with the target's EOS ids, so its output is comparable
token for token with `ar`; the EOS token and anything after it are dropped, as the engine does.
"""
from __future__ import annotations

import time

import torch

from actors.errors import InvalidRequestError
from deploy.bench.prompts import BenchPrompt
from deploy.bench.sample import Sample
from deploy.spec.target import TargetModel

PEERS = ("hf-generate", "hf-prompt-lookup", "hf-assistant")
PROMPT_LOOKUP_NUM_TOKENS = 10


def available_peers(has_draft_model: bool) -> list[str]:
    return [p for p in PEERS if p != "hf-assistant" or has_draft_model]


class HFPeer:
    def __init__(self, name: str, target: TargetModel, draft_model: torch.nn.Module | None = None) -> None:
        if name not in PEERS:
            raise InvalidRequestError("runs", f"unknown peer {name!r}; known: {list(PEERS)}")
        if name == "hf-assistant" and draft_model is None:
            raise InvalidRequestError("runs", "peer:hf-assistant needs a draft model (--draft-model)")
        self.name, self.target = name, target
        self.options: dict = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_NUM_TOKENS} if name == "hf-prompt-lookup" else {}
        self.assistant = {"assistant_model": draft_model} if name == "hf-assistant" else {}

    def _config(self, max_tokens: int):
        from transformers import GenerationConfig

        eos = sorted(self.target.eos_ids)
        return GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos,
                                pad_token_id=eos[0] if eos else None, **self.options)

    @torch.inference_mode()
    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        start = time.perf_counter()
        ids = self.target.encode(prompt=item.prompt, messages=item.messages)
        input_ids = torch.tensor([ids], device=self.target.device)
        out = self.target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                         generation_config=self._config(max_tokens), **self.assistant)
        new = out[0, len(ids):].tolist()
        seconds = time.perf_counter() - start
        for i, token in enumerate(new):
            if token in self.target.eos_ids:
                new = new[:i]
                break
        return Sample.from_tokens(new, seconds)
