"""Peer runs: what a user would run instead, on the same model object, prompts and machine.

`peer:hf-generate` is Hugging Face transformers' `generate` (greedy, KV cache);
`peer:hf-batch` is `generate` on left-padded static batches: at concurrency c (the sweep), the
prompts in groups of c, each group one `generate` call (a request's latency is its group's time;
at concurrency 1 it is `hf-generate`); `peer:hf-cb` is transformers' continuous batching (its
manager, `init_continuous_batching`, with paged attention): at concurrency c, c client threads
each add a request and wait for its result (the manager is started before the clock, once per
level; its generation loop runs in a thread of its own); `peer:hf-serve` is the same continuous
batching served over HTTP by `transformers serve` (`HFServePeer`). `peer:hf-prompt-lookup` adds its
prompt-lookup drafting (`prompt_lookup_num_tokens=10`, the value its documentation uses, and its
default 2-gram matching); `peer:hf-assistant` uses the
configured draft model as its assistant model (its default dynamic draft-length schedule). Each
gets an explicit greedy GenerationConfig with the target's EOS ids, so its output is comparable
token for token with `ar`; the EOS token and anything after it are dropped, as the engine does.
The batching peers record each request's time to first token: a batch's first decoding step (its
prefill done), seen by a streamer; the manager's own token timestamps.
"""
from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from transformers.generation.streamers import BaseStreamer

from actors.errors import InvalidRequestError
from deploy.bench.prompts import BenchPrompt
from deploy.bench.sample import Sample
from deploy.engine.target import TargetModel

PEERS = ("hf-generate", "hf-prompt-lookup", "hf-assistant", "hf-batch", "hf-cb", "hf-serve")
SWEPT_PEERS = ("hf-batch", "hf-cb", "hf-serve")  # peers that also run at every concurrency level of the sweep
SWEPT_ONLY = ("hf-cb", "hf-serve")  # ... and at concurrency 1 too (a manager or server per level, not per prompt)
PROMPT_LOOKUP_NUM_TOKENS = 10


def available_peers(has_draft_model: bool) -> list[str]:
    return [p for p in PEERS if p != "hf-assistant" or has_draft_model]


class HFPeer:
    def __init__(self, name: str, target: TargetModel, draft_model: torch.nn.Module | None = None) -> None:
        if name not in PEERS:
            raise InvalidRequestError("runs", f"unknown peer {name!r}; known: {list(PEERS)}")
        if name == "hf-assistant" and draft_model is None:
            raise InvalidRequestError("runs", "peer:hf-assistant needs a draft model (--draft-model)")
        self.name, self.target = name, target
        self.options: dict = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_NUM_TOKENS} if name == "hf-prompt-lookup" else {}
        self.assistant = {"assistant_model": draft_model} if name == "hf-assistant" else {}

    def _config(self, max_tokens: int):
        from transformers import GenerationConfig

        eos = sorted(self.target.eos_ids)
        return GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos,
                                pad_token_id=eos[0] if eos else None, **self.options)

    @torch.inference_mode()
    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        start = time.perf_counter()
        ids = self.target.encode(prompt=item.prompt, messages=item.messages)
        input_ids = torch.tensor([ids], device=self.target.device)
        out = self.target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                         generation_config=self._config(max_tokens), **self.assistant)
        new = out[0, len(ids):].tolist()
        seconds = time.perf_counter() - start
        for i, token in enumerate(new):
            if token in self.target.eos_ids:
                new = new[:i]
                break
        return Sample.from_tokens(new, seconds)


class _FirstStep(BaseStreamer):
    """`generate`'s streamer that notes when the first new tokens arrive (its first `put` is the prompt)."""

    def __init__(self) -> None:
        self.puts, self.at = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


class HFBatchPeer:
    """`peer:hf-batch`: transformers' `generate` over left-padded batches of `concurrency` prompts."""

    def __init__(self, target: TargetModel) -> None:
        self.target, self.alone = target, HFPeer("hf-generate", target)

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        return self.alone.generate(item, max_tokens)

    @torch.inference_mode()
    def sweep(self, prompts: list[BenchPrompt], max_tokens: int, concurrency: int) -> tuple[list[Sample], float]:
        """-> (samples in prompt order, wall seconds)."""
        samples: list[Sample] = []
        start = time.perf_counter()
        pad = self.alone._config(max_tokens).pad_token_id or 0
        for first in range(0, len(prompts), concurrency):
            group_start = time.perf_counter()
            encoded = [self.target.encode(prompt=p.prompt, messages=p.messages) for p in prompts[first:first + concurrency]]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=self.target.device)
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=self.target.device)
            steps = _FirstStep()
            out = self.target.model.generate(input_ids, attention_mask=mask, generation_config=self.alone._config(max_tokens),
                                             streamer=steps)
            seconds = time.perf_counter() - group_start
            first_token_s = steps.at - group_start if steps.at is not None else None
            for row in out[:, width:].tolist():
                end = next((i for i, token in enumerate(row) if token in self.target.eos_ids), len(row))
                samples.append(Sample.from_tokens(row[:end], seconds, first_token_s))
        return samples, time.perf_counter() - start


class HFContinuousPeer:
    """`peer:hf-cb`: transformers' continuous batching manager, fed by `concurrency` clients."""

    def __init__(self, target: TargetModel) -> None:
        self.target, self.alone = target, HFPeer("hf-generate", target)

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        return self.sweep([item], max_tokens, 1)[0][0]

    @torch.inference_mode()
    def sweep(self, prompts: list[BenchPrompt], max_tokens: int, concurrency: int) -> tuple[list[Sample], float]:
        """-> (samples in prompt order, wall seconds)."""
        model = self.target.model
        attention = model.config._attn_implementation
        model.set_attn_implementation("sdpa")  # what its manager accepts on CPU (the engine's is restored below)
        manager = model.init_continuous_batching(generation_config=self.alone._config(max_tokens))
        manager.start()

        finished: dict[str, Future] = {}
        lock = threading.Lock()

        def one(item: BenchPrompt) -> Sample:
            start = time.perf_counter()
            with lock:  # registered before its result can arrive
                request = manager.add_request(self.target.encode(prompt=item.prompt, messages=item.messages),
                                              max_new_tokens=max_tokens, record_timestamps=True)
                done = finished.setdefault(request, Future())
            result = done.result(timeout=900)
            tokens, stamps = result.generated_tokens, result.timestamps or []
            end = next((i for i, token in enumerate(tokens) if token in self.target.eos_ids), len(tokens))
            return Sample.from_tokens(list(tokens[:end]), time.perf_counter() - start,
                                      stamps[0] - start if stamps else None)

        def collect() -> None:  # one reader of the manager's output queue
            for _ in prompts:
                while (result := manager.get_result(timeout=900)) is not None and not result.is_finished():
                    pass
                if result is None:
                    return
                with lock:
                    finished.setdefault(result.request_id, Future()).set_result(result)

        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrency + 1) as clients:
                collector = clients.submit(collect)
                samples = list(clients.map(one, prompts))
                collector.result()
            return samples, time.perf_counter() - start
        finally:
            manager.stop(block=True)
            model.set_attn_implementation(attention)


class HFServePeer:
    """`peer:hf-serve`: `transformers serve --continuous-batching` over HTTP, as a user runs it: a
    process of its own on 127.0.0.1, started for each level (not timed) and stopped after it,
    `concurrency` client threads streaming completions (a chat prompt through its chat endpoint,
    greedy: temperature 0). Its answers come back as text, without token ids: a text equal to
    plain decoding's (`reference`, the bench's `ar` token ids by prompt id) counts as those ids
    (encoding the same text again can merge tokens differently: 127 ids for 128 generated); any
    other text is encoded again, and so fails the lossless check. Its time to first token is the
    first chunk of text."""

    STARTUP_S = 180.0

    def __init__(self, target: TargetModel) -> None:
        from actors.models import resolve_model_dir

        self.target = target
        self.model_dir = str(resolve_model_dir(target.name)[0])
        self.reference: dict[str, list[int]] = {}

    def generate(self, item: BenchPrompt, max_tokens: int) -> Sample:
        return self.sweep([item], max_tokens, 1)[0][0]

    def sweep(self, prompts: list[BenchPrompt], max_tokens: int, concurrency: int) -> tuple[list[Sample], float]:
        """-> (samples in prompt order, wall seconds)."""
        server, url = self._start()
        try:
            self._ask(url, BenchPrompt("warmup", "warmup", prompt="Warm up."), 4)
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrency) as clients:
                samples = list(clients.map(lambda item: self._ask(url, item, max_tokens), prompts))
            return samples, time.perf_counter() - start
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()

    def _start(self) -> tuple[subprocess.Popen, str]:
        import sys
        import urllib.request

        from deploy.bench.service import free_port

        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", self.model_dir,
             "--continuous-batching", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype",
             str(self.target.model.dtype).removeprefix("torch.")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + self.STARTUP_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5).read()
                return server, url
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    raise RuntimeError("transformers serve did not start (is transformers' serving extra installed?)")
                time.sleep(0.5)

    def _ask(self, url: str, item: BenchPrompt, max_tokens: int) -> Sample:
        import json
        import urllib.request

        chat = item.messages is not None
        path, body = (("/v1/chat/completions", {"messages": item.messages}) if chat
                      else ("/v1/completions", {"prompt": item.prompt}))
        body |= {"model": self.model_dir, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
        request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        start, first_token_s, pieces = time.perf_counter(), None, []
        with urllib.request.urlopen(request, timeout=900) as response:
            for line in response:
                data = line.decode().removeprefix("data: ").strip()
                if not data or data == "[DONE]":
                    continue
                for choice in json.loads(data).get("choices", []):
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        first_token_s = first_token_s or time.perf_counter() - start
                        pieces.append(text)
        seconds, text = time.perf_counter() - start, "".join(pieces)
        token_ids = self.reference.get(item.id)
        if token_ids is None or self.target.decode(token_ids) != text:
            token_ids = self.target.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Sample.from_tokens(token_ids, seconds, first_token_s)
