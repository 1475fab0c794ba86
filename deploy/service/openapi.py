"""The HTTP API's OpenAPI schema (GET /openapi.json), declared to match what the routes really do.

The routes read their JSON bodies themselves (so that every error is OpenAI's shape, naming the
field), so FastAPI cannot infer them; `json_body(model)` declares a route's body as the pydantic
model it validates against, and `install_schema(app, models)` puts those models into the schema's
`components`. `V1_ERRORS` / `ADMIN_ERRORS` list the statuses the routes answer besides success,
each with OpenAI's error body (`ErrorResponse`). A client generator, a gateway, or the fuzz in
tests/service/test_fuzz.py reads the same contract the server enforces. Pure; no Ray, no model.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str  # the HTTP status, or OpenAI's name for the error (model_not_found)


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _error(description: str) -> dict:
    return {"description": description, "model": ErrorResponse}


V1_ERRORS: dict[int | str, dict] = {
    400: _error("a field is invalid or not supported (`param` names it)"),
    401: _error("no API key, or not a known one"),
    404: _error("the model is not served here (`model_not_found`)"),
    413: _error("the body is over the service's `max_request_bytes`"),
    503: _error("the target replica is unavailable; retry"),
}
ADMIN_ERRORS: dict[int | str, dict] = {
    400: _error("a field is invalid (`param` names it)"),
    401: _error("no admin token, or not the service's"),
    403: _error("the service has no admin token: the admin API is off"),
    404: _error("no drafter of that name"),
    409: _error("the name is taken, or removing it would leave the policy without an arm"),
    413: _error("the body is over the service's `max_request_bytes`"),
    501: _error("this server drafts in-process (no Ray pool to manage)"),
    503: _error("no resources for the drafter, or the target replica is unavailable"),
}
STREAMED = {200: {"description": "the completion (JSON), or server-sent events with `stream: true`",
                  "content": {"application/json": {}, "text/event-stream": {}}}}


def json_body(model: type[BaseModel]) -> dict:
    """A route's `openapi_extra`: a required JSON body of `model` (see install_schema)."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_schema(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Make `app.openapi()` include `models` (and what they refer to) under components.schemas."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, definitions = models_json_schema([(model, "validation") for model in models], ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
