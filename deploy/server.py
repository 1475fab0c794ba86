"""The target replica's HTTP front: OpenAI-compatible routes on a plain class.

`SpecfleetServer` holds the target model and a `SpeculativeEngine` whose drafting goes through
the coordinator (the Ray actor `specfleet:coordinator` when `coordinator="actor"`, or an
in-process one). Routes: POST /v1/completions and /v1/chat/completions (JSON, or SSE with
`stream: true`, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`),
GET /v1/models, /health and /metrics. Generation runs in worker threads, one KV cache per
request, so concurrent requests never share state. Bad input gets OpenAI-style JSON errors
(400 naming the field, 404 for an unknown model). deploy/app.py applies `serve.ingress` and
`serve.deployment` at build time; this module never imports Ray.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from actors.models import load_causal_lm
from actors.pool import build_drafters
from deploy.config import ServiceConfig
from deploy.engine import GenerationResult, SpeculativeEngine
from deploy.errors import InvalidRequestError
from deploy.metrics import ServiceMetrics
from deploy.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    chunk_body,
    completion_body,
    error_body,
    new_id,
    usage_chunk_body,
    validation_error_body,
)
from deploy.sampling import SamplingParams
from deploy.target import TargetModel
from policy.coordinator import Coordinator

app = FastAPI(title="specfleet", docs_url=None, redoc_url=None)


def _error(message: str, param: str | None, status: int, error_type: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(error_body(message, param, status, error_type), status_code=status)


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class SpecfleetServer:
    def __init__(self, config: dict, coordinator: str = "local") -> None:
        self.config = ServiceConfig.model_validate(config)
        self.model_name = self.config.model_name
        loaded = load_causal_lm(self.config.target.model, dtype=self.config.target.dtype)
        self.target = TargetModel(loaded)
        if coordinator == "actor":
            from policy.coordinator import connect_coordinator

            proxy = connect_coordinator()
        else:
            pool = {d.name: build_drafters([d.kind], None, self.target.vocab_size)[d.kind] for d in self.config.drafters}
            proxy = Coordinator(pool, self.config.policy)
        self.engine = SpeculativeEngine(self.target, coordinator=proxy, k=self.config.k,
                                        max_padding=self.config.max_padding)
        self.metrics = ServiceMetrics()
        self._metrics_lock = threading.Lock()
        _replica.server = self  # one replica per process: the routes below serve this instance

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "specfleet"}]}

    def prometheus(self) -> Response:
        with self._metrics_lock:
            return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # ---- request handling ----------------------------------------------------------------
    def _parse(self, body: object, chat: bool):
        """-> (request, prompt_ids, sampling) or a JSONResponse error."""
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object", None, 400)
        try:
            req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
        except ValidationError as err:
            return JSONResponse(validation_error_body(err), status_code=400)
        if req.model != self.model_name:
            return _error(f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                          "model", 404, "model_not_found")
        if req.n != 1:
            return _error("only n = 1 is supported", "n", 400)
        if req.best_of not in (None, 1):
            return _error("only best_of = 1 is supported", "best_of", 400)
        defaults = self.config.sampling
        try:
            if chat:
                prompt_ids = self.target.encode(messages=[m.model_dump() for m in req.messages])
            elif isinstance(req.prompt, str):
                prompt_ids = self.target.encode(prompt=req.prompt)
            else:
                prompt_ids = self.target.encode(token_ids=req.prompt)
            max_tokens = req.max_completion_tokens if chat and req.max_completion_tokens is not None else req.max_tokens
            if max_tokens is None:
                max_tokens = max(1, min(defaults.max_tokens, self.target.context_length - len(prompt_ids)))
            sampling = SamplingParams(
                max_tokens=max_tokens,
                temperature=defaults.temperature if req.temperature is None else req.temperature,
                top_p=defaults.top_p if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                seed=req.seed,
                stop=tuple([req.stop] if isinstance(req.stop, str) else req.stop or ()),
            )
            self.target.check_length(len(prompt_ids), sampling.max_tokens)
        except InvalidRequestError as err:
            field = "prompt" if err.field == "token_ids" else err.field
            return _error(str(err), "messages" if chat and field == "prompt" else field, 400)
        return req, prompt_ids, sampling

    async def serve_request(self, request: Request, chat: bool) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not valid JSON", None, 400)
        parsed = self._parse(body, chat)
        if isinstance(parsed, Response):
            return parsed
        req, prompt_ids, sampling = parsed
        request_id = new_id("chatcmpl" if chat else "cmpl")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(self._stream(request_id, chat, prompt_ids, sampling, include_usage),
                                     media_type="text/event-stream")
        start = time.perf_counter()
        result = await asyncio.to_thread(self.engine.run, prompt_ids, sampling)
        self._observe(result, None, time.perf_counter() - start)
        return JSONResponse(completion_body(request_id, self.model_name, result, chat, req.return_token_ids))

    def _observe(self, result: GenerationResult, ttft_s: float | None, e2e_s: float) -> None:
        with self._metrics_lock:
            self.metrics.observe(result, ttft_s, e2e_s)

    async def _stream(self, request_id: str, chat: bool, prompt_ids: list[int], sampling: SamplingParams,
                      include_usage: bool):
        """SSE chunks. Text that could still become a stop string, or an incomplete UTF-8
        character, is held back, so the streamed text always equals the non-streamed text."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        output: list[int] = []
        start = time.perf_counter()
        first_token_s: list[float] = []

        def on_tokens(tokens: list[int]) -> None:
            output.extend(tokens)
            if not first_token_s:
                first_token_s.append(time.perf_counter() - start)
            loop.call_soon_threadsafe(updates.put_nowait, list(output))

        task = loop.run_in_executor(None, lambda: self.engine.run(prompt_ids, sampling, on_tokens))
        task.add_done_callback(lambda _: loop.call_soon_threadsafe(updates.put_nowait, None))
        holdback = max((len(s) for s in sampling.stop), default=1) - 1
        sent = 0
        yield _sse(chunk_body(request_id, self.model_name, chat, None, None, first=True))
        while (tokens := await updates.get()) is not None:
            text = self.target.decode(tokens)
            safe = len(text) - holdback
            while safe > sent and text[safe - 1] == "\ufffd":
                safe -= 1
            if safe > sent:
                yield _sse(chunk_body(request_id, self.model_name, chat, text[sent:safe], None))
                sent = safe
        result: GenerationResult = await task
        if len(result.text) > sent:
            yield _sse(chunk_body(request_id, self.model_name, chat, result.text[sent:], None))
        yield _sse(chunk_body(request_id, self.model_name, chat, None, result.finish_reason))
        if include_usage:
            yield _sse(usage_chunk_body(request_id, self.model_name, chat, result))
        yield _sse("[DONE]")
        self._observe(result, first_token_s[0] if first_token_s else None, time.perf_counter() - start)


class _Replica:
    server: SpecfleetServer | None = None


_replica = _Replica()


def _server() -> SpecfleetServer:
    if _replica.server is None:
        raise RuntimeError("no SpecfleetServer in this process")
    return _replica.server


# Routes are plain functions bound to this process's server (not class methods), so the app
# needs no class-based-view rewriting and pickles by reference into Serve replicas.
@app.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@app.get("/v1/models")
async def models() -> dict:
    return _server().models()


@app.get("/metrics")
async def prometheus() -> Response:
    return _server().prometheus()


@app.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _server().serve_request(request, chat=False)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _server().serve_request(request, chat=True)
