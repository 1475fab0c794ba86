"""The Ray service end to end on 127.0.0.1: drafter actors, the coordinator actor and the target
as a Ray Serve deployment, exercised with the official `openai` client and raw HTTP. The service
(tests/conftest.py, shared with tests/service/test_service_grpc.py) requires an API key on /v1/*."""
import concurrent.futures
import json
import urllib.error
import urllib.request

import pytest

from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine

pytestmark = [pytest.mark.model, pytest.mark.ray]
MODEL = "smollm2-135m"
MAX_TOKENS = 40
CHATS = [
    [{"role": "user", "content": "Summarize: The council met on Tuesday to discuss the new park. Residents raised "
                                 "concerns about parking and noise. The council agreed to meet again next month."}],
    [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}],
]
COMPLETION_PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    greedy = SamplingParams(max_tokens=MAX_TOKENS)
    return {
        "chat": [engine.generate(messages=m, sampling=greedy).text for m in CHATS],
        "completion": engine.generate(prompt=COMPLETION_PROMPT, sampling=greedy).text,
    }


def post(service, path: str, body: dict | bytes, authorization: str | None = "") -> tuple[int, dict]:
    """POST JSON to the service; sends its API key unless `authorization` is given (None: no header)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization or f"Bearer {service.api_key}"
    request = urllib.request.Request(f"{service.url}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_chat_over_http_equals_plain_decoding(client, plain):
    for messages, expected in zip(CHATS, plain["chat"]):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        assert reply.choices[0].message.content == expected
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens > 0


def test_completions_over_http_equal_plain_decoding_and_carry_spec_metrics(service, plain):
    status, body = post(service, "/v1/completions",
                        {"model": MODEL, "prompt": COMPLETION_PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == plain["completion"]
    metrics = body["metrics"]["speculative_decoding"]
    assert {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
            "num_draft_tokens", "num_accepted_draft_tokens", "per_drafter"} <= set(metrics)


def test_the_openai_client_lists_the_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_streamed_text_equals_the_non_streamed_text(client, plain):
    stream = client.chat.completions.create(model=MODEL, messages=CHATS[1], max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk
    assert "".join(pieces) == plain["chat"][1]
    assert finish in ("stop", "length")
    assert usage is not None and usage.usage.completion_tokens > 0
    assert "speculative_decoding" in usage.model_extra["metrics"]


def test_streamed_completion_ends_with_done_and_its_finish_chunk_carries_the_token_ids(service):
    body = {"model": MODEL, "prompt": COMPLETION_PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    request = urllib.request.Request(
        f"{service.url}/v1/completions", data=json.dumps(body | {"stream": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {service.api_key}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        lines = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    finish = [choice for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    status, whole = post(service, "/v1/completions", body)
    assert status == 200 and [choice["token_ids"] for choice in finish] == [whole["choices"][0]["token_ids"]]
    assert all("token_ids" not in choice for chunk in chunks for choice in chunk["choices"] if not choice["finish_reason"])


def test_two_concurrent_requests_both_come_back_exact(client, plain):
    def ask(messages):
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS,
                                              temperature=0).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, CHATS))
    assert answers == plain["chat"]


def test_metrics_count_drafts_per_drafter(service, client):
    client.chat.completions.create(model=MODEL, messages=CHATS[0], max_tokens=MAX_TOKENS, temperature=0)
    with urllib.request.urlopen(f"{service.url}/metrics", timeout=60) as response:
        text = response.read().decode()
    pulls = [line for line in text.splitlines() if line.startswith("specfleet:bandit_arm_pulls_total{")]
    assert pulls and sum(float(line.rsplit(" ", 1)[1]) for line in pulls) > 0
    assert "specfleet:spec_decode_num_draft_tokens_total{" in text
    assert "specfleet:e2e_request_latency_seconds_count" in text
    assert 'model_name="smollm2-135m"' in text and 'replica="' in text  # which replica answered the scrape


def test_the_coordinator_actor_aggregates_feedback_and_frees_sessions(service, client):
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME
    from cluster.drafter_actor import DRAFTER_PREFIX

    client.completions.create(model=MODEL, prompt="Repeat after me: red green blue. red green blue. red green",
                              max_tokens=24, temperature=0)
    stats = ray.get(ray.get_actor(COORDINATOR_NAME).stats.remote())
    assert stats["active_requests"] == 0
    assert sum(d["pulls"] for d in stats["drafters"].values()) > 0
    hosted = ray.get(ray.get_actor(COORDINATOR_NAME).hosted_drafters.remote())
    assert {name: d["open_sessions"] for name, d in hosted.items()} == {"ngram": 0, "hierarchy": 0, "none": 0}
    assert ray.get(ray.get_actor(DRAFTER_PREFIX + "suffix").open_sessions.remote()) == 0  # the one drafter actor


def test_the_service_drafts_with_the_chosen_drafter_and_the_model_free_shadows_and_scores_them(service, client):
    """The shared service verifies in `tree` mode: each round the coordinator actor asks the chosen
    drafter and every model-free drafter in parallel, the replica verifies the node-cut tree of
    their drafts, and the drafts left out are scored counterfactually."""
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME

    coordinator = ray.get_actor(COORDINATOR_NAME)
    before = ray.get(coordinator.stats.remote())
    reply = client.completions.create(model=MODEL, prompt="Count: one two three, one two three, one two",
                                      max_tokens=24, temperature=0)
    per_drafter = reply.model_extra["metrics"]["speculative_decoding"]["per_drafter"]
    assert sum(counts["drafted"] for counts in per_drafter.values()) > 0, per_drafter
    after = ray.get(coordinator.stats.remote())
    assert before["verify"] == after["verify"] == "tree"
    assert sum(after["drafters"][n]["counterfactual"] - before["drafters"][n]["counterfactual"] for n in after["drafters"]) > 0


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "best_of": 3}, 400, "best_of"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": 7}, 400, "stop"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 2**64}, 400, "seed"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": ["x"] * 17}, 400, "stop"),
        ({"model": MODEL, "messages": "hi"}, 400, "messages"),
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 42}]}, 400, "messages.0.content"),
        ({"model": MODEL, "messages": [{"role": "user"}]}, 400, "messages.0.content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi " * 9000}]}, 400, "messages"),
        (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "temperature"),
        (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]', 400, None),
        (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
        (b"[1, 2, 3]", 400, None),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode(), 413, None),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(service, body, status, param):
    code, reply = post(service, "/v1/chat/completions", body)
    assert code == status
    assert reply["error"]["param"] == param and reply["error"]["message"]
    assert reply["error"]["code"] == ("model_not_found" if status == 404 else status)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": {"text": "hi"}}, "prompt"),
        ({"model": MODEL, "prompt": ""}, "prompt"),
        ({"model": MODEL, "prompt": [1, 2, 10**9]}, "prompt"),
        ({"model": MODEL, "prompt": list(range(1, 9000))}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "top_k": -1}, "top_k"),
        ({"model": MODEL, "prompt": "hi", "seed": "abc"}, "seed"),
    ],
)
def test_bad_completion_requests_get_a_400_naming_the_field(service, body, param):
    code, reply = post(service, "/v1/completions", body)
    assert code == 400 and reply["error"]["param"] == param


def test_malformed_json_is_a_400_and_the_service_keeps_serving(service, client):
    code, reply = post(service, "/v1/completions", b"{not json")
    assert code == 400 and "JSON" in reply["error"]["message"]
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text is not None


def test_the_coordinator_prefers_the_drafter_that_fits_the_workload(service, client):
    """Copying a passage favours prompt lookup (ngram, and hierarchy which starts with it) over a
    cache of unrelated past requests (suffix) and over not drafting at all."""
    import ray

    from cluster.coordinator_actor import COORDINATOR_NAME

    coordinator = ray.get_actor(COORDINATOR_NAME)
    before = ray.get(coordinator.stats.remote())["drafters"]
    passages = ["the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat",
                "seven small boats sailed past the old lighthouse before the storm reached the harbour",
                "a gentle rain fell on the quiet village as the baker opened his shop at dawn"]
    for passage in passages:
        client.completions.create(model=MODEL, prompt=f"Copy this text exactly.\nText: {passage}\nCopy: {passage}\n"
                                  f"Text: {passage}\nCopy:", max_tokens=40, temperature=0)
    after = ray.get(coordinator.stats.remote())["drafters"]
    pulls = {name: after[name]["pulls"] - before[name]["pulls"] for name in after}
    assert min(pulls["ngram"], pulls["hierarchy"]) > max(pulls["suffix"], pulls["none"]), pulls


@pytest.mark.parametrize(
    "authorization, problem",
    [(None, "missing API key"), ("Token abc", "must be `Bearer <key>`"), ("Bearer not-the-key", "invalid API key")],
)
def test_v1_without_a_valid_api_key_gets_a_401_naming_the_problem(service, authorization, problem):
    code, reply = post(service, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}, authorization)
    assert code == 401
    assert problem in reply["error"]["message"] and reply["error"]["type"] == "authentication_error"
    assert "not-the-key" not in json.dumps(reply) and service.api_key not in json.dumps(reply)


def test_the_openai_client_with_a_wrong_key_gets_an_authentication_error(service):
    from openai import AuthenticationError, OpenAI

    wrong = OpenAI(base_url=f"{service.url}/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(AuthenticationError) as err:
        wrong.models.list()
    assert err.value.status_code == 401 and "invalid API key" in str(err.value)


def test_health_and_metrics_stay_open_and_never_show_the_key(service, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    with urllib.request.urlopen(f"{service.url}/health", timeout=60) as response:
        assert json.loads(response.read()) == {"status": "ok"}
    with urllib.request.urlopen(f"{service.url}/metrics", timeout=60) as response:
        assert response.status == 200 and service.api_key not in response.read().decode()


def test_the_local_cluster_runs_quiet_what_the_service_does_not_use_is_off(service, client):
    import ray
    from ray._private.state import state

    from cluster.local import QUIET_ENV, QUIET_SYSTEM_CONFIG

    config = state.get_system_config()
    assert {name: config.get(name) for name in QUIET_SYSTEM_CONFIG} == QUIET_SYSTEM_CONFIG
    assert "object_spilling_config" not in QUIET_SYSTEM_CONFIG  # Ray wrote into a copy: a later start is as the first

    @ray.remote(num_cpus=0)
    def environment(names):  # a worker process, as Serve's controller, proxies and replicas are
        import os

        return {name: os.environ.get(name) for name in names}

    assert ray.get(environment.remote(list(QUIET_ENV))) == QUIET_ENV
    answer = client.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=4, temperature=0)
    assert answer.choices[0].text  # it still serves
