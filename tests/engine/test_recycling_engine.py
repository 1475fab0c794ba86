"""Token Recycling in the engine: every verification's logits give each verified position's top-k
(the accepted path written last), which reach the recycling drafter's table through the
coordinator under the request's tenant; drafts from it are calibrated per (depth, rank); greedy
output equals plain decoding on the real model, alone and under continuous batching; sampled
trees drafted from the table emit the target's distribution (a broken residual fails)."""
import numpy as np
import pytest
import torch

import deploy.engine.tree_verify as tree_verify_module
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import Proposal
from actors.recycling import RecyclingProposer
from actors.recycling_table import EMPTY, Prior, RecyclingTable, empty_prior
from actors.sampling import SamplingParams
from deploy.engine.draft_length import DraftLengths
from deploy.engine.draft_tree import DraftTree
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.predictions import top_predictions
from deploy.engine.scheduler import BatchScheduler
from deploy.engine.tree_verify import verify_tree
from policy.coordinator import Coordinator
from tests.conftest import CHAT_PROMPTS

SAMPLES = 30_000  # verify_tree calls (the recursive rejection itself is checked on 120,000 draws in test_multi_draft.py)


def test_every_verified_row_gives_its_top_k_with_the_accepted_path_last_and_padding_left_out():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0001],   # root (input 10)
                                     [0.05, 0.1, 0.15, 0.7],    # node 0 (input 11), rejected
                                     [0.25, 0.5, 0.15, 0.1],    # node 1 (input 12), accepted
                                     [0.25, 0.25, 0.25, 0.25]]))  # padding
    tokens, ids, probs, previous = top_predictions([10, 11, 12, 12], logits, verified=3, accepted_rows=(0, 2), k=2,
                                                   parents=[-1, 0, 0, -1], before=9)
    assert tokens.tolist() == [11, 10, 12]
    assert previous.tolist() == [10, 9, 10]  # each row's parent's input; the root's, the committed token before it
    assert ids.tolist() == [[3, 2], [0, 1], [1, 0]]
    assert probs.astype(float) == pytest.approx(np.array([[0.7, 0.15], [0.7, 0.2], [0.5, 0.25]]), abs=2e-3)


def test_the_coordinator_writes_a_requests_predictions_under_its_tenant_before_drafting():
    drafter = RecyclingProposer(RecyclingTable(empty_prior(50)))
    coordinator = Coordinator({"recycling": drafter, NO_DRAFT: build_drafters([NO_DRAFT])[NO_DRAFT]}, "fixed:recycling")
    assert coordinator.wants_predictions and coordinator.stats()["predictions"]
    tenant = SamplingParams(cache_salt="acme")
    predictions = (np.array([5], dtype=np.int32), np.array([[6, 7]], dtype=np.int32), np.array([[0.9, 0.05]], dtype=np.float16))
    round_ = coordinator.propose("r1", [1, 2, 5], None, 3, tenant, predictions=predictions)
    assert round_.predictions_wanted and round_.proposals[0].token_ids[0] == 6
    other = coordinator.propose("r2", [1, 2, 5], None, 3, SamplingParams(cache_salt="other"))
    assert other.proposals[0].token_ids == ()


def test_a_recycled_drafts_acceptance_is_calibrated_per_depth_and_rank():
    lengths = DraftLengths(lambda n: 0.04, lambda n: n, 8)
    first_rank = Proposal("recycling", (5, 6), confidence=(0.5, 0.5), ranks=(0, 0))
    second_rank = Proposal("recycling", (7, 6), confidence=(0.5, 0.5), ranks=(1, 0))
    for _ in range(50):
        lengths.observe(first_rank, 2)  # rank 0 at depth 1 always right
        lengths.observe(second_rank, 0)  # rank 1 at depth 1 always wrong
    assert lengths.acceptance(first_rank, 1)[0] > 0.9
    assert lengths.acceptance(second_rank, 1)[0] < 0.1
    unranked = Proposal("recycling", (5,), confidence=(0.5,))
    assert lengths.acceptance(unranked, 1)[0] == pytest.approx(0.5)  # its own cell: untouched


def recycled_tree_sample(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """A two-level tree drafted by the recycling drafter from a hand-built table (vocabulary 4),
    verified by recursive rejection `samples` times against hand-built p. -> the empirical and
    the target's joint distribution of the first two tokens."""
    ids = np.full((4, 2), EMPTY, dtype=np.int32)
    probs = np.zeros((4, 2), dtype=np.float32)
    ids[3], probs[3] = [0, 1], [0.6, 0.3]   # after the root token 3: candidates 0, 1
    ids[0], probs[0] = [2, 1], [0.5, 0.4]   # after 0: 2, 1
    ids[1], probs[1] = [0, 3], [0.7, 0.2]   # after 1: 0, 3
    drafter = RecyclingProposer(RecyclingTable(Prior(ids, probs, {})), tree_nodes=6)
    sampling = SamplingParams(temperature=1.0)
    proposal = drafter.propose("s", [3], 2, sampling)
    chains = [c.token_ids for c in proposal.chains()]
    tree = DraftTree.build(chains)
    p_root = torch.tensor([0.2, 0.3, 0.1, 0.4])
    p_after = {0: torch.tensor([0.1, 0.2, 0.3, 0.4]), 1: torch.tensor([0.5, 0.1, 0.1, 0.3])}
    rows = [p_root] + [p_after.get(token, torch.full((4,), 0.25)) if depth == 1 else torch.full((4,), 0.25)
                       for token, depth in zip(tree.tokens, tree.depths)]
    logits = torch.log(torch.stack(rows))
    p = torch.stack(rows)  # temperature 1: the warped p is p itself
    generator = torch.Generator().manual_seed(11)
    counts = np.zeros((4, 4))
    for _ in range(samples):
        emitted = verify_tree(tree, [None] * len(chains), chains, logits, sampling, generator, p=p).token_ids
        if len(emitted) >= 2:
            counts[emitted[0], emitted[1]] += 1
        else:  # the first token was recovered: its successor is the target's next draw, p_after (or uniform)
            follow = p_after.get(emitted[0], torch.full((4,), 0.25))
            counts[emitted[0], int(torch.multinomial(follow, 1, generator=generator))] += 1
    expected = np.stack([p_root[a].item() * p_after.get(a, torch.full((4,), 0.25)).numpy() for a in range(4)])
    return counts / counts.sum(), expected


def test_sampled_recycled_trees_emit_the_targets_joint_distribution():
    empirical, expected = recycled_tree_sample(SAMPLES)
    assert 0.5 * np.abs(empirical - expected).sum() < 0.02


def test_skipping_the_residual_after_a_rejected_recycled_token_fails_the_same_check(monkeypatch):
    monkeypatch.setattr(tree_verify_module, "residual_distribution", lambda residual, q: residual)
    empirical, expected = recycled_tree_sample(SAMPLES // 3)
    assert 0.5 * np.abs(empirical - expected).sum() > 0.05


@pytest.mark.model
def test_recycling_reproduces_plain_greedy_decoding_alone_in_a_tree_and_in_a_batch(target):
    greedy = SamplingParams(max_tokens=24)
    plain_engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    plain = [plain_engine.generate(messages=m, sampling=greedy).token_ids for m in CHAT_PROMPTS[:2]]
    alone = SpeculativeEngine(target, build_drafters(["recycling"], None, target.vocab_size, target.name),
                              policy="fixed:recycling", cut_drafts=False)
    pool = build_drafters(["ngram", "suffix", "recycling", NO_DRAFT], None, target.vocab_size, target.name)
    tree = SpeculativeEngine(target, pool, verify="tree")
    for engine in (alone, tree):
        results = [engine.generate(messages=m, sampling=greedy) for m in CHAT_PROMPTS[:2]]
        assert [r.token_ids for r in results] == plain
        assert sum(r.summary["num_accepted_draft_tokens"] for r in results) > 0
    assert any("recycling" in r.drafter for r in results[-1].rounds)  # its tree joined the round's tree
    assert alone.coordinator.drafters["recycling"].table.overlay_rows("") > 0  # the target's predictions were recycled
    scheduler = BatchScheduler(SpeculativeEngine(target, build_drafters(["ngram", "recycling", NO_DRAFT], None,
                                                                        target.vocab_size, target.name), verify="tree"))
    futures = [scheduler.submit(target.encode(messages=m), greedy) for m in CHAT_PROMPTS[:2]]
    assert [f.result(timeout=300).token_ids for f in futures] == plain
