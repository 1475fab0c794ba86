"""A schema-driven fuzz of the HTTP API: schemathesis generates requests from the service's own
OpenAPI schema (GET /openapi.json), bodies that fit it and bodies that break it (and, for the
latter, keys that break the security scheme), and CLIENTS threads send them to the shared Ray
service over HTTP, a valid key on each. Every answer comes within the timeout (no hang),
is below 500, has a status the schema declares, and an error is OpenAI's shape; after the fuzz the
service has finished every request (the coordinator holds none) and still answers greedy requests
exactly as plain target decoding does.

Requests that fit the schema name the served model (any other name is a 404 before the rest of
the body is read) and ask for at most MAX_NEW_TOKENS tokens for at most MAX_PROMPTS prompts, so the fuzz exercises validation,
chat templates, sampling and streaming rather than long generations. The admin routes that change
the pool (POST, DELETE) are left out: they would start and stop actors of the shared service
(tests/service/test_service_admin.py covers their bad input)."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from tests.conftest import CHAT_PROMPTS, chat_text, plain_text
from tests.service.test_service_faults import coordinator_stats, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.model]

MODEL = "smollm2-135m"
MAX_NEW_TOKENS = 2
MAX_PROMPTS = 4  # per completions request (the server takes 64: a backlog of those is a load test, not a fuzz)
TIMEOUT_S = 60  # a request unanswered this long is a hang
# (path, method) -> examples per generation mode; hypothesis stops early where the schema allows
# fewer distinct requests (the GETs without parameters)
EXAMPLES = {
    ("/v1/chat/completions", "POST"): 250,
    ("/v1/completions", "POST"): 250,
    ("/v1/models", "GET"): 20,
    ("/admin/drafters", "GET"): 20,
    ("/health", "GET"): 20,
    ("/metrics", "GET"): 20,
}
MIN_REQUESTS = 1000
CLIENTS = 8  # requests in flight at once


def _within_bounds(body: object) -> object:
    """A fitting body, made to name the served model and ask for a few tokens for a few prompts only."""
    if isinstance(body, dict):
        body["model"] = MODEL
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            body["prompt"] = prompt[:MAX_PROMPTS]
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            # a whole float (6891.0) is an integer to the server too
            if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_NEW_TOKENS):
                body[field] = MAX_NEW_TOKENS
    return body


def _generated(operation, mode: GenerationMode, examples: int) -> list:
    """Up to `examples` distinct requests for `operation` in `mode` (hypothesis, from the schema;
    derandomized, so CI sends the same ones every run)."""
    cases = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(mode))
    def collect(case):
        if mode is GenerationMode.POSITIVE and case.body is not None:
            case.body = _within_bounds(case.body)
        cases.append(case)

    collect()
    return cases


def _answer(service, case) -> tuple[str, str, int | None, str | None, object]:
    """(path, method, status (None: no answer in time, a hang), what is wrong with the answer or
    None, the body sent) for one generated request."""
    token = service.admin_token if case.operation.path.startswith("/admin") else service.api_key
    try:
        response = case.call(base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S)
    except requests.Timeout:
        return case.operation.path, case.method, None, f"no answer within {TIMEOUT_S} s", case.body
    problem = None
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            if not (error["message"] and error["type"]):
                problem = response.text[:300]
        except (ValueError, KeyError, TypeError):
            problem = response.text[:300]
    return case.operation.path, case.method, response.status_code, problem, case.body


def test_a_thousand_generated_requests_get_no_server_error_and_the_service_stays_exact(service, target):
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json", timeout=TIMEOUT_S)
    cases = []
    for (path, method), examples in EXAMPLES.items():
        operation = schema[path][method]
        cases += _generated(operation, GenerationMode.POSITIVE, examples)
        if operation.body:  # a schema to break
            cases += _generated(operation, GenerationMode.NEGATIVE, examples)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda case: _answer(service, case), cases))
    print(f"fuzz: {len(answers)} requests; (path, status): count",
          dict(sorted(Counter((path, str(status)) for path, _, status, *_ in answers).items())))

    assert len(answers) >= MIN_REQUESTS
    hangs = [answer for answer in answers if answer[2] is None]
    assert not hangs, hangs[:5]
    server_errors = [answer for answer in answers if answer[2] >= 500]
    assert not server_errors, server_errors[:5]
    undeclared = [answer for answer in answers if str(answer[2]) not in schema[answer[0]][answer[1]].definition.raw["responses"]]
    assert not undeclared, undeclared[:5]
    not_openai_errors = [answer for answer in answers if answer[3] is not None]
    assert not not_openai_errors, not_openai_errors[:5]
    # generated cases reached generation and were refused too (valid chat messages are rare among
    # generated ones, ~1%: the exact chat below is the check that chat still generates)
    assert any(status == 200 for path, _, status, *_ in answers if path == "/v1/completions")
    assert any(status == 400 for path, _, status, *_ in answers if path == "/v1/completions")

    assert requests.get(f"{service.url}/health", timeout=TIMEOUT_S).status_code == 200
    wait_until(lambda: coordinator_stats()["active_requests"] == 0, 120, "every fuzzed request to be finished")
    assert chat_text(service.url, CHAT_PROMPTS[0], 24, service.api_key) == plain_text(target, CHAT_PROMPTS[0], 24)
