"""The target replica's fronts: OpenAI-compatible HTTP routes and the gRPC methods, on a plain class.

`SpecfleetServer` holds the target model and a `SpeculativeEngine` whose drafting goes through
the coordinator (the Ray actor `specfleet:coordinator` when `coordinator="actor"`, or an
in-process one). HTTP routes: POST /v1/completions and /v1/chat/completions (JSON, or SSE with
`stream: true`, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`),
GET /v1/models, /health and /metrics (on the Ray service every replica's series: each replica
publishes its metric families to the coordinator every 2 s and a scrape merges the others' into
its own); the admin API (always behind an admin token; 403 when the
service has none): GET/POST /admin/drafters, DELETE /admin/drafters/{name} (the live pool). gRPC (deploy/service/proto/specfleet.proto, through Serve's gRPC
proxy): `Generate` and `GenerateStream`, methods named after the RPCs. Requests in flight are batched:
one scheduler thread runs every round of them in one target forward (deploy/engine/scheduler.py),
each with its KV cache in a slot of its own (deploy/engine/slot_kv.py); both fronts share
request validation, streaming (deploy/service/generation.py) and the API-key check (deploy/service/auth.py).
A list of prompts (completions) gets one choice each, generated side by side; `logprobs` come
from the verification forwards (deploy/engine/logprobs.py); fields nothing acts on are refused or
named in the `specfleet-ignored-fields` header (deploy/service/openai_api.py).
Bad input gets OpenAI-style JSON errors (400 naming the field, 404 `model_not_found` for an
unknown model, 413 for a body over the config's `max_request_bytes`) or
INVALID_ARGUMENT; a missing/wrong API key (when keys are configured) 401 or UNAUTHENTICATED on
/v1/* and gRPC (/health and /metrics stay open); a failed target 503 or UNAVAILABLE.
On the Ray service the replica is reached through the front deployment (deploy/service/front.py): its
`http` runs this module's FastAPI app in-process for one forwarded request and streams the
answer, its headers naming the replica (`specfleet-replica`); its `grpc` runs `Generate` / `GenerateStream` with a context that records the status.
deploy/service/app.py applies `serve.deployment` at build time; this module never imports Ray.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from actors.errors import InvalidRequestError, TargetUnavailableError
from actors.models import load_causal_lm
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.config import DrafterConfig, ServiceConfig
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.scheduler import BatchScheduler
from deploy.engine.shared_profile import adopt_shared_profile, publish_profile
from deploy.engine.target import TargetModel
from deploy.service.asgi_bridge import call_asgi
from deploy.service.auth import ApiKeys, refusal
from deploy.service.cpu_threads import CpuThreads
from deploy.service.generation import Finished, TrackedEngine, generate, request_field, sampling_for, stream
from deploy.service.metrics import ServiceMetrics
from deploy.service.openai_api import (
    IGNORED_FIELDS_HEADER,
    MAX_PROMPTS,
    REPLICA_HEADER,
    ChatCompletionRequest,
    CompletionRequest,
    chunk_body,
    completion_body,
    error_body,
    ignored_fields,
    ignored_fields_header,
    new_id,
    sse_event,
    too_large_body,
    unsupported_field,
    usage_chunk_body,
    validation_error_body,
)
from deploy.service.openapi import ADMIN_ERRORS, STREAMED, V1_ERRORS, install_schema, json_body
from policy.coordinator import Coordinator

app = FastAPI(title="specfleet", docs_url=None, redoc_url=None)
logger = logging.getLogger("specfleet")
replica_log = logging.getLogger("ray.serve")  # under Serve: the replica's own log file, with its id


def _error(message: str, param: str | None, status: int, error_type: str = "invalid_request_error",
           code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, param, status, error_type, code), status_code=status)


def _unavailable(err: TargetUnavailableError) -> dict:
    return error_body(str(err), None, 503, "service_unavailable_error")


def _no_pool() -> JSONResponse:
    return _error("this server drafts in-process; the admin API manages the Ray service's pool "
                  "(specfleet serve, serve deploy)", None, 501, "not_implemented_error")


class SpecfleetServer:
    def __init__(self, config: dict, coordinator: str = "local", api_keys: ApiKeys | None = None,
                 admin_keys: ApiKeys | None = None) -> None:
        self.config = ServiceConfig.model_validate(config)
        self.model_name = self.config.model_name
        self.api_keys = api_keys or ApiKeys()  # resolved once by deploy.service.app.build_app; empty = open
        self.admin_keys = admin_keys or ApiKeys()  # empty = the admin API is off
        self.ray_pool = coordinator == "actor"
        replica = f"{socket.gethostname()}:{os.getpid()}"
        if coordinator == "actor":
            from cluster.coordinator_actor import connect_coordinator
            from cluster.placement import actor_name

            proxy = connect_coordinator()
            replica = actor_name().rpartition("#")[2] or replica  # Serve's replica id
        self.replica = replica
        # the scheduler's thread loads the target and runs every forward (deploy/engine/scheduler.py)
        self.cpu_threads = CpuThreads()  # re-sized between iterations as replicas here come and go
        self.scheduler = BatchScheduler(lambda: self._engine(proxy if coordinator == "actor" else None),
                                        max_batch=self.config.max_ongoing_requests,
                                        between_iterations=lambda: self.cpu_threads.refresh())
        self.engine, self.target = self.scheduler.engine, self.scheduler.target
        if coordinator == "actor":
            from cluster.placement import actor_name, here

            proxy.register_replica(actor_name(), here() | {"device": str(self.target.device),  # for `specfleet status`
                                                           "forward_costs": self.forward_costs})
        self.metrics = ServiceMetrics(self.model_name, replica)
        self._metrics_lock = threading.Lock()
        self._coordinator = proxy if coordinator == "actor" else None
        if self._coordinator is not None:  # every replica's scrape answers every replica's series
            threading.Thread(target=self._publish_metrics, name="specfleet-metrics", daemon=True).start()
        _replica.server = self  # one replica per process: the routes below serve this instance

    def _engine(self, coordinator) -> SpeculativeEngine:
        """The target and its engine, drafting through `coordinator` (None: an in-process pool).
        Torch gets every core this process may run on, shared with the other target replicas on
        this machine when the target runs on CPU (deploy/service/cpu_threads.py): Ray starts an
        actor that reserves no CPU with OMP_NUM_THREADS=1, which on a CPU server left the target
        one core of two (plain decoding through the service at 0.69x in-process). With the Ray
        coordinator, the forward costs come from a peer on like hardware when one measured them
        (deploy/engine/shared_profile.py)."""
        self.cpu_threads.refresh()
        start = time.perf_counter()
        target = TargetModel(load_causal_lm(self.config.target.model, dtype=self.config.target.dtype))
        self.cpu_threads.runs_on(target.device)  # on a GPU: torch's CPU threads take every core
        loaded = time.perf_counter()
        remote, shared = coordinator is not None, False
        if not remote:
            pool = {d.name: build_drafters([d.kind], None, target.vocab_size, self.config.target.model,
                                            d.model if d.kind == "eagle" else None)[d.kind] for d in self.config.drafters}
            coordinator = Coordinator(pool, self.config.policy, verify=self.config.verify)
        else:  # a peer on like hardware may have measured the forward costs already
            shared = adopt_shared_profile(target, coordinator.cost_profile, self.replica)
        engine = SpeculativeEngine(target, coordinator=coordinator, k=self.config.k, max_padding=self.config.max_padding)
        engine.enable_batching()
        if remote and not shared:
            publish_profile(target, coordinator.put_cost_profile)
        self.forward_costs = "adopted" if shared else "measured"
        replica_log.info("target loaded in %.1f s with %d torch threads; forward costs %s in %.1f s",
                         loaded - start, self.cpu_threads.threads, self.forward_costs, time.perf_counter() - loaded)
        return engine

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "specfleet"}]}

    async def prometheus(self) -> Response:
        """This replica's metrics, fresh, and every other live replica's as it last published them."""
        others = await self._coordinator.replica_metrics(exclude=self.metrics.labels["replica"]) \
            if self._coordinator is not None else []
        with self._metrics_lock:
            return Response(self.metrics.render(others), media_type=CONTENT_TYPE_LATEST)

    def _publish_metrics(self) -> None:
        """Every METRICS_S: this replica's metric families to the coordinator, for the others' scrapes."""
        from cluster.coordinator_actor import METRICS_S

        while True:
            try:
                with self._metrics_lock:
                    families = self.metrics.families()
                self._coordinator.put_metrics(self.metrics.labels["replica"], families)
            except Exception as err:  # noqa: BLE001 - the coordinator is restarting: publish again next time
                logger.debug("publishing metrics failed: %r", err)
            time.sleep(METRICS_S)

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Finished:
        tracked = TrackedEngine(self.scheduler, self.metrics)
        try:
            return await generate(tracked, prompt_ids, sampling)
        finally:
            tracked.close()

    async def _stream_one(self, prompt_ids: list[int], sampling: SamplingParams):
        tracked = TrackedEngine(self.scheduler, self.metrics)
        try:
            async for item in stream(tracked, prompt_ids, sampling):
                yield item
        finally:
            tracked.close()

    def _observe(self, done: Finished) -> None:
        with self._metrics_lock:
            self.metrics.observe(done.result, done.ttft_s, done.e2e_s)

    # ---- HTTP ------------------------------------------------------------------------------
    def _parse(self, body: object, chat: bool, authorization: str | None = None):
        """-> (request, [(prompt_ids, sampling)] one per choice, ignored field names) or a JSONResponse error."""
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object", None, 400)
        try:
            req = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
        except ValidationError as err:
            return JSONResponse(validation_error_body(err), status_code=400)
        if req.model != self.model_name:
            return _error(f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                          "model", 404, code="model_not_found")
        if req.n != 1:
            return _error("only n = 1 is supported (send the request n times, with different seeds)", "n", 400)
        if req.best_of not in (None, 1):
            return _error("only best_of = 1 is supported", "best_of", 400)
        if unsupported := unsupported_field(body):
            return _error(unsupported[1], unsupported[0], 400)
        if chat and req.top_logprobs and not req.logprobs:
            return _error("top_logprobs needs logprobs: true", "top_logprobs", 400)
        if req.stream and req.logprobs_wanted is not None:
            return _error("logprobs are returned with non-streamed responses only", "logprobs", 400)
        prompts = [None] if chat else req.prompts
        if len(prompts) > MAX_PROMPTS:
            return _error(f"at most {MAX_PROMPTS} prompts in one request, got {len(prompts)}", "prompt", 400)
        max_tokens = req.max_completion_tokens if chat and req.max_completion_tokens is not None else req.max_tokens
        parsed = []
        for index, prompt in enumerate(prompts):
            try:
                if chat:
                    prompt_ids = self.target.encode(messages=[m.as_dict() for m in req.messages])
                elif isinstance(prompt, str):
                    prompt_ids = self.target.encode(prompt=prompt)
                else:
                    prompt_ids = self.target.encode(token_ids=prompt)
                sampling = sampling_for(self.target, self.config.sampling, prompt_ids, max_tokens=max_tokens,
                                        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                                        stop=req.stop, logprobs=req.logprobs_wanted,
                                        cache_salt=self._cache_salt(authorization, req.cache_salt))
            except InvalidRequestError as err:
                field = request_field(err.field, chat)
                if field == "prompt" and len(prompts) > 1:
                    field = f"prompt.{index}"
                return _error(f"{field}: {err.message}", field, 400)
            parsed.append((prompt_ids, sampling))
        return req, parsed, ignored_fields(req)

    def _cache_salt(self, authorization: str | None, requested: str | None) -> str:
        """Each API key's requests draft from their own history only (plus any salt they send)."""
        return f"{self.api_keys.tenant(authorization)}/{requested or ''}"

    def _token_text(self, token_id: int) -> str:
        return self.target.decode([token_id])

    async def serve_request(self, request: Request, chat: bool) -> Response:
        limit = self.config.max_request_bytes
        declared = request.headers.get("content-length", "")
        # refused before reading when the header says so, else once read (chunked bodies)
        if (declared.isdigit() and int(declared) > limit) or len(raw := await request.body()) > limit:
            return JSONResponse(too_large_body(limit), status_code=413)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not valid JSON (UTF-8)", None, 400)
        parsed = self._parse(body, chat, request.headers.get("authorization"))
        if isinstance(parsed, Response):
            return parsed
        req, prompts, ignored = parsed
        headers = {IGNORED_FIELDS_HEADER: ignored_fields_header(ignored)} if ignored else None
        request_id = new_id("chatcmpl" if chat else "cmpl")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(self._stream(request_id, chat, prompts, include_usage, req.return_token_ids),
                                     media_type="text/event-stream", headers=headers)
        generations = [asyncio.ensure_future(self._generate(ids, sampling)) for ids, sampling in prompts]
        try:
            finished = await asyncio.gather(*generations)
        except TargetUnavailableError as err:
            for generation in generations:  # the other prompts' answers would go nowhere: end them
                generation.cancel()
            return JSONResponse(_unavailable(err), status_code=503)
        for done in finished:
            self._observe(done)
        body = completion_body(request_id, self.model_name, [done.result for done in finished], chat,
                               req.return_token_ids, self._token_text, self.config.request_metrics)
        return JSONResponse(body, headers=headers)

    async def _stream(self, request_id: str, chat: bool, prompts: list[tuple[list[int], SamplingParams]],
                      include_usage: bool, token_ids: bool = False):
        """SSE chunks whose text adds up, per choice, to the non-streamed text
        (deploy/service/generation.stream); several prompts stream side by side, each chunk naming its
        choice's index; with `token_ids`, each choice's finish chunk carries its token ids. A target failure mid-stream ends it with an error event (503 body) and `[DONE]`."""
        for index in range(len(prompts)):
            yield sse_event(chunk_body(request_id, self.model_name, chat, None, None, first=True, index=index))
        events: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, prompt_ids: list[int], sampling: SamplingParams) -> None:
            try:
                async for item in self._stream_one(prompt_ids, sampling):
                    events.put_nowait((index, item))
            except TargetUnavailableError as err:
                events.put_nowait((index, err))
            except Exception as err:  # never leave the stream waiting on a choice that died
                events.put_nowait((index, TargetUnavailableError(f"the target failed to generate ({type(err).__name__})")))

        pumps = [asyncio.create_task(pump(i, ids, sampling)) for i, (ids, sampling) in enumerate(prompts)]
        finished: dict[int, Finished] = {}
        try:
            while len(finished) < len(prompts):
                index, item = await events.get()
                if isinstance(item, TargetUnavailableError):
                    yield sse_event(_unavailable(item))
                    yield sse_event("[DONE]")
                    return
                if isinstance(item, Finished):
                    finished[index] = item
                    yield sse_event(chunk_body(request_id, self.model_name, chat, None, item.result.finish_reason,
                                               index=index, token_ids=item.result.token_ids if token_ids else None))
                else:
                    yield sse_event(chunk_body(request_id, self.model_name, chat, item, None, index=index))
        finally:
            for task in pumps:
                task.cancel()
        results = [finished[i].result for i in range(len(prompts))]
        if include_usage:
            yield sse_event(usage_chunk_body(request_id, self.model_name, chat, results, self.config.request_metrics))
        yield sse_event("[DONE]")
        for done in finished.values():
            self._observe(done)

    # ---- admin: the live drafter pool (cluster/pool.py, on the Ray service) -----------------
    async def list_drafters(self) -> Response:
        from cluster.pool import pool_status

        if not self.ray_pool:
            return _no_pool()
        status = await asyncio.to_thread(pool_status)
        return JSONResponse({"object": "list", "data": status["drafters"]})

    async def add_drafter(self, request: Request) -> Response:
        from cluster.placement import PlacementError
        from cluster.pool import add_drafter

        if not self.ray_pool:
            return _no_pool()
        try:
            body = json.loads(await request.body())
            drafter = DrafterConfig.model_validate(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not valid JSON (UTF-8)", None, 400)
        except ValidationError as err:
            return JSONResponse(validation_error_body(err), status_code=400)
        try:
            placement = await asyncio.to_thread(add_drafter, self.config, drafter)
        except ValueError as err:  # the name is taken
            return _error(str(err), "name", 409, "conflict_error")
        except PlacementError as err:
            return _error(str(err), None, 503, "service_unavailable_error")
        except InvalidRequestError as err:
            return _error(str(err), err.field, 400)
        return JSONResponse({"name": drafter.name} | placement, status_code=201)

    async def remove_drafter(self, name: str) -> Response:
        from cluster.pool import remove_drafter

        if not self.ray_pool:
            return _no_pool()
        try:
            await asyncio.to_thread(remove_drafter, name)
        except KeyError:
            return _error(f"no drafter named {name!r} in the pool", "name", 404, "not_found_error")
        except InvalidRequestError as err:  # it would leave the policy without an arm
            return _error(str(err), "name", 409, "conflict_error")
        return JSONResponse({"removed": name})

    # ---- gRPC: specfleet.v1.Specfleet through Serve's gRPC proxy ----------------------------
    # Serve calls the method named after the RPC, with `grpc_context` (a RayServegRPCContext).
    # deploy.service.grpc_api is imported here, not at the top: its stubs are generated at install, and
    # the HTTP front must not need them.
    def _grpc_parse(self, request, grpc_context) -> tuple[list[int], SamplingParams]:
        from deploy.service import grpc_api

        metadata = dict(grpc_context.invocation_metadata()) if grpc_context is not None else {}
        self.api_keys.check(metadata.get("authorization"))
        return grpc_api.parse_request(request, self.target, self.config.sampling, self.model_name,
                                      self._cache_salt(metadata.get("authorization"), None))

    async def Generate(self, request, grpc_context=None):
        """Unary: the whole completion. Errors set the status code on `grpc_context`."""
        from deploy.service import grpc_api

        try:
            prompt_ids, sampling = self._grpc_parse(request, grpc_context)
            done = await self._generate(prompt_ids, sampling)
        except grpc_api.STATUS_ERRORS as err:
            if grpc_context is None:
                raise
            grpc_api.set_status(grpc_context, err)
            return grpc_api.piece("", self.model_name, "")
        self._observe(done)
        return grpc_api.response(new_id("cmpl"), self.model_name, done.result,
                                 with_metrics=self.config.request_metrics)

    async def GenerateStream(self, request, grpc_context=None):
        """Server streaming: text pieces, then a last message with finish_reason, token_ids, usage
        and metrics. Serve carries a status set on `grpc_context` only with a yielded message or
        a raised exception, so errors are raised after setting it."""
        from deploy.service import grpc_api

        request_id = new_id("cmpl")
        try:
            prompt_ids, sampling = self._grpc_parse(request, grpc_context)
            async for item in self._stream_one(prompt_ids, sampling):
                if isinstance(item, Finished):
                    self._observe(item)
                    yield grpc_api.response(request_id, self.model_name, item.result, text="",
                                            with_metrics=self.config.request_metrics)
                else:
                    yield grpc_api.piece(request_id, self.model_name, item)
        except grpc_api.STATUS_ERRORS as err:
            if grpc_context is not None:
                grpc_api.set_status(grpc_context, err)
            raise


    # ---- behind the front deployment (deploy/service/front.py) ----------------------------------------
    async def http(self, method: str, path: str, query: bytes, headers: list[tuple[str, str]], body: bytes):
        """One forwarded HTTP request through this process's app: (status, headers), then body
        chunks. The headers name the replica that answered (`specfleet-replica`, its metrics label)."""
        async for item in call_asgi(app, method, path, query, headers, body):
            if isinstance(item, tuple):
                status, response_headers = item
                item = status, [*response_headers, (REPLICA_HEADER, self.metrics.labels["replica"])]
            yield item

    async def grpc(self, method: str, request, metadata: dict):
        """One forwarded gRPC call: ("message", response) per message, then ("status", code,
        details) when the call set a status."""
        context = RecordedContext(metadata)
        try:
            if method == "Generate":
                yield ("message", await self.Generate(request, context))
            elif method == "GenerateStream":
                async for message in self.GenerateStream(request, context):
                    yield ("message", message)
            else:
                raise ValueError(f"unknown gRPC method {method!r}")
        except Exception:
            if context.code is None:
                raise
        if context.code is not None:
            yield ("status", context.code, context.details)


class RecordedContext:
    """The part of a gRPC servicer context the methods above use, recorded for the front."""

    def __init__(self, metadata: dict) -> None:
        self.metadata, self.code, self.details = metadata, None, ""

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self.metadata.items())

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


class _Replica:
    server: SpecfleetServer | None = None


_replica = _Replica()


def _server() -> SpecfleetServer:
    if _replica.server is None:
        raise RuntimeError("no SpecfleetServer in this process")
    return _replica.server


class RefusedError(Exception):
    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status, self.error_type = status, error_type


async def _gate(request: Request,
                _bearer: HTTPAuthorizationCredentials | None = Security(HTTPBearer(auto_error=False))) -> None:
    """The ingress's key check (deploy/service/auth.refusal) again, for this app served without the
    front; `_bearer` declares the Bearer scheme in the OpenAPI schema."""
    server = _server()
    if refused := refusal(request.url.path, request.headers.get("authorization"), server.api_keys, server.admin_keys):
        raise RefusedError(*refused)


@app.exception_handler(RefusedError)
async def _refused(request: Request, err: RefusedError) -> JSONResponse:
    return JSONResponse(error_body(str(err), None, err.status, err.error_type), status_code=err.status,
                        headers={"WWW-Authenticate": "Bearer"} if err.status == 401 else None)


# Routes are plain functions bound to this process's server (not class methods), so the app
# needs no class-based-view rewriting and pickles by reference into Serve replicas.
@app.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@app.get("/metrics")
async def prometheus() -> Response:
    return await _server().prometheus()


v1 = APIRouter(prefix="/v1", dependencies=[Depends(_gate)], responses=V1_ERRORS)


@v1.get("/models")
async def models() -> dict:
    return _server().models()


@v1.post("/completions", openapi_extra=json_body(CompletionRequest), responses=STREAMED)
async def completions(request: Request) -> Response:
    return await _server().serve_request(request, chat=False)


@v1.post("/chat/completions", openapi_extra=json_body(ChatCompletionRequest), responses=STREAMED)
async def chat_completions(request: Request) -> Response:
    return await _server().serve_request(request, chat=True)


app.include_router(v1)

admin = APIRouter(prefix="/admin", dependencies=[Depends(_gate)], responses=ADMIN_ERRORS)


@admin.get("/drafters")
async def list_drafters() -> Response:
    return await _server().list_drafters()


@admin.post("/drafters", status_code=201, openapi_extra=json_body(DrafterConfig))
async def add_drafter(request: Request) -> Response:
    return await _server().add_drafter(request)


@admin.delete("/drafters/{name}")
async def remove_drafter(name: str) -> Response:
    return await _server().remove_drafter(name)


app.include_router(admin)
install_schema(app, [CompletionRequest, ChatCompletionRequest, DrafterConfig])
