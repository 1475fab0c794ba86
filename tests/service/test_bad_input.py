"""Bad requests and configurations raise InvalidRequestError naming the field; nothing breaks."""
import pytest

from actors.errors import InvalidRequestError
from actors.hf import HFModelProposer
from actors.models import load_causal_lm
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from tests.conftest import tiny_llama

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine(target):
    return SpeculativeEngine(target, build_drafters(["ngram", NO_DRAFT]), policy="metasd-ucb-cost")


@pytest.mark.parametrize(
    "request_kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"token_ids": [1, -4]}, "token_ids"),
        ({"token_ids": [10**9]}, "token_ids"),
        ({"prompt": "word " * 9000}, "prompt"),
    ],
)
def test_bad_prompts_name_the_field(engine, request_kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(**request_kwargs, sampling=SamplingParams(max_tokens=4))
    assert err.value.field == field


def test_max_tokens_beyond_the_context_names_max_tokens(engine, target):
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(prompt="Hello", sampling=SamplingParams(max_tokens=target.context_length))
    assert err.value.field == "max_tokens"


def test_the_engine_keeps_serving_after_bad_requests(engine):
    with pytest.raises(InvalidRequestError):
        engine.generate(prompt="")
    assert engine.generate(prompt="Hello", sampling=SamplingParams(max_tokens=3)).token_ids


@pytest.mark.parametrize("names", ["ngram,telepathy", "", "ngram,ngram", "hf"])
def test_unknown_or_impossible_drafters_name_the_drafters_field(names):
    with pytest.raises(InvalidRequestError) as err:
        build_drafters(names)
    assert err.value.field == "drafters"


def test_an_unknown_policy_names_the_policy_field(target):
    with pytest.raises(InvalidRequestError) as err:
        SpeculativeEngine(target, build_drafters(["ngram"]), policy="greedy-oracle")
    assert err.value.field == "policy"


@pytest.mark.parametrize("k", [0, 33, 2.0])
def test_a_bad_draft_length_names_k(target, k):
    with pytest.raises(InvalidRequestError) as err:
        SpeculativeEngine(target, build_drafters(["ngram"]), policy="fixed:ngram", k=k)
    assert err.value.field == "k"


def test_a_drafter_with_a_different_vocabulary_is_refused(target):
    with pytest.raises(InvalidRequestError) as err:
        HFModelProposer(tiny_llama(vocab_size=1000), target_vocab_size=target.vocab_size)
    assert err.value.field == "drafters" and "vocabulary" in err.value.message


def test_a_missing_model_path_names_the_model_field(tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        load_causal_lm(str(tmp_path / "nowhere"))
    assert err.value.field == "model"


def test_an_invalid_request_error_crosses_process_boundaries_with_its_field():
    import pickle

    err = pickle.loads(pickle.dumps(InvalidRequestError("top_p", "must be in (0, 1]")))
    assert (err.field, err.message, str(err)) == ("top_p", "must be in (0, 1]", "top_p: must be in (0, 1]")
