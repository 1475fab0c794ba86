"""OpenAI-compatible request models and response bodies (pure; no Ray, no model).

Requests are validated by pydantic; `validation_error_body` turns a pydantic error into
OpenAI's `{"error": {"message", "type", "param", "code"}}` naming the field. Chat messages take
what clients send (content parts, `developer`, `tool`; checked against the chat template by
deploy/engine/chat_messages.py). No field a client sends is silently lost: a field this server
does not act on is refused (400 naming it) unless it has its neutral value (`NEUTRAL_VALUES`:
penalties, `logit_bias`, `tools`, `response_format`, ...), and any other unknown field is
accepted and named in the response header `IGNORED_FIELDS_HEADER` (`specfleet-ignored-fields`;
`ignored_fields_header`: percent-encoded, the first 16); a response through the front names the target
replica that answered in `REPLICA_HEADER` (`specfleet-replica`, added by deploy/service/server.py).
Responses add, when the config's `request_metrics` is on, `metrics.speculative_decoding` in vLLM's
per-request shape plus `per_drafter` (summed over the response's choices), and `logprobs` in OpenAI's chat or completions shape.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actors.sampling import MAX_STOP, MAX_STOP_CHARS, MAX_TOP_LOGPROBS, SEED_RANGE
from deploy.engine.chat_messages import CHAT_ROLES
from deploy.engine.logprobs import TokenLogprob
from deploy.engine.request import GenerationResult

IGNORED_FIELDS_HEADER = "specfleet-ignored-fields"
REPLICA_HEADER = "specfleet-replica"  # which target replica answered (through the front)
MAX_NAMED_IGNORED = 16  # names in that header at most
MAX_PROMPTS = 64  # prompts in one completions request (a list prompt: one choice each)
# Fields OpenAI clients send that this server does not act on: accepted at these neutral values
# (and null), refused by name otherwise, so that what a client asked for is never silently dropped.
NEUTRAL_VALUES: dict[str, tuple] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "echo": (False,),
    "suffix": ("",),
    "min_tokens": (0,),
}
_REFUSAL = {
    "tools": "this server does not call tools",
    "tool_choice": "this server does not call tools",
    "functions": "this server does not call tools",
    "function_call": "this server does not call tools",
    "response_format": "only {\"type\": \"text\"} is supported (no constrained decoding)",
}


class StreamOptions(BaseModel):
    include_usage: bool = False


def _bounds(**schema) -> dict:
    """A field's bounds for the OpenAPI schema only: the server checks them itself (actors/sampling.py,
    the routes), with errors that name the field."""
    return {"json_schema_extra": schema}


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields: see unsupported_field / ignored_fields
    model: str
    max_tokens: int | None = Field(default=None, **_bounds(minimum=1))
    temperature: float | None = Field(default=None, **_bounds(minimum=0))
    top_p: float | None = Field(default=None, **_bounds(exclusiveMinimum=0, maximum=1))
    top_k: int | None = Field(default=None, **_bounds(minimum=0))
    seed: int | None = Field(default=None, **_bounds(minimum=SEED_RANGE[0], maximum=SEED_RANGE[1]))
    stop: str | list[str] | None = Field(default=None, **_bounds(
        minLength=1, maxLength=MAX_STOP_CHARS, maxItems=MAX_STOP, items={"minLength": 1, "maxLength": MAX_STOP_CHARS}))
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, **_bounds(minimum=1, maximum=1))
    best_of: int | None = Field(default=None, **_bounds(minimum=1, maximum=1))
    return_token_ids: bool = False  # extension (as in vLLM): each choice's token_ids (streamed: on its finish chunk)
    cache_salt: str | None = Field(default=None, max_length=256)  # extension (as in vLLM): its own drafter caches


class ChatMessage(BaseModel):
    """The shape only; roles and content are checked against the template (deploy/engine/chat_messages.py)."""

    model_config = ConfigDict(extra="ignore")  # `name` and the like: not rendered by chat templates
    role: str = Field(json_schema_extra={"enum": list(CHAT_ROLES)})  # the schema's roles; checked by chat_messages
    content: str | list[dict] | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    def as_dict(self) -> dict:
        return self.model_dump(exclude_none=True)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, **_bounds(minimum=1))
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def logprobs_wanted(self) -> int | None:
        """-> how many alternatives per token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def logprobs_wanted(self) -> int | None:
        return self.logprobs

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a list of strings or of token-id lists is several prompts."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (str, list)):
            return list(self.prompt)
        return [self.prompt]


def unsupported_field(body: dict) -> tuple[str, str] | None:
    """-> (field, message) for the first field asked for that this server does not act on."""
    for name, neutral in NEUTRAL_VALUES.items():
        value = body.get(name)
        if value is not None and value not in neutral:
            reason = _REFUSAL.get(name, "is not supported by this server")
            return name, f"{name}: {reason}; send {neutral[0]!r} or leave it out"
    return None


def ignored_fields(request: _SamplingFields) -> list[str]:
    """Fields the request carried that nothing reads (metadata such as `user`, or unknown names)."""
    return sorted(set(request.model_extra or {}) - set(NEUTRAL_VALUES))


def ignored_fields_header(names: Sequence[str]) -> str:
    """The `IGNORED_FIELDS_HEADER` value: the first MAX_NAMED_IGNORED names, percent-encoded (a
    header is ASCII, and a name may hold any character, commas included), comma-separated, then
    `+N` when N more were left out."""
    shown = [quote(name, safe="") for name in names[:MAX_NAMED_IGNORED]]
    return ",".join(shown + ([f"+{len(names) - MAX_NAMED_IGNORED}"] if len(names) > MAX_NAMED_IGNORED else []))


def error_body(message: str, param: str | None, status: int, error_type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error shape; `code` is the HTTP status (as vLLM sends) unless OpenAI names one (model_not_found)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code or status}}


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


def spec_metrics(results: GenerationResult | Sequence[GenerationResult]) -> dict:
    """vLLM's per-request speculative-decoding metrics plus per-drafter counts (over every choice)."""
    results = [results] if isinstance(results, GenerationResult) else list(results)
    rounds = [r for result in results for r in result.rounds]
    merged = GenerationResult("", [t for result in results for t in result.token_ids], "", 0, rounds)
    summary = merged.summary
    histogram: dict[str, int] = {}
    for r in rounds:
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
            "drafter_s": sum(r.drafter_s for r in rounds),
            "verify_s": summary["verify_s"],
        },
    }


def usage(results: GenerationResult | Sequence[GenerationResult]) -> dict:
    results = [results] if isinstance(results, GenerationResult) else list(results)
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_logprobs(logprobs: Sequence[TokenLogprob], token_text: Callable[[int], str]) -> dict:
    """OpenAI chat `logprobs`: {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal"}."""
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [entry(t.token_id, t.logprob) | {"top_logprobs": [entry(i, lp) for i, lp in t.top]}
                        for t in logprobs], "refusal": None}


def completion_logprobs(logprobs: Sequence[TokenLogprob], token_text: Callable[[int], str]) -> dict:
    """OpenAI completions `logprobs`: parallel lists tokens / token_logprobs / top_logprobs / text_offset."""
    tokens = [token_text(t.token_id) for t in logprobs]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [t.logprob for t in logprobs],
            "top_logprobs": [{token_text(i): lp for i, lp in t.top} for t in logprobs], "text_offset": offsets}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def completion_body(request_id: str, model: str, results: GenerationResult | Sequence[GenerationResult], chat: bool,
                    token_ids: bool = False, token_text: Callable[[int], str] | None = None,
                    with_metrics: bool = True) -> dict:
    """One choice per result, in order. `token_text` renders each token for `logprobs` (when asked);
    `metrics` only with_metrics (the config's `request_metrics`)."""
    results = [results] if isinstance(results, GenerationResult) else list(results)
    choices = []
    for index, result in enumerate(results):
        choice: dict = {"index": index, "finish_reason": result.finish_reason}
        if token_ids:
            choice["token_ids"] = result.token_ids
        logprobs = None
        if result.logprobs is not None and token_text is not None:
            logprobs = (chat_logprobs if chat else completion_logprobs)(result.logprobs, token_text)
        if chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        choice["logprobs"] = logprobs
        choices.append(choice)
    body = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(results),
    }
    return body | {"metrics": spec_metrics(results)} if with_metrics else body


def chunk_body(request_id: str, model: str, chat: bool, text: str | None, finish_reason: str | None,
               first: bool = False, index: int = 0, token_ids: list[int] | None = None) -> dict:
    """One SSE chunk of choice `index`; `token_ids` (a finish chunk, when the request asked for
    `return_token_ids`) are every token of that choice."""
    if chat:
        delta: dict = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk_body(request_id: str, model: str, chat: bool, results: GenerationResult | Sequence[GenerationResult],
                     with_metrics: bool = True) -> dict:
    body = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(results)}
    return body | {"metrics": spec_metrics(results)} if with_metrics else body
