"""The ingress checks keys and body size itself, before anything reaches a target replica: the
front (deploy/service/front.py) over a recording stand-in for its Serve handle, so a refused
request is shown never to have been forwarded."""
import asyncio

import grpc
import pytest
from fastapi.testclient import TestClient

from deploy.service.auth import ApiKeys
from deploy.service.front import SpecfleetFront, front_app

KEY, ADMIN = "tenant-key-1", "admin-token-1"
LIMIT = 4096


class RecordingHandle:
    """Stands in for the target deployment's handle; answers 200 "ok" and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.http, self.grpc = self._Method(self, "http"), self._Method(self, "grpc")

    def options(self, **_):
        return self

    class _Method:
        def __init__(self, handle, name):
            self.handle, self.name = handle, name

        def remote(self, *args):
            self.handle.calls.append((self.name, *args))
            return self._answer()

        async def _answer(self):
            if self.name == "http":
                yield 200, [("content-type", "application/json")]
                yield b'{"ok": true}'
            else:
                yield ("message", "reply")


class Context:
    def __init__(self, metadata: dict) -> None:
        self.metadata, self.code, self.details = metadata, None, ""

    def invocation_metadata(self):
        return list(self.metadata.items())

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


@pytest.fixture
def front():
    handle = RecordingHandle()
    front = SpecfleetFront(handle, LIMIT, "smollm2-135m", ApiKeys.from_keys([KEY]), ApiKeys.from_keys([ADMIN]))
    return front, handle, TestClient(front_app)


@pytest.mark.parametrize("path, authorization, status", [
    ("/v1/chat/completions", None, 401),
    ("/v1/chat/completions", "Bearer wrong", 401),
    ("/v1/chat/completions", f"Bearer {ADMIN}", 401),  # the admin token is not an API key
    ("/admin/drafters", f"Bearer {KEY}", 401),  # nor is an API key an admin token
])
def test_a_request_without_the_right_key_is_refused_at_the_door_and_never_forwarded(front, path, authorization, status):
    _, handle, client = front
    headers = {"Authorization": authorization} if authorization else {}
    reply = client.post(path, content=b"x" * (10 * LIMIT), headers=headers)
    assert reply.status_code == status and reply.json()["error"]["type"] == "authentication_error"
    assert handle.calls == []


def test_without_an_admin_token_the_admin_api_is_off_at_the_door():
    handle = RecordingHandle()
    SpecfleetFront(handle, LIMIT, "smollm2-135m", ApiKeys.from_keys([KEY]), ApiKeys())
    reply = TestClient(front_app).get("/admin/drafters", headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 403 and handle.calls == []


def test_a_chunked_body_over_the_limit_is_a_413_and_never_forwarded(front):
    _, handle, client = front
    chunks = (b"x" * 1024 for _ in range(64))  # no Content-Length: sent chunked
    reply = client.post("/v1/completions", content=chunks, headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 413 and handle.calls == []


def test_a_keyed_request_within_the_limit_is_forwarded_whole(front):
    _, handle, client = front
    body = b'{"model": "smollm2-135m", "prompt": "hi"}'
    reply = client.post("/v1/completions", content=iter([body[:10], body[10:]]), headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200 and reply.json() == {"ok": True}
    assert [(c[0], c[2], c[5]) for c in handle.calls] == [("http", "/v1/completions", body)]
    assert TestClient(front_app).get("/health").status_code == 200  # open routes need no key


@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_a_grpc_call_without_a_key_is_unauthenticated_and_never_forwarded(front, method):
    service, handle, _ = front
    context = Context({"application": "specfleet"})

    async def call():
        if method == "Generate":
            return await service.Generate("request", context)
        with pytest.raises(RuntimeError):
            async for _ in service.GenerateStream("request", context):
                pass

    asyncio.run(call())
    assert context.code == grpc.StatusCode.UNAUTHENTICATED and "API key" in context.details
    assert handle.calls == []
    keyed = Context({"application": "specfleet", "authorization": f"Bearer {KEY}"})
    assert asyncio.run(service.Generate("request", keyed)) == "reply" and len(handle.calls) == 1
