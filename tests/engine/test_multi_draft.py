"""Several drafts a round are lossless: merged into a token tree, scored by one target forward
with a tree attention mask that gives each branch the logits a chain would get, and verified by
recursive rejection, whose output follows p (a broken residual update fails the same check).
On the real model, multi-draft policies reproduce plain greedy decoding."""
import numpy as np
import pytest
import torch

import deploy.engine.tree_verify as tree_verify_module
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import SparseDist
from actors.sampling import SamplingParams
from deploy.engine.draft_tree import ROOT, DraftTree, attention_allowed
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.tree_verify import per_draft_outcome, recursive_rejection, verify_tree
from tests.conftest import CHAT_PROMPTS

SAMPLES = 120_000
P = torch.tensor([0.35, 0.25, 0.20, 0.15, 0.05])
Q = torch.tensor([[0.05, 0.05, 0.10, 0.40, 0.40],   # three drafters, each far from p in its own way
                  [0.60, 0.10, 0.10, 0.10, 0.10],
                  [0.10, 0.10, 0.60, 0.10, 0.10]])


def total_variation(a: np.ndarray, b: torch.Tensor) -> float:
    return 0.5 * float(np.abs(a - b.numpy()).sum())


def first_token_distribution(samples: int = SAMPLES) -> np.ndarray:
    """Each round: three candidates, candidate i sampled from Q[i] (so equal tokens happen)."""
    gen = torch.Generator().manual_seed(99)
    candidates = torch.stack([torch.multinomial(Q[i], samples, replacement=True, generator=gen) for i in range(3)], 1)
    counts = np.zeros(5)
    for tokens in candidates.tolist():
        _, token = recursive_rejection(P, [(t, Q[i]) for i, t in enumerate(tokens)], gen)
        counts[token] += 1
    return counts / counts.sum()


def test_recursive_rejection_over_three_drafters_emits_tokens_distributed_as_the_target():
    assert total_variation(first_token_distribution(), P) < 0.01


def test_skipping_the_residual_update_after_a_rejection_fails_the_same_check(monkeypatch):
    monkeypatch.setattr(tree_verify_module, "residual_distribution", lambda residual, q: residual)
    assert total_variation(first_token_distribution(), P) > 0.05


def test_point_mass_candidates_are_accepted_with_the_targets_probabilities():
    gen = torch.Generator().manual_seed(5)
    one_hot = torch.eye(5)
    counts = np.zeros(5)
    for _ in range(40_000):  # two model-free drafts proposing tokens 0 and 3
        _, token = recursive_rejection(P, [(0, one_hot[0]), (3, one_hot[3])], gen)
        counts[token] += 1
    assert total_variation(counts / counts.sum(), P) < 0.015


def test_drafts_merge_into_a_tree_of_distinct_prefixes():
    tree = DraftTree.build([(5, 6, 7), (5, 6, 8), (5, 6, 7), (9,)])
    assert tree.tokens == (5, 6, 7, 8, 9)
    assert tree.parents == (ROOT, 0, 1, 1, ROOT)
    assert tree.depths == (1, 2, 3, 3, 1)
    assert tree.paths == ((0, 1, 2), (0, 1, 3), (0, 1, 2), (4,))
    assert [(d, child) for d, _, child in tree.candidates(ROOT)] == [(0, 0), (1, 0), (2, 0), (3, 4)]
    assert [(d, child) for d, _, child in tree.candidates(1)] == [(0, 2), (1, 3), (2, 2)]
    assert tree.candidates(2) == [] and tree.path_rows(1) == [0, 1, 2, 4]


def test_each_tree_position_attends_to_the_prefix_its_ancestors_and_itself():
    allowed = attention_allowed([-1, 0, 1, 1, 0], prefix_length=2)  # root, a, a>b, a>c, d
    assert allowed.tolist() == [
        [True, True, True, False, False, False, False],
        [True, True, True, True, False, False, False],
        [True, True, True, True, True, False, False],
        [True, True, True, True, False, True, False],
        [True, True, True, False, False, False, True],
    ]


def test_a_tree_forward_gives_every_branch_the_logits_of_its_own_chain(target):
    prefix = target.encode(messages=CHAT_PROMPTS[1])
    drafts = [(504, 2118, 29), (504, 982), (1116,)]
    tree = DraftTree.build(drafts)
    cache = target.new_cache()
    target.forward(cache, prefix[:-1], logits_for=0)
    parents = [-1] + [0 if p == ROOT else 1 + p for p in tree.parents]
    tree_logits = target.forward(cache, [prefix[-1], *tree.tokens], parents=parents)  # [1 + n, V]
    for d, draft in enumerate(drafts):
        chain = target.new_cache()
        target.forward(chain, prefix[:-1], logits_for=0)
        chain_logits = target.forward(chain, [prefix[-1], *draft])
        assert torch.allclose(tree_logits[tree.path_rows(d)], chain_logits, atol=1e-4), f"draft {d}"
    # keep the second draft's branch: the cache then continues exactly like its chain
    target.keep(cache, len(prefix), [len(prefix) + node for node in tree.paths[1]])
    assert cache.get_seq_length() == len(prefix) + 2
    chain = target.new_cache()
    target.forward(chain, prefix + list(drafts[1]), logits_for=0)
    assert torch.allclose(target.forward(cache, [77]), target.forward(chain, [77]), atol=1e-4)


def test_tree_sampling_continues_along_the_accepted_branch_with_the_targets_conditional():
    p_root = torch.log(torch.tensor([0.5, 0.3, 0.2, 1e-9]))
    p_after = {0: torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])), 1: torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1]))}
    q = [SparseDist((0, 1), (0.5, 0.5)), SparseDist((0, 3), (0.5, 0.5))]  # per draft, its 2nd position's q
    gen = torch.Generator().manual_seed(3)
    sampling = SamplingParams(temperature=1.0)
    after = {0: np.zeros(4), 1: np.zeros(4)}
    for _ in range(20_000):
        drafts = [(0, int(torch.multinomial(torch.tensor([0.5, 0.5]), 1, generator=gen))),
                  (1, (0, 3)[int(torch.multinomial(torch.tensor([0.5, 0.5]), 1, generator=gen))])]
        tree = DraftTree.build(drafts)
        logits = torch.stack([p_root] + [p_after[tree.tokens[n]] if tree.depths[n] == 1 else p_root
                                         for n in range(tree.size)])
        qs = [(SparseDist((0,), (1.0,)), q[0]), (SparseDist((1,), (1.0,)), q[1])]
        result = verify_tree(tree, qs, drafts, logits, sampling, gen)
        if len(result.token_ids) >= 2:
            after[result.token_ids[0]][result.token_ids[1]] += 1
    for first, counts in after.items():
        assert total_variation(counts / counts.sum(), torch.softmax(p_after[first], -1)) < 0.03, first


def test_each_draft_is_credited_with_its_own_tokens_on_the_accepted_branch():
    tree = DraftTree.build([(5, 6, 7), (5, 8)])
    logits = torch.full((1 + tree.size, 10), -5.0)
    for row, wanted in ((0, 5), (1, 6), (2, 9), (3, 1)):  # the target's argmax path: 5, 6, 9
        logits[row, wanted] = 5.0
    result = verify_tree(tree, [None, None], [(5, 6, 7), (5, 8)], logits, SamplingParams(), torch.Generator())
    assert result.token_ids == (5, 6, 9) and result.nodes == (0, 1)
    assert per_draft_outcome(tree, 0, (5, 6, 7), None, None, result) == (2, ())
    assert per_draft_outcome(tree, 1, (5, 8), None, None, result) == (1, ())


MAX_TOKENS = 40
GREEDY = SamplingParams(max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return [engine.generate(messages=m, sampling=GREEDY) for m in CHAT_PROMPTS]


@pytest.mark.model
@pytest.mark.parametrize("verify", ["counterfactual", "tree"])
def test_every_verification_mode_reproduces_plain_greedy_decoding_with_a_model_drafter_in_the_pool(
        target, early_exit_drafter_model, plain, verify):
    drafters = build_drafters(["ngram", "suffix", "hf", NO_DRAFT], early_exit_drafter_model, target.vocab_size)
    engine = SpeculativeEngine(target, drafters, policy="metasd-ucb-cost", verify=verify)
    for index in (0, 2):  # two prompts
        result = engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY)
        assert result.token_ids == plain[index].token_ids, f"prompt {index}"
        assert sum(r.drafted for r in result.rounds) > 0


@pytest.mark.model
def test_node_cut_trees_on_a_flat_cost_device_reproduce_plain_greedy_decoding(target, plain, tmp_path):
    import json

    from deploy.bench.cost_profile import CostProfile
    from deploy.bench.device_costs import DeviceCosts
    from deploy.engine.cost_model import max_positions

    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.004, "chain": {"1": 1.0, "40": 1.05}}))
    pool = build_drafters(["ngram", "suffix", "hierarchy", NO_DRAFT])
    costs = DeviceCosts(CostProfile.load(path), target, max_positions(7), model_free=list(pool))
    engine = SpeculativeEngine(target, pool, policy="metasd-ucb-cost-warm", verify="tree", costs=costs)
    multi_rounds = 0
    for index in (0, 2, 0):  # prompt 0 again: the suffix cache then drafts its whole answer
        result = engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY)
        assert result.token_ids == plain[index].token_ids, f"prompt {index}"
        multi_rounds += sum("+" in r.drafter for r in result.rounds)
    assert multi_rounds > 0  # rounds really verified several drafts at once


@pytest.mark.model
@pytest.mark.parametrize("verify", ["tree", "ensemble"])
def test_sampling_with_several_drafts_a_round_is_reproducible_from_the_seed(target, early_exit_drafter_model, verify):
    def run(seed):
        drafters = build_drafters(["ngram", "hf"], early_exit_drafter_model, target.vocab_size)
        return SpeculativeEngine(target, drafters, policy="metasd-ucb", verify=verify).generate(
            messages=CHAT_PROMPTS[2], sampling=SamplingParams(max_tokens=24, temperature=0.8, seed=seed)).token_ids

    assert run(11) == run(11) != run(12)
