"""`specfleet serve`'s flags: one per field of the service config (deploy/config.py), over the YAML.

`add_serve_flags(parser)` declares them (every flag has help text); `apply_flags(args, namespace)`
returns the YAML's application args with each given flag written over its field (flags not
given leave the YAML's value); `SERVE_FLAGS` maps each flag to its config path, and
`flag_for(location)` names the flag of a config error's location (pydantic's `loc`), so a bad
value is reported as `--k: ...`, not as a field the user never typed. `--drafters` takes a comma
list of kinds (each drafter named after its kind, or `name=kind`) or, for every drafter field,
the YAML's list as JSON. Pure: no Ray, no model.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from actors.errors import InvalidRequestError
from deploy.engine.defaults import MAX_BATCH, MAX_K, MAX_PADDING, K
from policy.coordinator import DRAFT_TIMEOUT_S, REQUEST_TTL_S

# flag -> (config path, type, help). The YAML (`--config`) stays the full form; these override it.
SERVE_FLAGS: dict[str, tuple[tuple[str, ...], object, str]] = {
    "--dtype": (("target", "dtype"), str, "the target's dtype: float32 (default; bit-exact greedy), bfloat16, float16"),
    "--target-num-gpus": (("target", "num_gpus"), float, "GPUs per target replica (default: 1 on a GPU cluster, else 0)"),
    "--target-resources": (("target", "resources"), "json", 'custom Ray resources per target replica as JSON, e.g. {"specfleet_target": 1}'),
    "--target-replicas": (("target", "replicas"), int, "target replicas, each with the whole target (default 1); they share "
                                                       "what they learn through the coordinator"),
    "--target-autoscaling": (("target", "autoscaling"), "json", 'Serve autoscaling of the target replicas as JSON, e.g. '
                                                              '{"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}'),
    "--policy": (("policy",), str, "the bandit and its reward, e.g. metasd-ucb-cost-warm (default), metasd-ucb-cost, thompson, fixed:ngram"),
    "--verify": (("verify",), str, "how a round's drafts are verified: chosen, counterfactual, tree (default)"),
    "--k": (("k",), int, f"the most tokens a drafter drafts per round (1..{MAX_K}; default {K})"),
    "--max-padding": (("max_padding",), int, f"extra rows a verification forward may pad to a faster size (0..16; default {MAX_PADDING})"),
    "--served-model-name": (("served_model_name",), str, "the model name clients send and /v1/models lists (default: the MODEL)"),
    "--api-key-file": (("api_key_file",), str, "a file of API keys, one a line, required on /v1/* (or set SPECFLEET_API_KEYS)"),
    "--max-tokens": (("sampling", "max_tokens"), int, "default max_tokens of a request that sends none (default 128)"),
    "--temperature": (("sampling", "temperature"), float, "default temperature of a request that sends none (default 0: greedy)"),
    "--top-p": (("sampling", "top_p"), float, "default top_p of a request that sends none (default 1)"),
    "--draft-timeout-s": (("draft_timeout_s",), float, f"a drafter answering later than this loses the round's draft and is marked down (default {DRAFT_TIMEOUT_S:g})"),
    "--request-ttl-s": (("request_ttl_s",), float, f"a request without a round for this long is over (its replica died; default {REQUEST_TTL_S:g})"),
    "--max-request-bytes": (("max_request_bytes",), int, "larger HTTP bodies get 413 (default 1 MiB)"),
    "--max-ongoing-requests": (("max_ongoing_requests",), int, f"requests a target replica batches at once (default {MAX_BATCH})"),
    "--max-queued-requests": (("max_queued_requests",), int, "requests waiting for a target replica; past it HTTP 503 with "
                                                            "Retry-After, gRPC RESOURCE_EXHAUSTED (default 64)"),
    "--request-metrics": (("request_metrics",), bool, "put each request's speculative metrics (per drafter acceptance, "
                                                      "timing) in its response (default off: they tell a client about "
                                                      "the drafters' state)"),
    "--grpc-reflection": (("grpc_reflection",), bool, "turn on gRPC server reflection (grpcurl can list the services; "
                                                      "it answers without a key; default off)"),
    "--placement-strategy": (("placement", "strategy"), str, "how drafter GPUs spread over nodes: PACK (default), SPREAD, STRICT_PACK, STRICT_SPREAD"),
    "--placement-timeout-s": (("placement", "timeout_s"), float, "how long to wait for the cluster to grant the drafters' resources (default 600)"),
}
# fields set by the positional MODEL, and by --drafters (with --draft-model / --draft-layers for its hf drafters)
COMPOSITE_FLAGS = {("target", "model"): "MODEL", ("drafters",): "--drafters"}


def json_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg} at character {err.pos}): {text!r}") from None


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="the target: embedded name (smollm2-135m), local dir, .gguf file or hub id (default: the config's)")
    parser.add_argument("--drafters", default=None,
                        help="the drafter pool: a comma list of kinds (ngram,suffix,hierarchy,hf,none,retrieval-<task>,"
                             "distill-<task>), each named after its kind or written name=kind; or the config's list as JSON "
                             "(every drafter field: num_gpus, resources, ...)")
    parser.add_argument("--draft-model", default=None, help="the model of the hf drafters in --drafters (same tokenizer as the target)")
    parser.add_argument("--draft-layers", type=int, default=None, help="keep only the first N layers of the draft model")
    for flag, (_, kind, text) in SERVE_FLAGS.items():
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=json_value if kind == "json" else kind, default=None, help=text)


def _drafters(namespace: argparse.Namespace) -> list[dict] | None:
    if namespace.drafters is None:
        if namespace.draft_model or namespace.draft_layers:
            raise InvalidRequestError("--draft-model", "needs an hf drafter in --drafters (e.g. --drafters ngram,hf)")
        return None
    text = namespace.drafters.strip()
    if text.startswith("["):
        drafters = json_value(text)
        if not isinstance(drafters, list):
            raise InvalidRequestError("--drafters", "JSON must be a list of drafters")
        return drafters
    drafters = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, kind = item.partition("=")
        drafter = {"name": name, "kind": kind or name}
        if drafter["kind"] == "hf":
            drafter |= {k: v for k, v in (("model", namespace.draft_model), ("num_layers", namespace.draft_layers)) if v}
        drafters.append(drafter)
    if not drafters:
        raise InvalidRequestError("--drafters", "names no drafter")
    if (namespace.draft_model or namespace.draft_layers) and not any(d["kind"] == "hf" for d in drafters):
        raise InvalidRequestError("--draft-model", "needs an hf drafter in --drafters (e.g. --drafters ngram,hf)")
    return drafters


def apply_flags(args: dict, namespace: argparse.Namespace) -> dict:
    """The YAML's application args with every given flag written over its field."""
    merged = json.loads(json.dumps(args or {}))  # a deep copy
    given: list[tuple[tuple[str, ...], object]] = []
    if namespace.model is not None:
        given.append((("target", "model"), namespace.model))
    if (drafters := _drafters(namespace)) is not None:
        given.append((("drafters",), drafters))
    for flag, (path, _, _) in SERVE_FLAGS.items():
        value = getattr(namespace, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            given.append((path, value))
    for path, value in given:
        node = merged
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return merged


def flag_for(location: Sequence[object]) -> str | None:
    """The flag that sets a config error's location, e.g. ("sampling", "top_p") -> "--top-p"."""
    path = tuple(str(part) for part in location)
    flags = {flag_path: flag for flag, (flag_path, _, _) in SERVE_FLAGS.items()} | COMPOSITE_FLAGS
    return next((flag for flag_path, flag in flags.items() if path[: len(flag_path)] == flag_path), None)
