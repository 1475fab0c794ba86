"""What both fronts share (deploy/service/generation.py): streamed pieces add up to the non-streamed text
(stop strings, incomplete UTF-8), and a failing target is 503 over HTTP and UNAVAILABLE over gRPC
(in-process server with its drafting pool made to fail, as when the coordinator actor dies)."""
import asyncio
import json
from concurrent.futures import Future

import grpc
import pytest
from starlette.requests import Request

from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.request import GenerationResult
from deploy.engine.scheduler import BatchScheduler
from deploy.service.detokenize import IncrementalDetokenizer
from deploy.service.generation import AbandonedError, Finished, StopHoldback, TrackedEngine, stream
from deploy.service.metrics import ServiceMetrics

PROMPT = "List the days of the week, one per line:\n1. Monday\n2."


def test_text_that_could_start_a_stop_string_is_held_back():
    holdback = StopHoldback(["STOP"])
    assert holdback.advance("Hello ST") == "Hello"  # the last 3 characters could still become STOP
    assert holdback.advance("AR") == " S"
    assert holdback.finish("Hello STAR") == "TAR"


def test_streaming_cuts_at_a_stop_string_even_inside_one_round():
    holdback = StopHoldback(["\n\n"])
    assert holdback.advance("one\n\ntwo three") == "one"  # the round went past the stop string
    assert holdback.advance(" four") == ""
    assert holdback.finish("one") == ""


def test_a_stop_string_split_across_rounds_is_found():
    holdback = StopHoldback(["<END>"])
    assert holdback.advance("abc<E") == "a"  # 4 characters held: "bc<E" could end in a stop string
    assert holdback.advance("N") == "b"
    assert holdback.advance("D> more") == "c"
    assert holdback.advance("text") == "" and holdback.finish("abc") == ""


@pytest.mark.model
def test_incremental_detokenising_adds_up_to_decoding_the_whole_output_and_never_splits_a_character(target):
    text = "café 😀 ok — “quotes” 日本語\n\n  spaced\tout. Ελληνικά"
    tokens = target.tokenizer.encode(text, add_special_tokens=False) + [min(target.eos_ids)]
    for chunk in (1, 3):
        detokenizer = IncrementalDetokenizer(target)
        pieces = [detokenizer.add(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
        assert "".join(pieces) == target.decode(tokens) and not any("\ufffd" in p for p in pieces)
        assert chunk > 1 or "" in pieces  # one at a time, a character's first bytes wait for the rest


class _BytesTarget:
    """A tokenizer without a fast backend: one token per UTF-8 byte."""

    tokenizer = object()

    @staticmethod
    def decode(tokens):
        return bytes(tokens).decode("utf-8", errors="replace")


def test_without_a_fast_tokenizer_detokenising_decodes_the_whole_output_and_holds_an_incomplete_character():
    tokens = list("café 😀!".encode())
    detokenizer = IncrementalDetokenizer(_BytesTarget())
    pieces = [detokenizer.add([t]) for t in tokens]
    assert "".join(pieces) == "café 😀!" and not any("\ufffd" in p for p in pieces)
    assert pieces[-2:] == ["😀", "!"] and pieces[3] == ""


class _StubScheduler:
    target = None

    def submit(self, *args, **kwargs):
        future = Future()
        future.set_result(GenerationResult("generated", [1], "length", 1))
        return future


def gauges(metrics: ServiceMetrics) -> tuple[float, float]:
    return metrics.waiting._value.get(), metrics.running._value.get()


def test_a_tracked_request_counts_waiting_then_running_then_nothing():
    metrics = ServiceMetrics()
    tracked = TrackedEngine(_StubScheduler(), metrics)
    assert gauges(metrics) == (1, 0)
    assert tracked.submit([1], SamplingParams()).result().text == "generated"
    tracked.close()
    assert gauges(metrics) == (0, 0)


def test_a_request_closed_before_it_joins_the_batch_never_generates_and_leaves_no_count():
    metrics = ServiceMetrics()
    tracked = TrackedEngine(_StubScheduler(), metrics)
    tracked.close()  # its client went away before it was submitted
    with pytest.raises(AbandonedError):
        tracked.submit([1], SamplingParams())
    tracked.close()
    assert gauges(metrics) == (0, 0)


@pytest.fixture(scope="module")
def scheduler(target):
    return BatchScheduler(SpeculativeEngine(target, build_drafters(["ngram", "none"]), policy="metasd-ucb",
                                            max_padding=0))


@pytest.mark.model
def test_a_generating_request_whose_client_left_ends_before_its_next_round_and_frees_its_sessions(target, scheduler):
    metrics = ServiceMetrics()
    tracked = TrackedEngine(scheduler, metrics)
    rounds = []

    def on_tokens(tokens):
        rounds.append(tokens)
        tracked.close()  # the client went away during the first round

    result = tracked.submit(target.encode(prompt=PROMPT), SamplingParams(max_tokens=64), on_tokens).result()
    assert result.finish_reason == "abort"
    assert len(rounds) == len(result.rounds) == 1 and len(result.token_ids) < 64
    assert scheduler.engine.coordinator.stats()["active_requests"] == 0
    assert gauges(metrics) == (0, 0)
    assert 'finished_reason="abort"' in metrics.render().decode()


@pytest.mark.model
@pytest.mark.parametrize("stop", [("Thursday",), ("\n", "day")])
def test_streamed_pieces_add_up_to_the_non_streamed_text(target, scheduler, stop):
    sampling = SamplingParams(max_tokens=24, stop=stop)

    async def collect():
        return [item async for item in stream(scheduler, target.encode(prompt=PROMPT), sampling)]

    *pieces, done = asyncio.run(collect())
    assert isinstance(done, Finished) and done.result.finish_reason == "stop"  # a stop string was hit
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == done.result.text == scheduler.engine.generate(prompt=PROMPT, sampling=sampling).text


class FailingCoordinator:
    """Stands in for a dead coordinator actor: every call to draft raises."""

    reward_kind = "be"

    def propose_batch(self, *args, **kwargs):
        raise RuntimeError("The actor died unexpectedly before finishing this task.")

    def finish(self, *args):
        pass


class FakeGrpcContext:
    """The part of Ray Serve's RayServegRPCContext the server uses."""

    def __init__(self, metadata=()):
        self.metadata, self.code, self.details = list(metadata), None, None

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


@pytest.fixture(scope="module")
def failing_server():
    from deploy.service.server import SpecfleetServer

    server = SpecfleetServer({"policy": "fixed:ngram", "max_padding": 0, "drafters": [{"name": "ngram", "kind": "ngram"}]})
    server.engine.coordinator = FailingCoordinator()
    return server


def http_request(body: dict) -> Request:
    payload = json.dumps(body).encode()

    async def receive():
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


@pytest.mark.model
def test_a_failing_target_is_a_503_over_http(failing_server):
    body = {"model": failing_server.model_name, "prompt": "Hi", "max_tokens": 4}
    response = asyncio.run(failing_server.serve_request(http_request(body), chat=False))
    error = json.loads(response.body)["error"]
    assert response.status_code == 503 and error["type"] == "service_unavailable_error"
    assert "RuntimeError" in error["message"] and "retry" in error["message"]


@pytest.mark.model
def test_a_target_failing_mid_stream_ends_the_sse_stream_with_a_503_error_event(failing_server):
    body = {"model": failing_server.model_name, "prompt": "Hi", "max_tokens": 4, "stream": True}

    async def events():
        response = await failing_server.serve_request(http_request(body), chat=False)
        return [chunk async for chunk in response.body_iterator]

    chunks = asyncio.run(events())
    assert json.loads(chunks[-2][len("data: "):])["error"]["code"] == 503 and chunks[-1] == "data: [DONE]\n\n"


@pytest.mark.model
@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_a_failing_target_is_unavailable_over_grpc(failing_server, method):
    from deploy.service.proto import specfleet_pb2 as pb

    context = FakeGrpcContext()

    async def call():
        if method == "Generate":
            return await failing_server.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=4), grpc_context=context)
        return [m async for m in failing_server.GenerateStream(pb.GenerateRequest(prompt="Hi", max_tokens=4),
                                                               grpc_context=context)]

    if method == "Generate":
        asyncio.run(call())
    else:
        with pytest.raises(Exception):  # Serve sends the status set on the context when this raises
            asyncio.run(call())
    assert context.code == grpc.StatusCode.UNAVAILABLE and "retry" in context.details
