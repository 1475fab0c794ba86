"""Verification is lossless: greedy keeps the target's argmax path; sampling reproduces p exactly.

The distribution test follows vLLM's rejection-sampler convergence test: hand-built p and q over a
small vocabulary, >= 100k rounds, empirical distribution of the emitted tokens vs p. A deliberately
broken residual (resample from p instead of norm(max(0, p - q))) must fail the same check.
"""
import numpy as np
import pytest
import torch

import deploy.engine.verify as verify_module
from actors.proposal import SparseDist
from actors.sampling import SamplingParams
from deploy.engine.verify import greedy_accept, residual_distribution, speculative_accept, verify

SAMPLES = 120_000
P = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05],    # p_1
                  [0.05, 0.10, 0.20, 0.25, 0.40],    # p_2
                  [0.20, 0.20, 0.20, 0.20, 0.20]])   # p_3 (bonus)
Q = torch.tensor([[0.10, 0.10, 0.10, 0.30, 0.40],    # q_1: far from p_1
                  [0.30, 0.30, 0.20, 0.10, 0.10]])   # q_2


def emitted_distributions(samples: int = SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """Frequencies of the first emitted token, and of the second when two or more were emitted."""
    gen = torch.Generator().manual_seed(1234)
    drafts = torch.stack([torch.multinomial(Q[j], samples, replacement=True, generator=gen) for j in range(2)], 1)
    first, second = np.zeros(5), np.zeros(5)
    for draft in drafts.tolist():
        _, emitted = speculative_accept(draft, P, Q, gen)
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            second[emitted[1]] += 1
    return first / first.sum(), second / second.sum()


def total_variation(a: np.ndarray, b: torch.Tensor) -> float:
    return 0.5 * float(np.abs(a - b.numpy()).sum())


def test_speculative_sampling_emits_tokens_distributed_as_the_target():
    first, second = emitted_distributions()
    assert total_variation(first, P[0]) < 0.01
    assert total_variation(second, P[1]) < 0.01


def test_a_broken_residual_fails_the_same_distribution_check(monkeypatch):
    monkeypatch.setattr(verify_module, "residual_distribution", lambda p, q: p)
    first, _ = emitted_distributions()
    assert total_variation(first, P[0]) > 0.05


def test_residual_is_the_normalised_positive_part_of_p_minus_q():
    residual = residual_distribution(P[0], Q[0])
    expected = torch.clamp(P[0] - Q[0], min=0)
    assert torch.allclose(residual, expected / expected.sum())


def test_a_point_mass_draft_is_accepted_with_probability_p_of_the_token():
    gen = torch.Generator().manual_seed(7)
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    accepted = sum(speculative_accept([0], p, q, gen)[0] for _ in range(20_000))
    assert accepted / 20_000 == pytest.approx(0.3, abs=0.015)


def test_greedy_accepts_the_longest_prefix_matching_the_target_argmax():
    logits = torch.full((4, 10), -5.0)
    for position, token in enumerate([3, 1, 4, 9]):
        logits[position, token] = 5.0
    assert greedy_accept([3, 1, 7], logits) == (2, [3, 1, 4])
    assert greedy_accept([3, 1, 4], logits) == (3, [3, 1, 4, 9])
    assert greedy_accept([8], logits) == (0, [3])
    assert greedy_accept([], logits[:1]) == (0, [3])


def test_verify_reports_the_overlap_of_p_and_q_at_every_drafted_position():
    logits = torch.log(P)
    q = (SparseDist((3, 4), (0.5, 0.5)), SparseDist((0,), (1.0,)))
    result = verify([3, 0], q, logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert result.num_drafted == 2
    assert result.overlaps == pytest.approx((0.10 + 0.05, 0.05), abs=1e-6)


def test_greedy_verify_scores_a_point_mass_by_the_target_probability_of_the_token():
    logits = torch.log(P)
    result = verify([0, 3], None, logits, SamplingParams(), torch.Generator())
    assert result.accepted == 1 and result.token_ids == (0, 4)  # the target's argmax of p_2 is token 4
    assert result.overlaps == pytest.approx((0.40, 0.25), abs=1e-6)
