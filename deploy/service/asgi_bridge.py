"""One HTTP request through an ASGI app in this process, as plain data (no server, no Ray).

    async for item in call_asgi(app, method, path, query, headers, body): ...

yields the response start first, `(status, [(name, value), ...])` (header names and values as
str), then each body chunk as bytes, as the app sends them: a streamed (SSE) response arrives
chunk by chunk. This lets the front deployment (deploy/service/front.py) carry a request to the target
replica's FastAPI app over a Serve handle and stream the answer back.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

_DONE = object()


async def call_asgi(
    app, method: str, path: str, query: bytes, headers: Sequence[tuple[str, str]], body: bytes
) -> AsyncIterator[tuple[int, list[tuple[str, str]]] | bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
    }
    sent = asyncio.Queue()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects mid-request here
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(_DONE)

    task = asyncio.get_running_loop().create_task(run())
    try:
        while (message := await sent.get()) is not _DONE:
            if message["type"] == "http.response.start":
                yield message["status"], [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])
        await task  # re-raises what the app raised
    finally:
        if not task.done():
            task.cancel()
