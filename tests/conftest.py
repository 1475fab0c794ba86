"""Shared fixtures: the real embedded target (loaded once per session), tiny drafter models, and
one Ray service per session (HTTP + gRPC on 127.0.0.1, with an API key) shared by the service tests."""
from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass

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
    from deploy.engine.target import TargetModel

    torch.manual_seed(0)
    return TargetModel(load_causal_lm("smollm2-135m"))


@pytest.fixture(scope="session")
def early_exit_drafter_model():
    """A real model drafter: the embedded target's first 4 layers (shares its tokenizer)."""
    from actors.models import load_causal_lm

    return load_causal_lm("smollm2-135m", num_layers=4).model


def link_converted_models(path) -> None:
    """A cache at `path` that finds the real cache's converted target models instead of converting
    the embedded GGUF again (20 s each time)."""
    from actors.models import cache_root

    real = cache_root() / "models"
    path.mkdir(parents=True, exist_ok=True)
    if real.is_dir() and not (path / "models").exists():
        (path / "models").symlink_to(real)


def isolated_cache(monkeypatch, path) -> None:
    """SPECFLEET_CACHE at `path` (what a test builds lands there), the converted models linked in."""
    link_converted_models(path)
    monkeypatch.setenv("SPECFLEET_CACHE", str(path))


def tiny_llama(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    return LlamaForCausalLM(config).eval()


def pytest_collection_modifyitems(items):
    """Tests on the shared Ray service run last (in their usual order), so the session's Ray is
    up only while they run, not during the CPU-heavy in-process tests."""
    items.sort(key=lambda item: "service" in getattr(item, "fixturenames", ()))


def plain_text(target, messages: list[dict], max_tokens: int) -> str:
    """What plain greedy target decoding (no drafts) answers: the reference every path must equal."""
    from actors.no_draft import NO_DRAFT
    from actors.pool import build_drafters
    from actors.sampling import SamplingParams
    from deploy.engine.engine import SpeculativeEngine

    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return engine.generate(messages=messages, sampling=SamplingParams(max_tokens=max_tokens)).text


def chat_text(url: str, messages: list[dict], max_tokens: int, api_key: str = "unused") -> str:
    """One greedy chat completion from the service at `url`, through the real `openai` client."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=300)
    reply = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=max_tokens,
                                           temperature=0)
    return reply.choices[0].message.content


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held open until chosen, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class LocalService:
    url: str  # http://127.0.0.1:<port>
    grpc_address: str  # 127.0.0.1:<port>
    grpc_port: int
    api_key: str  # every /v1 and gRPC request must send it (Bearer)
    admin_token: str  # /admin/* must send it (Bearer)
    other_api_key: str  # a second tenant's key (its own suffix cache)


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """The Ray service (drafter actors, coordinator actor, Serve app `specfleet`) with HTTP and
    gRPC, its API key read from a key file named in the config, its admin token from the environment. Started once (Ray + Serve cost
    ~40-60 s on 2 cores); tests/service/test_service*.py share it."""
    from deploy.cli import build_parser
    from deploy.serve_flags import apply_flags
    from deploy.service.app import DEFAULT_CONFIG, load_serve_config, start_local_service, stop_local_service

    api_key, admin_token, other_api_key = (secrets.token_urlsafe(24) for _ in range(3))
    key_file = tmp_path_factory.mktemp("keys") / "api_keys"
    key_file.write_text(f"# specfleet test keys: two tenants\n{api_key}\n{other_api_key}\n")
    # the app's args as `specfleet serve` builds them: the shipped config with these flags written over it
    flags = build_parser().parse_args([
        # the lookup drafters draft in the coordinator, except `suffix`, which asks a CPU and so gets an
        # actor of its own: the fault tests kill it
        "serve", "smollm2-135m", "--drafters", json.dumps([{"name": "ngram", "kind": "ngram"}, {
            "name": "suffix", "kind": "suffix", "num_cpus": 1}, {"name": "hierarchy", "kind": "hierarchy"},
            {"name": "none", "kind": "none"}]), "--policy", "metasd-ucb-cost",
        "--verify", "tree", "--k", "7", "--api-key-file", str(key_file), "--draft-timeout-s", "2",
        "--request-ttl-s", "15", "--request-metrics",
        # a batch and a queue the load test's 16 streams and its admin calls fit in with room to
        # spare (Serve counts its queue loosely under bursts), and that the overload test's 64 clients overflow
        "--max-ongoing-requests", "16", "--max-queued-requests", "16"])
    args = apply_flags(load_serve_config(DEFAULT_CONFIG)[0], flags)
    http_port, grpc_port = free_ports(2)
    with pytest.MonkeyPatch.context() as env:  # only the key file: ignore the caller's environment
        env.delenv("SPECFLEET_API_KEYS", raising=False)
        env.delenv("SPECFLEET_API_KEY_FILE", raising=False)
        env.delenv("SPECFLEET_ADMIN_TOKEN_FILE", raising=False)
        env.setenv("SPECFLEET_ADMIN_TOKEN", admin_token)
        try:
            url = start_local_service(args, port=http_port, grpc_port=grpc_port)
        except BaseException:
            stop_local_service(args)
            raise
    yield LocalService(url, f"127.0.0.1:{grpc_port}", grpc_port, api_key, admin_token, other_api_key)
    stop_local_service(args)


@pytest.fixture(scope="session")
def client(service):
    """The official `openai` client on the shared service, with its API key."""
    from openai import OpenAI

    return OpenAI(base_url=f"{service.url}/v1", api_key=service.api_key, max_retries=0, timeout=300)
