"""A distilled drafter model: a few decoder layers and a reduced-vocabulary head over the target's tokenizer.

`ReducedHeadLM` wraps a (layer-truncated) transformers causal LM: the decoder runs as usual (its
own KV cache), but the output projection covers only `head_ids`, the tokens the task's corpus
uses, so a drafted token costs a fraction of a full-vocabulary projection. `forward` returns
logits over the full vocabulary (-inf outside the head), so it drops into `HFModelProposer`
unchanged; `head_logits` gives the reduced logits for training. Saved as a transformers
directory plus `head.safetensors` (weight [V', H], ids [V']) and `distill.json` (how it was built).
A loaded drafter takes actors/cpu_linear.py's few-row products where they are faster, as the target does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from actors import cpu_linear

HEAD_FILE = "head.safetensors"
META_FILE = "distill.json"


@dataclass
class _Output:
    logits: torch.Tensor  # [B, n, V]


class ReducedHeadLM(torch.nn.Module):
    def __init__(self, base: torch.nn.Module, head_ids: torch.Tensor, head_weight: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.config = base.config
        self.register_buffer("head_ids", head_ids.to(torch.long), persistent=False)
        self.head = torch.nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        with torch.no_grad():
            self.head.weight.copy_(head_weight)

    def get_output_embeddings(self) -> torch.nn.Module:
        """The full-vocabulary projection whose rows the head keeps (its size is the vocabulary's)."""
        return self.base.get_output_embeddings()

    def head_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    past_key_values: object = None, use_cache: bool = False, logits_to_keep: int = 0) -> torch.Tensor:
        """-> [B, n, V'] logits over head_ids (the last logits_to_keep positions; 0 = all)."""
        hidden = self.base.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                                 use_cache=use_cache).last_hidden_state
        return self.head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)

    def forward(self, input_ids: torch.Tensor, past_key_values: object = None, use_cache: bool = True,
                logits_to_keep: int = 0) -> _Output:
        reduced = self.head_logits(input_ids, past_key_values=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep)
        full = reduced.new_full((*reduced.shape[:-1], int(self.config.vocab_size)), float("-inf"))
        full[..., self.head_ids] = reduced
        return _Output(full)

    def save(self, out_dir: Path, meta: dict) -> None:
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        self.base.save_pretrained(out_dir)
        save_file({"weight": self.head.weight.detach().contiguous(), "ids": self.head_ids.cpu()}, str(out_dir / HEAD_FILE))
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=1))


def is_distilled_dir(path: Path) -> bool:
    return (path / HEAD_FILE).is_file() and (path / META_FILE).is_file()


def load_distilled(path: Path, device: torch.device | str = "cpu") -> ReducedHeadLM:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    head = load_file(str(path / HEAD_FILE))
    model = ReducedHeadLM(base, head["ids"], head["weight"]).to(device).eval()
    cpu_linear.install(model)  # a drafted token is a one-row product: ~25% faster here
    return model
