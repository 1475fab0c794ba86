"""Shared fixtures: the real embedded target (loaded once per session) and tiny drafter models."""
from __future__ import annotations

import pytest
import torch

CHAT_PROMPTS = [
    [{"role": "user", "content": "Summarize: The council met on Tuesday to discuss the new park. Residents raised "
                                 "concerns about parking and noise. The council agreed to meet again next month."}],
    [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}],
    [{"role": "user", "content": "Translate to French: The weather is nice today."}],
]


@pytest.fixture(scope="session")
def target():
    from actors.models import load_causal_lm
    from deploy.target import TargetModel

    torch.manual_seed(0)
    return TargetModel(load_causal_lm("smollm2-135m"))


@pytest.fixture(scope="session")
def early_exit_drafter_model():
    """A real model drafter: the embedded target's first 4 layers (shares its tokenizer)."""
    from actors.models import load_causal_lm

    return load_causal_lm("smollm2-135m", num_layers=4).model


def tiny_llama(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    return LlamaForCausalLM(config).eval()
