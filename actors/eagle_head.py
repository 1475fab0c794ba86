"""An EAGLE-3 draft head: the target's next hidden state, and so its next token, from three of its layers.

Pair t of a sequence is (g_t, x_{t+1}). g_t is the target's fused feature at position t: `fuse` (3H -> H)
of its hidden states entering layers `feature_layers(L)` = (2, L // 2, L - 3), a low, a middle and a
high layer, as EAGLE-3 reads them. x_{t+1} is the next token. The head runs one decoder layer of the
target's shape (RMSNorm, grouped-query attention with rotary positions, SiLU MLP) on
`fc([embed(x_{t+1}); g_t])` (2H -> H). Its output h_t:
- predicts x_{t+2} through `logits(h_t)`: the final norm, then the target's own output rows
  restricted to `head_ids`, a reduced vocabulary (frozen; the target's tied embeddings);
- stands in for g_{t+1} when drafting one token further.

Attention runs on keys and values that the caller keeps (`step`), under any mask, so one call
appends committed pairs and a draft tree is one call per depth. `qkv` and `finish` are the two
halves of the layer around attention, for training-time test (deploy/specialists/eagle.py), where
each drafting step attends to true features and to its own chain.

Parameters kept (`state_dict`): fuse, fc and the layer; the embeddings and output rows come from the
target at load (`from_target`, `load_head`). A head file is safetensors in float16, 10 MB for the
embedded target, with a JSON manifest beside it (`MANIFEST`: the recipe, data counts, seed,
commit, build time, agreement by depth).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from actors.models import cache_root, target_key

HEAD_FILE = "eagle.safetensors"
MANIFEST = "manifest.json"
SHIPPED_HEADS = Path(__file__).resolve().parent / "data" / "eagle"  # <target>/eagle.safetensors + manifest.json


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The layers whose input hidden states the head reads (EAGLE-3's choice)."""
    return (min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3))


@dataclass(frozen=True)
class HeadShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    layers: tuple[int, ...]
    vocabulary: int  # len(head_ids)

    @classmethod
    def of_target(cls, config, vocabulary: int) -> "HeadShape":
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(int(config.hidden_size), heads, int(config.num_key_value_heads), head_dim, int(config.intermediate_size),
                   float(config.rms_norm_eps), theta, feature_layers(int(config.num_hidden_layers)), vocabulary)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, n] -> cos, sin [B, 1, n, head_dim] (Llama's rotary embedding)."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inverse  # [B, n, d/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class EagleHead(nn.Module):
    def __init__(self, shape: HeadShape, embed_weight: torch.Tensor, head_ids: torch.Tensor) -> None:
        """embed_weight [V, H]: the target's input embeddings (= its output rows: tied); head_ids [V']."""
        super().__init__()
        h, kv = shape.hidden, shape.kv_heads * shape.head_dim
        self.shape = shape
        self.fuse = nn.Linear(len(shape.layers) * h, h, bias=False)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.input_norm, self.post_norm, self.norm = (RMSNorm(h, shape.rms_eps) for _ in range(3))
        self.q_proj = nn.Linear(h, shape.heads * shape.head_dim, bias=False)
        self.k_proj, self.v_proj = nn.Linear(h, kv, bias=False), nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, h, bias=False)
        self.gate_proj, self.up_proj = (nn.Linear(h, shape.intermediate, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(shape.intermediate, h, bias=False)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("head_ids", head_ids.to(torch.long), persistent=False)
        self.register_buffer("head_weight", embed_weight.detach()[head_ids.to(torch.long)].clone(), persistent=False)

    @classmethod
    def from_target(cls, target: nn.Module, head_ids: torch.Tensor) -> "EagleHead":
        """An untrained head for `target` (a Llama-shaped transformers causal LM): its layer and
        norms start from the target's top layer and final norm."""
        shape = HeadShape.of_target(target.config, len(head_ids))
        head = cls(shape, target.get_output_embeddings().weight, head_ids).to(target.get_output_embeddings().weight.device)
        top = target.model.layers[-1]
        with torch.no_grad():
            for mine, theirs in [(head.q_proj, top.self_attn.q_proj), (head.k_proj, top.self_attn.k_proj),
                                 (head.v_proj, top.self_attn.v_proj), (head.o_proj, top.self_attn.o_proj),
                                 (head.gate_proj, top.mlp.gate_proj), (head.up_proj, top.mlp.up_proj),
                                 (head.down_proj, top.mlp.down_proj), (head.input_norm, top.input_layernorm),
                                 (head.post_norm, top.post_attention_layernorm), (head.norm, target.model.norm)]:
                mine.weight.copy_(theirs.weight)
        return head

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """[..., 3H] the target's hidden states at the feature layers -> g [..., H]."""
        return self.fuse(features.to(self.fuse.weight.dtype))

    def qkv(self, token_ids: torch.Tensor, g: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """token_ids [B, n], g [B, n, H], positions [B, n] -> (the residual stream x [B, n, H],
        q [B, heads, n, d], k and v [B, kv_heads, n, d]), rotary applied."""
        b, n = token_ids.shape
        s = self.shape
        x = self.fc(torch.cat([nn.functional.embedding(token_ids, self.embed_weight), g], dim=-1))
        normed = self.input_norm(x)
        q = self.q_proj(normed).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(normed).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(normed).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = rotary(positions, s.head_dim, s.rope_theta)
        return x, _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x [B, n, H], attended [B, heads, n, d] -> the layer's output h [B, n, H]."""
        b, _, n, _ = attended.shape
        x = x + self.o_proj(attended.transpose(1, 2).reshape(b, n, -1))
        normed = self.post_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(normed)) * self.up_proj(normed))

    def expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """[B, kv_heads, L, d] -> [B, heads, L, d] (grouped-query attention)."""
        return kv.repeat_interleave(self.shape.heads // self.shape.kv_heads, dim=1)

    def step(self, token_ids: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, past_k: torch.Tensor,
             past_v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """New pairs attend to past keys and to each other as `allowed` says.
        token_ids [B, n], g [B, n, H], positions [B, n], past_k/v [B, kv_heads, P, d],
        allowed [B, n, P + n] bool -> (h [B, n, H], k and v [B, kv_heads, P + n, d])."""
        x, q, k, v = self.qkv(token_ids, g, positions)
        keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, -math.inf)[:, None]
        attended = nn.functional.scaled_dot_product_attention(q, self.expand_kv(keys), self.expand_kv(values), attn_mask=mask)
        return self.finish(x, attended), keys, values

    def empty_kv(self, batch: int = 1) -> torch.Tensor:
        return torch.zeros(batch, self.shape.kv_heads, 0, self.shape.head_dim, dtype=self.fc.weight.dtype,
                           device=self.fc.weight.device)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V'] logits over head_ids."""
        return self.norm(h) @ self.head_weight.T

    def save(self, out_dir: Path, manifest: dict) -> Path:
        """The trained parameters in float16 and the manifest; -> the head file."""
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {name: p.detach().to(torch.float16).contiguous().cpu() for name, p in self.state_dict().items()}
        tensors["head_ids"] = self.head_ids.to(torch.int32).cpu()
        save_file(tensors, str(out_dir / HEAD_FILE))
        (out_dir / MANIFEST).write_text(json.dumps(manifest | {"shape": asdict(self.shape)}, indent=1) + "\n")
        return out_dir / HEAD_FILE


def is_head_dir(path: Path) -> bool:
    return (path / HEAD_FILE).is_file() and (path / MANIFEST).is_file()



def shipped_head(target: str) -> Path:
    """Where the repository keeps the trained head of the target named `target` (as --model gives it)."""
    return SHIPPED_HEADS / target_key(target)


def eagle_dir(target: str) -> Path:
    """Where `specfleet train-eagle` puts a head it builds for `target` by default (it is found before the shipped one)."""
    return cache_root() / "eagle" / target_key(target)


def find_head(target: str) -> Path | None:
    """The head for `target`: one built on this machine, else the one the repository ships, else None."""
    return next((path for path in (eagle_dir(target), shipped_head(target)) if is_head_dir(path)), None)


def saved_head_ids(path: Path) -> torch.Tensor:
    """The token ids the head saved at `path` (a directory) drafts, read without loading the head."""
    from safetensors import safe_open

    with safe_open(str(path / HEAD_FILE), framework="pt") as tensors:
        return tensors.get_tensor("head_ids").to(torch.long)


def load_head(path: Path, config, embed_weight: torch.Tensor, device: torch.device | str = "cpu") -> EagleHead:
    """The head saved at `path` (a directory), for a target of this config and input embeddings [V, H], in float32."""
    from safetensors.torch import load_file

    manifest = json.loads((path / MANIFEST).read_text())
    tensors = load_file(str(path / HEAD_FILE))
    head_ids = tensors.pop("head_ids").to(torch.long)
    shape = HeadShape(**(manifest["shape"] | {"layers": tuple(manifest["shape"]["layers"])}))
    expected = HeadShape.of_target(config, len(head_ids))
    if shape != expected:
        raise ValueError(f"the head at {path} was built for another target shape: {shape} != {expected}")
    head = EagleHead(shape, embed_weight.float(), head_ids)
    head.load_state_dict({name: t.float() for name, t in tensors.items()})
    return head.to(device).eval()
