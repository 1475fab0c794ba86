"""The service's ingress: a thin front deployment that carries every request to a target replica
over a Serve handle, so a replica that dies mid-request becomes a clean error, never a hang.

HTTP: every route is forwarded as it came (method, path, query, headers, body) to the target
replica's `http`, which runs the FastAPI app of deploy/service/server.py in its process
(deploy/service/asgi_bridge.py) and streams the answer back; the front relays the status, the headers and
each body chunk as they come (SSE streams stay streams). Keys are checked here first
(deploy/service/auth.refusal: API keys on /v1/*, the admin token on /admin/*; 401/403 before
any body is read or forwarded), so traffic without a key never occupies a target replica. A
body over `max_request_bytes` is refused here (413): by its Content-Length before it is read,
and a chunked one as soon as what has arrived passes the limit. When the replica fails (it died,
was restarted by Serve, or is unavailable), a request still waiting for its answer gets 503 with
an OpenAI-style JSON error; a stream already under way ends with an SSE error event (the same
body) and `data: [DONE]`. An exception inside the replica's code is a 500 JSON error. A request
refused because `max_queued_requests` already wait for a replica (Serve's BackPressureError) is
a 503 with `Retry-After`, before anything reaches a replica (gRPC: RESOURCE_EXHAUSTED).

gRPC (Serve's gRPC proxy calls the ingress's methods by RPC name): `Generate` and
`GenerateStream` are forwarded to the replica's `grpc`, which runs the same methods with a
context that records the status; the front sets that status on the caller's context. A failed
replica is UNAVAILABLE. The API key is checked here too (UNAUTHENTICATED before forwarding).

Lifecycle: when Serve stops the front because its application is being deleted (`serve delete`,
`serve shutdown`), `__del__` stops the drafter pool (cluster/pool.stop_pool: the coordinator,
every drafter actor and their placement groups), so nothing keeps holding GPUs; a redeploy or a
replica restart keeps the pool.

Plain classes and FastAPI routes: deploy/service/app.py applies `serve.ingress` / `serve.deployment`.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deploy.service.auth import ApiKeys, AuthenticationError, refusal
from deploy.service.openai_api import error_body, sse_event, too_large_body

front_app = FastAPI(title="specfleet", docs_url=None, redoc_url=None, openapi_url=None)  # the replica's schema
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection"}
logger = logging.getLogger("specfleet")
RETRY_AFTER_S = 1  # what an overloaded front tells a refused client to wait
REPLICA_UNAVAILABLE = "the target replica is unavailable (it failed or is restarting); retry the request"


def _overloaded(err: BaseException) -> bool:
    from ray.serve.exceptions import BackPressureError

    return isinstance(err, BackPressureError)


def _failure(err: BaseException) -> tuple[int, dict, dict[str, str]]:
    """The status, OpenAI-style body and headers for a request its replica could not answer."""
    from ray.exceptions import RayTaskError

    if _overloaded(err):  # max_queued_requests already wait: refused before reaching a replica
        return 503, error_body("the service is overloaded (every target replica is busy and the queue is full); "
                               f"retry after {RETRY_AFTER_S} s", None, 503, "service_unavailable_error"), \
            {"Retry-After": str(RETRY_AFTER_S)}
    logger.warning("the target replica did not answer a request: %r", err, exc_info=err)
    if isinstance(err, RayTaskError):  # the replica's own code raised
        return 500, error_body("the target replica failed to handle the request", None, 500, "internal_error"), {}
    return 503, error_body(REPLICA_UNAVAILABLE, None, 503, "service_unavailable_error"), {}


class BodyTooLargeError(Exception):
    pass


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request body, read no further than `limit` bytes (BodyTooLargeError past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:  # refused before reading
        raise BodyTooLargeError
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a chunked (or lying) body: stop reading here
            raise BodyTooLargeError
        chunks.append(chunk)
    return b"".join(chunks)


class SpecfleetFront:
    def __init__(self, target, max_request_bytes: int, model_name: str, api_keys: ApiKeys | None = None,
                 admin_keys: ApiKeys | None = None, pool_config: dict | None = None) -> None:
        self.target = target.options(stream=True)  # a DeploymentHandle to the target deployment
        self.max_request_bytes = max_request_bytes
        self.model_name = model_name
        self.api_keys, self.admin_keys = api_keys or ApiKeys(), admin_keys or ApiKeys()
        self.pool_config = pool_config  # the service config whose pool this front's app owns (None: not on Ray)
        _front.instance = self  # one front replica per process: the route below serves this instance

    async def forward(self, request: Request) -> Response:
        refused = refusal(request.url.path, request.headers.get("authorization"), self.api_keys, self.admin_keys)
        if refused is not None:
            status, message, error_type = refused
            return JSONResponse(error_body(message, None, status, error_type), status_code=status,
                                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)
        try:
            body = await bounded_body(request, self.max_request_bytes)
        except BodyTooLargeError:
            return JSONResponse(too_large_body(self.max_request_bytes), status_code=413)
        answer = self.target.http.remote(request.method, request.url.path, request.url.query.encode("latin-1"),
                                         list(request.headers.items()), body)
        try:
            status, headers = await answer.__anext__()
        except Exception as err:  # noqa: BLE001 - the replica never answered
            code, error, extra = _failure(err)
            return JSONResponse(error, status_code=code, headers=extra)
        kept = {k: v for k, v in headers if k.lower() not in _HOP_HEADERS}
        if kept.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(self._relay(answer), status_code=status, headers=kept)
        try:
            content = b"".join([chunk async for chunk in answer])
        except Exception as err:  # noqa: BLE001 - the replica failed before the body was complete
            code, error, _ = _failure(err)
            return JSONResponse(error, status_code=code)
        return Response(content, status_code=status, headers=kept)

    def __del__(self) -> None:
        """Called by Serve when it stops this replica (and by Python at collection: idempotent)."""
        config, self.pool_config = getattr(self, "pool_config", None), None
        if config is not None and app_is_deleting():
            from cluster.pool import stop_pool
            from deploy.config import ServiceConfig

            stop_pool(ServiceConfig.model_validate(config))

    @staticmethod
    async def _relay(answer):
        try:
            async for chunk in answer:
                yield chunk
        except Exception as err:  # noqa: BLE001 - mid-stream: an error event, then the end
            _, error, _ = _failure(err)
            yield (sse_event(error) + sse_event("[DONE]")).encode()

    # ---- gRPC: specfleet.v1.Specfleet, forwarded ------------------------------------------------
    def _call(self, method: str, request, grpc_context):
        metadata = dict(grpc_context.invocation_metadata()) if grpc_context is not None else {}
        self.api_keys.check(metadata.get("authorization"))  # AuthenticationError: never forwarded
        return self.target.grpc.remote(method, request, metadata)

    @staticmethod
    def _unauthenticated(grpc_context, err: AuthenticationError) -> None:
        import grpc

        if grpc_context is not None:
            grpc_context.set_code(grpc.StatusCode.UNAUTHENTICATED)
            grpc_context.set_details(str(err))

    @staticmethod
    def _unavailable(grpc_context, err: BaseException) -> None:
        import grpc

        _, error, _ = _failure(err)
        if grpc_context is not None:
            grpc_context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED if _overloaded(err) else grpc.StatusCode.UNAVAILABLE)
            grpc_context.set_details(error["error"]["message"])

    async def Generate(self, request, grpc_context=None):
        from deploy.service import grpc_api

        reply = grpc_api.piece("", self.model_name, "")
        try:
            calls = self._call("Generate", request, grpc_context)
        except AuthenticationError as err:
            self._unauthenticated(grpc_context, err)
            return reply
        try:
            async for kind, *payload in calls:
                if kind == "message":
                    reply = payload[0]
                elif grpc_context is not None:
                    grpc_context.set_code(payload[0])
                    grpc_context.set_details(payload[1])
        except Exception as err:  # noqa: BLE001 - the replica failed
            self._unavailable(grpc_context, err)
        return reply

    async def GenerateStream(self, request, grpc_context=None):
        """Serve carries a status set on the context only with a yielded message or a raised
        exception, so a status is set, then an exception raised."""
        status = None
        try:
            calls = self._call("GenerateStream", request, grpc_context)
        except AuthenticationError as err:
            self._unauthenticated(grpc_context, err)
            raise RuntimeError(str(err)) from None
        try:
            async for kind, *payload in calls:
                if kind == "message":
                    yield payload[0]
                else:
                    status = payload
        except Exception as err:  # noqa: BLE001 - the replica failed
            self._unavailable(grpc_context, err)
            raise RuntimeError("the target replica is unavailable") from err
        if status is not None:
            if grpc_context is not None:
                grpc_context.set_code(status[0])
                grpc_context.set_details(status[1])
            raise RuntimeError(status[1])


def app_is_deleting() -> bool:
    """Whether this replica's Serve application is being deleted (not redeployed or scaled)."""
    try:
        from ray import serve

        app = serve.get_replica_context().app_name
        status = serve.status().applications.get(app)
    except Exception:  # noqa: BLE001 - not in a replica, or Serve unreachable: keep the pool
        return False
    return status is None or status.status == "DELETING"


class _Front:
    instance: SpecfleetFront | None = None


_front = _Front()


@front_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
async def forward(request: Request, path: str) -> Response:
    if _front.instance is None:
        raise RuntimeError("no SpecfleetFront in this process")
    return await _front.instance.forward(request)
