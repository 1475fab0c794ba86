"""OpenAI-compatible request models and response bodies (pure; no Ray, no model).

Requests are validated by pydantic; `validation_error_body` turns a pydantic error into
OpenAI's `{"error": {"message", "type", "param", "code"}}` naming the field. Responses add
`metrics.speculative_decoding` in vLLM's per-request shape plus `per_drafter`.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.spec.engine import GenerationResult


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    best_of: int | None = None
    return_token_ids: bool = False  # extension (as in vLLM): choices[0].token_ids


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int]


def error_body(message: str, param: str | None, code: int, error_type: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def too_large_body(limit: int) -> dict:
    """The 413 answer for a request body over `limit` bytes."""
    return error_body(f"the request body is over the limit of {limit} bytes", None, 413, "request_too_large")


def sse_event(payload: dict | str) -> str:
    """One server-sent event: `data: <JSON or literal>` and a blank line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


# pydantic puts the member type of a union field into the error location (`prompt.str`,
# `stop.list[str].1`); users know the field, not our union's members.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|[a-z_]+\[.*\])$")


def validation_error_body(err: ValidationError | list) -> dict:
    errors = err.errors() if isinstance(err, ValidationError) else err
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ())
           if part != "body" and not (isinstance(part, str) and _UNION_MEMBER.match(part))]
    param = ".".join(loc) or None
    return error_body(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param, 400)


def spec_metrics(result: GenerationResult) -> dict:
    """vLLM's per-request speculative-decoding metrics plus per-drafter counts."""
    summary = result.summary
    histogram: dict[str, int] = {}
    for r in result.rounds:
        if r.drafted:
            histogram[str(r.accepted)] = histogram.get(str(r.accepted), 0) + 1
    steps, accepted = summary["num_spec_steps"], summary["num_accepted_draft_tokens"]
    return {
        "speculative_decoding": {
            "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": summary["draft_acceptance_rate"],
            "acceptance_histogram": histogram,
            "num_spec_steps": steps,
            "num_draft_tokens": summary["num_draft_tokens"],
            "num_accepted_draft_tokens": accepted,
            "per_drafter": summary["per_drafter"],
        },
        "timing": {  # seconds summed over the request's rounds
            "rounds": summary["rounds"],
            "coordinator_s": summary["draft_s"],
            "drafter_s": sum(r.drafter_s for r in result.rounds),
            "verify_s": summary["verify_s"],
        },
    }


def usage(result: GenerationResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.token_ids),
        "total_tokens": result.prompt_tokens + len(result.token_ids),
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def completion_body(request_id: str, model: str, result: GenerationResult, chat: bool, token_ids: bool = False) -> dict:
    choice: dict = {"index": 0, "finish_reason": result.finish_reason}
    if token_ids:
        choice["token_ids"] = result.token_ids
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
        choice["logprobs"] = None
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(result),
        "metrics": spec_metrics(result),
    }


def chunk_body(request_id: str, model: str, chat: bool, text: str | None, finish_reason: str | None,
               first: bool = False) -> dict:
    if chat:
        delta: dict = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk_body(request_id: str, model: str, chat: bool, result: GenerationResult) -> dict:
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(result),
            "metrics": spec_metrics(result)}
