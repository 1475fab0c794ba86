"""An EAGLE-style draft head: the target's next top-layer feature from its current one and the next token.

`EagleHead(base, head_ids, head_weight)` holds:
- `fc`: a linear map of [embedding of token x_{t+1}; the target's feature f_t] (2H -> H);
- `base`: a one-decoder-layer model of the target's own class and shape (transformers' base model:
  the target's frozen input embeddings, one decoder layer, the final norm, rotary positions and
  its own KV cache), run on `fc`'s output as its input embeddings;
- `head`: the target's output projection restricted to `head_ids` (frozen rows; a reduced
  vocabulary, as the distilled drafters have).

Pair t of a sequence is (f_t, x_{t+1}); the head's output at pair t, `features(...)`, predicts
f_{t+1} (the target's post-norm last hidden state of token x_{t+1}), and `logits(...)` of it
predicts x_{t+2} over `head_ids`. Drafting feeds the predicted feature back as the next pair's
feature. `from_target` builds an untrained head from a target (layer and norm initialised from
the target's top layer); `save` / `load_eagle` keep it as a transformers directory (the base)
plus `eagle.safetensors` (fc, head rows and ids) and `eagle.json` (how it was built), under
`eagle_dir(target)` ($SPECFLEET_CACHE/eagle/<target>/); nothing large goes into git.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from actors import cpu_linear

EAGLE_FILE = "eagle.safetensors"
META_FILE = "eagle.json"


def eagle_dir(target: str) -> Path:
    """Where `specfleet train-eagle` keeps the generic head for the target named `target` (as --model gives it)."""
    from actors.models import cache_root

    key = target.strip().rstrip("/").replace("/", "--").replace(":", "-") or "target"
    return cache_root() / "eagle" / key


class EagleHead(torch.nn.Module):
    def __init__(self, base: torch.nn.Module, head_ids: torch.Tensor, head_weight: torch.Tensor) -> None:
        super().__init__()
        hidden = int(base.config.hidden_size)
        self.base = base
        self.config = base.config
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.register_buffer("head_ids", head_ids.to(torch.long), persistent=False)
        self.head = torch.nn.Linear(hidden, head_weight.shape[0], bias=False)
        with torch.no_grad():
            self.head.weight.copy_(head_weight)
        self.head.weight.requires_grad_(False)
        self.base.embed_tokens.weight.requires_grad_(False)

    @classmethod
    def from_target(cls, target: torch.nn.Module, head_ids: torch.Tensor) -> "EagleHead":
        """An untrained head for `target` (a transformers causal LM): its embeddings (frozen), its
        top decoder layer and final norm as the starting point, its output rows for `head_ids`."""
        from transformers import AutoModel

        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[-1:]
        base = AutoModel.from_config(config, dtype=target.dtype)
        source = target.model
        with torch.no_grad():
            base.embed_tokens.weight.copy_(source.embed_tokens.weight)
            base.layers[0].load_state_dict(source.layers[-1].state_dict())
            base.norm.load_state_dict(source.norm.state_dict())
        rows = target.get_output_embeddings().weight.detach()[head_ids]
        return cls(base.to(source.embed_tokens.weight.device), head_ids, rows.clone())

    def features(self, token_ids: torch.Tensor, features: torch.Tensor, past_key_values: object = None,
                 position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """token_ids [B, n] (x_{t+1}), features [B, n, H] (f_t) -> predicted f_{t+1} [B, n, H]."""
        embedded = self.base.embed_tokens(token_ids)
        inputs = self.fc(torch.cat([embedded, features.to(embedded.dtype)], dim=-1))
        return self.base(inputs_embeds=inputs, past_key_values=past_key_values, position_ids=position_ids,
                         attention_mask=attention_mask, use_cache=past_key_values is not None).last_hidden_state

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V'] logits over head_ids."""
        return self.head(features)

    def save(self, out_dir: Path, meta: dict) -> None:
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        self.base.save_pretrained(out_dir)
        save_file({"fc": self.fc.weight.detach().contiguous(), "head": self.head.weight.detach().contiguous(),
                   "ids": self.head_ids.cpu()}, str(out_dir / EAGLE_FILE))
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=1))


def is_eagle_dir(path: Path) -> bool:
    return (path / EAGLE_FILE).is_file() and (path / META_FILE).is_file()


def load_eagle(path: Path, device: torch.device | str = "cpu") -> EagleHead:
    from safetensors.torch import load_file
    from transformers import AutoModel

    base = AutoModel.from_pretrained(path, dtype=torch.float32)
    tensors = load_file(str(path / EAGLE_FILE))
    head = EagleHead(base, tensors["ids"], tensors["head"])
    with torch.no_grad():
        head.fc.weight.copy_(tensors["fc"])
    head = head.to(device).eval()
    cpu_linear.install(head)  # a drafted token is a one-row product
    return head
