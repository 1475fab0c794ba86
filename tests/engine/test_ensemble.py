"""The `ensemble` verification mode (deploy/engine/ensemble.py): a round's drafts combined into
one chain by their learned acceptances. Drafts that agree outvote a stronger draft alone; the
chain follows only the drafts that agree with it; under sampling each token is drawn from the
mixture the chain reports as its q, so verification emits the target's distribution; on the
real model the mode reproduces plain greedy decoding."""
import numpy as np
import pytest
import torch

from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import Proposal, SparseDist
from actors.sampling import SamplingParams
from deploy.engine.cost_model import max_positions
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.ensemble import ensemble_draft
from deploy.engine.verify import verify
from policy.registry import ENSEMBLE
from tests.conftest import CHAT_PROMPTS
from tests.engine.test_counterfactual import FixedCosts

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0)
P = torch.tensor([0.35, 0.25, 0.20, 0.15, 0.05])  # the target's next-token distribution
MODEL_Q = SparseDist((0, 1, 2, 3, 4), (0.05, 0.05, 0.10, 0.40, 0.40))  # a model draft far from p
DRAFTS = [Proposal("model", (3,), q=(MODEL_Q,)), Proposal("ngram", (0,)), Proposal("suffix", (2,))]
WEIGHTS = {"model": 0.6, "ngram": 0.3, "suffix": 0.2}


def acceptance_by_drafter(weights: dict[str, float]):
    return lambda proposal, n: [weights[proposal.drafter]] * n


def test_two_drafts_that_agree_outvote_a_stronger_draft_alone():
    drafts = [Proposal("strong", (6,)), Proposal("a", (5,)), Proposal("b", (5,))]
    chain = ensemble_draft(drafts, acceptance_by_drafter({"strong": 0.7, "a": 0.5, "b": 0.5}), GREEDY,
                           torch.Generator(), k=4)
    assert chain.token_ids == (5,) and chain.drafter == ENSEMBLE
    assert chain.confidence == pytest.approx((0.75,))  # 1 - (1 - 0.5)^2


def test_the_chain_follows_the_drafts_that_agree_with_it_and_ends_where_none_continues():
    drafts = [Proposal("long", (5, 6, 7, 8)), Proposal("short", (5, 9)), Proposal("other", (4,))]
    weights = {"long": 0.9, "short": 0.3, "other": 0.5}
    chain = ensemble_draft(drafts, acceptance_by_drafter(weights), GREEDY, torch.Generator(), k=3)
    assert chain.token_ids == (5, 6, 7)  # `short` stops voting after 5; k caps the chain
    assert chain.confidence == pytest.approx((1 - 0.1 * 0.7, 0.9, 0.9)) and chain.q is None
    assert ensemble_draft([Proposal("none")], acceptance_by_drafter({"none": 0.5}), GREEDY,
                          torch.Generator(), k=3).token_ids == ()


def test_a_sampled_chain_draws_each_token_from_the_mixture_it_reports_as_q():
    gen = torch.Generator().manual_seed(7)
    counts, reported = np.zeros(5), None
    for _ in range(20_000):
        chain = ensemble_draft(DRAFTS, acceptance_by_drafter(WEIGHTS), SAMPLED, gen, k=1)
        counts[chain.token_ids[0]] += 1
        reported = chain.q[0]
    mixture = np.zeros(5)
    for token, prob in zip(reported.ids, reported.probs):
        mixture[token] = prob
    expected = (0.6 * np.array(MODEL_Q.probs) + 0.3 * np.eye(5)[0] + 0.2 * np.eye(5)[2]) / 1.1
    assert mixture == pytest.approx(expected)
    assert 0.5 * np.abs(counts / counts.sum() - mixture).sum() < 0.015


def first_emitted_distribution(report_mixture: bool, samples: int = 6_000) -> np.ndarray:
    """Each round: an ensemble chain of one token, verified against P by rejection sampling with
    the chain's q (or, broken, with the model drafter's own q)."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.log(P).expand(2, -1)
    counts = np.zeros(5)
    for _ in range(samples):
        chain = ensemble_draft(DRAFTS, acceptance_by_drafter(WEIGHTS), SAMPLED, gen, k=1)
        q = chain.q if report_mixture else (MODEL_Q,)
        counts[verify(chain.token_ids, q, logits, SAMPLED, gen, with_overlaps=False).token_ids[0]] += 1
    return counts / counts.sum()


def test_verifying_a_sampled_chain_against_its_q_emits_the_targets_distribution():
    assert 0.5 * np.abs(first_emitted_distribution(report_mixture=True) - P.numpy()).sum() < 0.03


def test_verifying_it_against_one_drafters_q_instead_fails_the_same_check():
    assert 0.5 * np.abs(first_emitted_distribution(report_mixture=False) - P.numpy()).sum() > 0.1


@pytest.mark.model
def test_the_ensemble_mode_reproduces_plain_greedy_decoding(target):
    sampling = SamplingParams(max_tokens=48)
    plain = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}",
                              costs=FixedCosts(max_positions(7))).generate(messages=CHAT_PROMPTS[0], sampling=sampling)
    engine = SpeculativeEngine(target, build_drafters(["ngram", "suffix", "hierarchy", NO_DRAFT]),
                               policy="metasd-ucb-cost-warm", verify="ensemble", costs=FixedCosts(max_positions(7)))
    for attempt in range(2):  # the second time the suffix cache drafts the whole answer
        result = engine.generate(messages=CHAT_PROMPTS[0], sampling=sampling)
        assert result.token_ids == plain.token_ids, f"attempt {attempt}"
        assert sum(r.drafted for r in result.rounds if r.drafter == ENSEMBLE) > 0
