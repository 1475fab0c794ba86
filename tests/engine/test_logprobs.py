"""Log-probabilities of the emitted tokens: the target's own, from the verification forwards, equal
to a plain forward over the whole output, for chains and trees, and cut with the text at a stop."""
import pytest
import torch

from actors.errors import InvalidRequestError
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.cost_model import max_positions
from deploy.engine.engine import SpeculativeEngine
from tests.engine.test_counterfactual import FixedCosts

pytestmark = pytest.mark.model
MESSAGES = [{"role": "user", "content": "Repeat exactly: the red fox ran to the river, and the red fox ran to the "
                                        "river again, and then the red fox ran home."}]


def plain_logprobs(target, prompt_ids: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt_ids + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1: -1], dim=-1)  # [len(output), V]


@pytest.mark.parametrize("verify", ["chosen", "tree"])
def test_each_emitted_token_carries_the_targets_log_probability_and_its_top_alternatives(target, verify):
    engine = SpeculativeEngine(target, build_drafters("ngram,suffix,hierarchy", None, target.vocab_size),
                               policy="metasd-ucb", k=5, verify=verify,
                               costs=FixedCosts(max_positions(5)))
    prompt_ids = target.encode(messages=MESSAGES)
    result = engine.run(prompt_ids, SamplingParams(max_tokens=32, logprobs=3))
    expected = plain_logprobs(target, prompt_ids, result.token_ids)
    assert [t.token_id for t in result.logprobs] == result.token_ids
    assert len(result.rounds) < len(result.token_ids)  # several tokens came from one forward
    for i, token in enumerate(result.logprobs):
        assert token.logprob == pytest.approx(expected[i, token.token_id].item(), abs=1e-3)
        assert len(token.top) == 3 and token.top[0][0] == token.token_id  # greedy emits the most likely
        assert [lp for _, lp in token.top] == sorted((lp for _, lp in token.top), reverse=True)


def test_logprobs_stop_where_the_text_stops_and_are_absent_unless_asked(target):
    engine = SpeculativeEngine(target, build_drafters("ngram", None, target.vocab_size), policy="fixed:ngram",
                               costs=FixedCosts(max_positions(7)))
    prompt_ids = target.encode(messages=MESSAGES)
    stopped = engine.run(prompt_ids, SamplingParams(max_tokens=40, stop=("river",), logprobs=0))
    assert stopped.finish_reason == "stop" and len(stopped.logprobs) == len(stopped.token_ids)
    assert all(t.top == () for t in stopped.logprobs)
    assert engine.run(prompt_ids, SamplingParams(max_tokens=4)).logprobs is None


def test_more_than_twenty_alternatives_is_refused_naming_top_logprobs():
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(logprobs=21)
    assert err.value.field == "top_logprobs"
