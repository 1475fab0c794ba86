"""Tenants are isolated: each API key's requests draft from their own history only, so a client
cannot tell from its acceptance whether a guessed text is in another client's history; and
per-request speculative metrics appear only when the config opts in."""
import pytest

from deploy.engine.request import GenerationResult, RoundTrace
from deploy.service.grpc_api import response
from deploy.service.openai_api import completion_body, usage_chunk_body
from tests.service.test_service import MODEL, post

# a text with no repeats inside it (prompt lookup finds nothing): only a past request can draft it
SECRET = "Quarterly memo 7731: the Halvorsen merger closes on the ninth; tell nobody before Friday. Summary:"


def drafters_used(body: dict) -> set[str]:
    """Every drafter that had a verified draft in the request (a tree round names each of them)."""
    per_drafter = body["metrics"]["speculative_decoding"]["per_drafter"]
    return {name for label, counts in per_drafter.items() if counts["drafted"] for name in label.split("+")}


def ask(service, key: str) -> dict:
    status, body = post(service, "/v1/completions", {"model": MODEL, "prompt": SECRET, "max_tokens": 40,
                                                       "temperature": 0}, authorization=f"Bearer {key}")
    assert status == 200
    return body


@pytest.mark.model
@pytest.mark.ray
def test_another_tenants_history_never_drafts_for_a_guess(service):
    tenant_a, tenant_b = service.api_key, service.other_api_key
    first = ask(service, tenant_a)  # A's text enters A's suffix cache
    guess = ask(service, tenant_b)  # B guesses A's text
    again = ask(service, tenant_a)
    assert guess["choices"][0]["text"] == first["choices"][0]["text"] == again["choices"][0]["text"]
    assert "suffix" not in drafters_used(guess)  # nothing of A's reached B's drafts
    accepted = again["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
    assert "suffix" in drafters_used(again) and accepted > guess["metrics"]["speculative_decoding"][
        "num_accepted_draft_tokens"]  # the positive control: A's own history drafts for A


def test_per_request_metrics_are_left_out_unless_the_config_opts_in():
    result = GenerationResult("hi", [5], "length", 3, [RoundTrace("suffix", 2, 1, 2, 1.0, 0.01, 0.02)])
    assert "metrics" not in completion_body("cmpl-1", MODEL, result, chat=False, with_metrics=False)
    assert "metrics" not in usage_chunk_body("cmpl-1", MODEL, False, result, with_metrics=False)
    assert completion_body("cmpl-1", MODEL, result, chat=False)["metrics"]["speculative_decoding"]["per_drafter"]
    assert not response("cmpl-1", MODEL, result, with_metrics=False).HasField("metrics")
    assert response("cmpl-1", MODEL, result).metrics.per_drafter["suffix"].accepted == 1
