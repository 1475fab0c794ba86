"""Sampling parameters validate themselves; one warp function shapes p and q alike."""
import math

import pytest
import torch

from actors.errors import InvalidRequestError
from actors.sampling import SamplingParams, warp_probs


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": "x"}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"seed": 2**64}, "seed"),  # beyond torch's generator: a 400, not a 503
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": ["x" * 257]}, "stop"),
        ({"logprobs": 21}, "top_logprobs"),
    ],
)
def test_bad_sampling_values_raise_an_error_naming_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field and field in str(err.value)


def test_temperature_zero_means_greedy():
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.5).greedy


def test_a_temperature_too_small_to_divide_by_decodes_greedily():
    tiny = SamplingParams(temperature=1e-9)
    logits = torch.tensor([[1e4, -1e4, 0.0]])
    assert tiny.greedy and not SamplingParams(temperature=1e-4).greedy
    probs = warp_probs(logits, tiny)  # no overflow to inf - inf = nan
    assert torch.isfinite(probs).all() and torch.allclose(probs, warp_probs(logits, SamplingParams()))


def test_the_widest_seeds_torch_takes_are_accepted():
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1 and SamplingParams(seed=-(2**63)).seed == -(2**63)
    torch.Generator().manual_seed(2**64 - 1)


def test_a_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)


def test_temperature_divides_the_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(warp_probs(logits, SamplingParams(temperature=0.5)), torch.softmax(logits / 0.5, -1))


def test_greedy_params_give_the_temperature_one_softmax():
    logits = torch.tensor([[0.3, -1.0, 2.0]])
    assert torch.allclose(warp_probs(logits, SamplingParams()), torch.softmax(logits, -1))


def test_top_k_keeps_exactly_k_tokens():
    probs = warp_probs(torch.tensor([0.1, 3.0, 2.0, -1.0, 1.0]), SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, True, False, False]
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs > 0).tolist() == [True, True, False, False]
    assert probs[0].item() == pytest.approx(0.5 / 0.8)


def test_top_p_always_keeps_the_most_likely_token():
    probs = warp_probs(torch.tensor([5.0, 0.0, 0.0]), SamplingParams(temperature=1.0, top_p=0.01))
    assert probs.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("top_p", [5e-324, 1e-50])  # below float32's smallest: 0 in the comparison
def test_a_top_p_too_small_for_float32_still_keeps_the_most_likely_token(top_p):
    probs = warp_probs(torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), SamplingParams(temperature=1.0, top_p=top_p))
    assert not probs.isnan().any()
    assert probs.sum(dim=-1).tolist() == [1.0, 1.0]
    assert probs[0].tolist() == [1.0, 0.0, 0.0]


def test_a_huge_temperature_samples_uniformly_and_never_yields_nan():
    probs = warp_probs(torch.tensor([5.0, 0.0, -3.0, 1.0]), SamplingParams(temperature=1e308, top_p=1e-300, top_k=3))
    assert not probs.isnan().any()
    assert probs.sum().item() == pytest.approx(1.0)
