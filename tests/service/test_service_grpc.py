"""gRPC through Ray Serve's gRPC proxy, with a real grpcio client, on the service the HTTP tests
use (tests/conftest.py: same Serve app `specfleet`, API key required): greedy text equals the HTTP
endpoint's, unary and streamed; bad input gets INVALID_ARGUMENT naming the field, a missing or
wrong key UNAUTHENTICATED; the port listens on 127.0.0.1 only."""
import json
import urllib.request

import grpc
import pytest

pytestmark = [pytest.mark.model, pytest.mark.ray]
MODEL = "smollm2-135m"
MAX_TOKENS = 40
CHAT = [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}]
STOP_PROMPT = "List the days of the week, one per line:\n1. Monday\n2."


@pytest.fixture(scope="module")
def pb():
    from deploy.service.proto import specfleet_pb2

    return specfleet_pb2


@pytest.fixture(scope="module")
def stub(service):
    from deploy.service.proto import specfleet_pb2_grpc

    channel = grpc.insecure_channel(service.grpc_address)
    yield specfleet_pb2_grpc.SpecfleetStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def metadata(service):
    return (("application", "specfleet"), ("authorization", f"Bearer {service.api_key}"))


def http(service, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{service.url}{path}", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {service.api_key}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def http_chat(service):
    return http(service, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": MAX_TOKENS,
                                                  "temperature": 0, "return_token_ids": True})["choices"][0]


def chat_request(pb, **fields):
    return pb.GenerateRequest(**{"messages": [pb.ChatMessage(**m) for m in CHAT], "max_tokens": MAX_TOKENS,
                                 "temperature": 0, **fields})


def test_unary_greedy_text_equals_the_http_endpoints(pb, stub, metadata, http_chat):
    reply = stub.Generate(chat_request(pb, model=MODEL), metadata=metadata, timeout=300)
    assert reply.text == http_chat["message"]["content"] and reply.text
    assert list(reply.token_ids) == http_chat["token_ids"]
    assert reply.finish_reason == http_chat["finish_reason"]
    assert reply.usage.completion_tokens == len(reply.token_ids) and reply.model == MODEL
    assert reply.metrics.num_spec_steps > 0 and set(reply.metrics.per_drafter) and reply.timing.rounds > 0


def test_streamed_greedy_text_equals_the_http_endpoints(pb, stub, metadata, http_chat):
    messages = list(stub.GenerateStream(chat_request(pb), metadata=metadata, timeout=300))
    assert len(messages) > 2  # text arrives in pieces
    assert "".join(m.text for m in messages) == http_chat["message"]["content"]
    *pieces, last = messages
    assert all(not m.finish_reason and not m.token_ids for m in pieces)
    assert last.finish_reason == http_chat["finish_reason"] and list(last.token_ids) == http_chat["token_ids"]
    assert last.usage.completion_tokens == len(last.token_ids) and last.metrics.num_spec_steps > 0


def test_a_streamed_completion_with_a_stop_string_equals_the_http_text(pb, service, stub, metadata):
    expected = http(service, "/v1/completions", {"model": MODEL, "prompt": STOP_PROMPT, "max_tokens": 24,
                                                 "temperature": 0, "stop": ["Thursday"]})["choices"][0]
    request = pb.GenerateRequest(prompt=STOP_PROMPT, max_tokens=24, temperature=0, stop=["Thursday"])
    messages = list(stub.GenerateStream(request, metadata=metadata, timeout=300))
    assert expected["finish_reason"] == "stop"  # the stop string was hit, mid-answer
    assert "".join(m.text for m in messages) == expected["text"] and "Thursday" not in expected["text"]
    assert messages[-1].finish_reason == "stop"


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"top_k": -1}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"model": "gpt-9"}, "model"),
        ({"prompt": "Hi"}, "prompt"),  # both prompt and messages
    ],
)
@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_bad_input_gets_invalid_argument_naming_the_field(pb, stub, metadata, method, fields, field):
    with pytest.raises(grpc.RpcError) as err:
        reply = getattr(stub, method)(chat_request(pb, **fields), metadata=metadata, timeout=60)
        list(reply) if method == "GenerateStream" else reply
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")


@pytest.mark.parametrize(
    "request_fields, field",
    [({}, "prompt"), ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role")],
)
def test_bad_prompts_get_invalid_argument_named_as_http_names_them(pb, stub, metadata, request_fields, field):
    messages = [pb.ChatMessage(**m) for m in request_fields.get("messages", [])]
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb.GenerateRequest(messages=messages, max_tokens=4), metadata=metadata, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(f"{field}: ")


@pytest.mark.parametrize(
    "authorization, problem",
    [(None, "missing API key"), ("Bearer not-the-key", "invalid API key")],
)
@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_a_missing_or_wrong_api_key_gets_unauthenticated(pb, stub, method, authorization, problem):
    metadata = [("application", "specfleet")] + ([("authorization", authorization)] if authorization else [])
    with pytest.raises(grpc.RpcError) as err:
        reply = getattr(stub, method)(pb.GenerateRequest(prompt="Hi", max_tokens=2), metadata=metadata, timeout=60)
        list(reply) if method == "GenerateStream" else reply
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert problem in err.value.details() and "not-the-key" not in err.value.details()


def test_the_grpc_port_listens_on_loopback_only(service):
    import psutil

    hosts = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.port == service.grpc_port}
    assert hosts and hosts <= {"127.0.0.1", "::ffff:127.0.0.1"}, hosts


def test_the_readme_grpc_client_snippet_runs(service, capsys):
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = readme.split("## The gRPC API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    for old, new in [("127.0.0.1:9000", service.grpc_address), ("max_tokens=64", "max_tokens=8"),
                     ('metadata = [("application", "specfleet")]',
                      f'metadata = [("application", "specfleet"), ("authorization", "Bearer {service.api_key}")]')]:
        assert old in code
        code = code.replace(old, new)
    exec(compile(code, "README.md", "exec"), {})
    assert "StatusCode.INVALID_ARGUMENT temperature: must be a number >= 0" in capsys.readouterr().out


def test_the_setup_hook_rewrites_only_wildcard_grpc_addresses_to_loopback(monkeypatch):
    from ray.serve._private import default_impl

    from cluster.local import bind_grpc_proxy_to_loopback

    bound = []
    monkeypatch.setattr(default_impl, "add_grpc_address", lambda server, address: bound.append(address))
    bind_grpc_proxy_to_loopback()
    bind_grpc_proxy_to_loopback()  # idempotent: wraps once
    for address in ("[::]:9000", "0.0.0.0:9001", "10.0.0.5:9002"):
        default_impl.add_grpc_address(None, address)
    assert bound == ["127.0.0.1:9000", "127.0.0.1:9001", "10.0.0.5:9002"]
