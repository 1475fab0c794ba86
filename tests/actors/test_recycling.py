"""The recycling drafter (Token Recycling): its table keeps each token's latest top-k successors per
tenant over a read-only prior, drafts a best-first tree from the last committed token, and never
lets one tenant's writes draft for another; its prior saves and loads with its manifest."""
import numpy as np
import pytest

from actors.proposal import BRANCH
from actors.recycling import RecyclingProposer, recycled_tree, tree_chains
from actors.recycling_table import EMPTY, Prior, RecyclingTable, empty_prior, load_prior, save_prior
from actors.sampling import SamplingParams

GREEDY = SamplingParams()


def prior_with(rows: dict[int, list[tuple[int, float]]], vocab: int = 20, k: int = 4) -> Prior:
    ids = np.full((vocab, k), EMPTY, dtype=np.int32)
    probs = np.zeros((vocab, k), dtype=np.float32)
    for token, candidates in rows.items():
        for rank, (child, p) in enumerate(candidates):
            ids[token, rank], probs[token, rank] = child, p
    return Prior(ids, probs, {"target": "test"})


def test_a_token_without_a_row_drafts_nothing_rather_than_token_zero():
    drafter = RecyclingProposer(RecyclingTable(empty_prior(20)))
    assert drafter.propose("r", [3, 4, 5], 5, GREEDY).token_ids == ()


def test_the_tree_grows_best_first_by_the_product_of_probabilities_along_each_path():
    table = RecyclingTable(prior_with({1: [(2, 0.6), (3, 0.3)], 2: [(4, 0.9), (5, 0.05)], 3: [(6, 0.99)], 4: [(7, 0.5)]}))
    tokens, parents, probs, ranks = recycled_tree(table, "", root=1, depth=3, nodes=5)
    # 2 (.6), 4 (.54), 3 (.3), 3>6 (.297), 4>7 (.27): the next best, 2>5 (.03), is left out
    assert tokens == [2, 4, 3, 6, 7]
    assert parents == [-1, 0, -1, 2, 1]
    assert ranks == [0, 0, 1, 0, 0]
    assert probs == pytest.approx([0.6, 0.9, 0.3, 0.99, 0.5])


def test_the_tree_stops_at_the_depth_asked_for():
    table = RecyclingTable(prior_with({t: [(t + 1, 0.9)] for t in range(19)}))
    tokens, parents, _, _ = recycled_tree(table, "", root=0, depth=3, nodes=10)
    assert tokens == [1, 2, 3] and parents == [-1, 0, 1]


def test_a_draft_tree_travels_as_its_best_chain_with_the_others_as_branches():
    table = RecyclingTable(prior_with({1: [(2, 0.6), (3, 0.3)], 2: [(4, 0.9)], 3: [(6, 0.99)]}))
    proposal = RecyclingProposer(table, tree_nodes=8).propose("r", [9, 1], 4, GREEDY)
    assert proposal.token_ids == (2, 4) and proposal.ranks == (0, 0)
    assert proposal.confidence == pytest.approx((0.6, 0.9))
    assert [b.token_ids for b in proposal.branches] == [(3, 6)]
    assert [c.source for c in proposal.chains()] == ["", BRANCH]
    assert tree_chains([-1, 0, -1, 2]) == [[0, 1], [2, 3]]


def test_recycled_predictions_replace_a_tokens_row_for_that_tenant_only():
    table = RecyclingTable(prior_with({1: [(2, 0.6)]}))
    drafter = RecyclingProposer(table)
    drafter.recycle("alice", np.array([1]), np.array([[7, 8]]), np.array([[0.8, 0.1]], dtype=np.float16))
    alice = drafter.propose("a", [1], 1, SamplingParams(cache_salt="alice"))
    bob = drafter.propose("b", [1], 1, SamplingParams(cache_salt="bob"))
    nobody = drafter.propose("c", [1], 1, GREEDY)
    assert alice.token_ids == (7,)
    assert bob.token_ids == (2,) and nobody.token_ids == (2,)  # the shared prior, never alice's write
    assert table.prior.ids[1, 0] == 2  # the prior itself is read-only and unchanged
    with pytest.raises(ValueError):
        table.prior.ids[1, 0] = 7


def test_a_pair_of_tokens_row_is_drafted_from_before_the_single_tokens_row():
    table = RecyclingTable(empty_prior(50))
    table.write("", np.array([5, 5]), np.array([[6], [7]]), np.array([[0.9], [0.9]]), previous=np.array([1, 2]))
    drafter = RecyclingProposer(table)
    assert drafter.propose("a", [1, 5], 1, GREEDY).token_ids == (6,)  # "1 5" was followed by 6
    assert drafter.propose("b", [2, 5], 1, GREEDY).token_ids == (7,)
    assert drafter.propose("c", [3, 5], 1, GREEDY).token_ids == (7,)  # an unseen pair: the token's latest row
    table.write("", np.array([6]), np.array([[8]]), np.array([[0.9]]), previous=np.array([5]))
    table.write("", np.array([6]), np.array([[9]]), np.array([[0.9]]), previous=np.array([4]))
    assert drafter.propose("d", [1, 5], 2, GREEDY).token_ids == (6, 8)  # deeper nodes read their parent's pair


def test_the_latest_write_of_a_token_wins_and_the_overlay_is_bounded():
    table = RecyclingTable(empty_prior(50), max_rows=3, max_tenants=2)
    table.write("t", np.array([1, 1]), np.array([[5], [6]]), np.array([[0.5], [0.7]]))
    assert table.row("t", 1)[0].tolist() == [6]
    table.write("t", np.array([2, 3, 4]), np.array([[9], [9], [9]]), np.array([[0.5], [0.5], [0.5]]))
    assert table.overlay_rows("t") == 3 and table.row("t", 1) is None  # the least recently written went first
    table.write("u", np.array([1]), np.array([[5]]), np.array([[0.5]]))
    table.write("v", np.array([1]), np.array([[5]]), np.array([[0.5]]))
    assert table.overlay_rows("t") == 0  # at most two tenants: the least recently active went


def test_a_prior_saves_and_loads_with_its_manifest(tmp_path):
    prior = prior_with({1: [(2, 0.625), (3, 0.25)]})
    save_prior(Prior(prior.ids, prior.probs, {"target": "test", "k": 4}), tmp_path)
    loaded = load_prior(tmp_path)
    assert loaded.manifest == {"target": "test", "k": 4}
    assert np.array_equal(loaded.ids, prior.ids)
    assert np.allclose(loaded.probs, prior.probs, atol=1e-3)


def test_the_default_pool_drafts_recycled_trees_on_a_gpu_and_not_on_cpu():
    from actors.pool import DEFAULT_DRAFTERS, default_drafters

    assert "recycling" in default_drafters("cuda") and "recycling" in default_drafters("cuda:1")
    assert default_drafters("cpu") == DEFAULT_DRAFTERS and "recycling" not in DEFAULT_DRAFTERS
