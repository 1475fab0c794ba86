"""`serve:<policy>` runs: the local HTTP service (Ray drafter actors, the coordinator actor, the
Serve replica) on 127.0.0.1, fed the bench prompts.

At every concurrency level c (`sweep`, 1 included) the whole prompt set is sent by c client
threads after the in-process runs (which run with no Ray cluster up), each level on a restarted
service: its suffix cache would otherwise hold the answers to these very prompts (measured: 5x
"faster" on the replay). Such a run's
tokens/s is throughput (all tokens over the wall time); each sample's seconds is that request's
latency. Requests stream (SSE, as interactive clients do): a sample's `first_token_s` is the
time to its first chunk of text; the token ids come on the finish chunk (`return_token_ids`)
and the per-request metrics on the usage chunk.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from deploy.bench.prompts import BenchPrompt
from deploy.bench.sample import Sample
from policy.registry import run_drafters, split_run_policy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _configured_key() -> str | None:
    """The first key of SPECFLEET_API_KEYS, if set: a service started here then requires it."""
    from deploy.service.auth import env_keys

    return next(iter(env_keys()), None)


class ServiceRun:
    """`start` brings up a local service for the run (and `stop` takes it down); `attach` drives
    one that is already serving at `url`."""

    def __init__(self, url: str, model: str, api_key: str | None = None, args: dict | None = None) -> None:
        self.url: str | None = url
        self.model, self.api_key, self.args = model, api_key, args

    @classmethod
    def configure(cls, label: str, drafters: Sequence[str], k: int, model: str) -> "ServiceRun":
        """A run not started yet (`restart` or `sweep` starts it). label: `<policy>[@<verify>][-without-<drafters>]`."""
        policy, verify = split_run_policy(label)
        args = {"target": {"model": model}, "policy": policy, "verify": verify, "k": k, "request_metrics": True,
                "drafters": [{"name": d, "kind": d} for d in run_drafters(label, drafters)]}
        return cls(None, model, _configured_key(), args)

    def restart(self) -> None:
        """A fresh service (new drafter actors: empty suffix caches, no bandit statistics)."""
        from deploy.service.app import start_local_service

        if self.args is None:
            raise RuntimeError("an attached service cannot be restarted from here")
        self.stop()
        self.url = start_local_service(self.args, port=free_port())
        self._post("/v1/completions", {"prompt": "Warm up.", "max_tokens": 4})

    @classmethod
    def attach(cls, url: str, model: str, api_key: str | None = None) -> "ServiceRun":
        return cls(url, model, api_key)

    def _request(self, path: str, body: dict) -> urllib.request.Request:
        body = {"model": self.model, "temperature": 0.0, "return_token_ids": True, **body}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)

    def _post(self, path: str, body: dict) -> dict:
        with urllib.request.urlopen(self._request(path, body), timeout=900) as response:
            return json.loads(response.read())

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        """One streamed request. -> its sample (latency, time to first text, token ids, metrics)."""
        chat = item.messages is not None
        path, body = (("/v1/chat/completions", {"messages": item.messages}) if chat
                      else ("/v1/completions", {"prompt": item.prompt}))
        body |= {"max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        first_token_s, token_ids, metrics = None, None, None
        with urllib.request.urlopen(self._request(path, body), timeout=900) as response:
            for line in response:
                data = line.decode().removeprefix("data: ").strip()
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"the service failed mid-stream: {chunk['error']}")
                for choice in chunk["choices"]:
                    text = choice["delta"].get("content") if chat else choice["text"]
                    if text and first_token_s is None:
                        first_token_s = time.perf_counter() - start
                    token_ids = choice.get("token_ids", token_ids)
                metrics = chunk.get("metrics", metrics)
        seconds = time.perf_counter() - start
        if token_ids is None:
            raise RuntimeError("the stream ended without its finish chunk")
        return Sample.from_http({"choices": [{"token_ids": token_ids}], **({"metrics": metrics} if metrics else {})},
                                seconds, first_token_s)

    def sweep(self, prompts: Sequence[BenchPrompt], max_tokens: int, concurrency: int) -> tuple[list[Sample], float]:
        """Every prompt through `concurrency` client threads. -> (samples in prompt order, wall seconds)."""
        if self.args is not None:
            self.restart()
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as clients:
            samples = list(clients.map(lambda item: self.generate(item, max_tokens), prompts))
        return samples, time.perf_counter() - start

    def stop(self) -> None:
        """Stop a service this run started (an attached one keeps serving)."""
        if self.url is not None and self.args is not None:
            from deploy.service.app import stop_local_service

            stop_local_service(self.args)
            self.url = None
