"""The client side of the admin API (`specfleet drafters list|add|remove`): plain HTTP, no Ray.

`AdminClient(url, token)` calls GET/POST /admin/drafters and DELETE /admin/drafters/{name} with
`Authorization: Bearer <admin token>`; a non-2xx answer raises `AdminError` carrying the HTTP
status and the server's error message. The token comes from deploy/service/auth.py's sources
(SPECFLEET_ADMIN_TOKEN, SPECFLEET_ADMIN_TOKEN_FILE, ~/.specfleet/admin_token).
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class AdminClient:
    def __init__(self, url: str, token: str | None, timeout_s: float = 900.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s  # adding a drafter may wait for the autoscaler to add a GPU node

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = err.reason
            raise AdminError(err.code, message) from None

    def list(self) -> list[dict]:
        return self._call("GET", "/admin/drafters")["data"]

    def add(self, drafter: dict) -> dict:
        return self._call("POST", "/admin/drafters", drafter)

    def remove(self, name: str) -> dict:
        return self._call("DELETE", f"/admin/drafters/{urllib.parse.quote(name, safe='')}")
