"""A distilled drafter model: a few decoder layers and a reduced-vocabulary head over the target's tokenizer.

`ReducedHeadLM` wraps a (layer-truncated) transformers causal LM: the decoder runs as usual (its
own KV cache), but the output projection covers only `head_ids`, the tokens the task's corpus
uses, so a drafted token costs a fraction of a full-vocabulary projection. `forward` returns
logits over the full vocabulary (-inf outside the head), so it drops into `HFModelProposer`
unchanged; `head_logits` gives the reduced logits for training.

Saved as what differs from the target it was distilled from (a few MB, small enough to ship):
`distill.safetensors` holds, float16, each adapted projection's low-rank delta (`<module>.delta_a`
[r, in], `<module>.delta_b` [out, r]: the weight is the target's plus delta_b @ delta_a), the
trained norms (whole), the head (`head.weight` [V', H], `head.ids` [V']); `distill.json` says how
it was built, its target and layer count among it. `load_distilled` takes the target's first
layers and embeddings (actors/models.load_draft_model loads them), adds the deltas and norms,
and takes actors/cpu_linear.py's few-row products where they are faster, as the target does.
On CPU it drafts through actors/compact_step.py (`for_drafting`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from actors import cpu_linear

WEIGHTS_FILE = "distill.safetensors"
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

    def save(self, out_dir: Path, meta: dict, deltas: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Save as the difference from the target: deltas maps a projection's module name to (delta_a, delta_b);
        every trained norm is saved whole. meta must name the target (`target`)."""
        from safetensors.torch import save_file

        tensors = {f"{name}.delta_a": a for name, (a, b) in deltas.items()} | {f"{name}.delta_b": b for name, (a, b) in deltas.items()}
        tensors |= {name: p for name, p in self.base.named_parameters() if name.endswith("norm.weight")}
        tensors |= {"head.weight": self.head.weight, "head.ids": self.head_ids.to(torch.int32)}
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file({name: t.detach().to(torch.float16 if t.is_floating_point() else t.dtype).contiguous().cpu()
                   for name, t in tensors.items()}, str(out_dir / WEIGHTS_FILE))
        (out_dir / META_FILE).write_text(json.dumps(meta | {"num_layers": int(self.config.num_hidden_layers)}, indent=1))


def is_distilled_dir(path: Path) -> bool:
    return (path / WEIGHTS_FILE).is_file() and (path / META_FILE).is_file()


def distilled_meta(path: Path) -> dict:
    """How the drafter saved at `path` was built: its `target` and `num_layers` among it."""
    return json.loads((path / META_FILE).read_text())


def load_distilled(path: Path, base: torch.nn.Module, device: torch.device | str = "cpu") -> ReducedHeadLM:
    """The drafter saved at `path`, from `base`: its target's causal LM cut to its first
    distilled_meta(path)["num_layers"] layers (actors/models.load_draft_model loads it), changed in place."""
    from safetensors.torch import load_file

    tensors = {name: t.to(torch.float32) if t.is_floating_point() else t for name, t in load_file(str(path / WEIGHTS_FILE)).items()}
    head_weight, head_ids = tensors.pop("head.weight"), tensors.pop("head.ids")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name.endswith(".delta_a"):
                module = name.removesuffix(".delta_a")
                base.get_submodule(module).weight += tensors[f"{module}.delta_b"] @ tensor
            elif not name.endswith(".delta_b"):
                base.get_parameter(name).copy_(tensor)
    model = ReducedHeadLM(base, head_ids, head_weight).to(device).eval()
    cpu_linear.install(model)  # a drafted token is a one-row product: ~25% faster here
    return model
