"""Prompt lookup, the suffix cache and the hierarchy draft what their sources say, no more."""
import numpy as np
import pytest

from actors.errors import InvalidRequestError
from actors.hierarchy import HierarchyProposer
from actors.ngram import NgramProposer, longest_lookup, lookup_continuation
from actors.no_draft import NoDraftProposer
from actors.sampling import SamplingParams
from actors.suffix import BYTES_PER_NODE, SuffixProposer, SuffixTrie

GREEDY = SamplingParams()


def test_lookup_continues_after_the_latest_earlier_occurrence_with_a_full_continuation():
    context = np.array([1, 2, 3, 4, 5, 1, 2, 6, 7, 8, 9, 1, 2])
    assert lookup_continuation(context, n=2, k=3).tolist() == [6, 7, 8]


def test_lookup_falls_back_to_the_longest_continuation_when_none_is_full():
    context = np.array([1, 2, 3, 1, 2])
    assert lookup_continuation(context, n=2, k=5).tolist() == [3, 1, 2]


def test_lookup_without_an_earlier_occurrence_is_empty():
    assert lookup_continuation(np.array([1, 2, 3, 4]), n=2, k=3).size == 0


def brute_force_lookup(context: list[int], min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """The definition, position by position: the longest tail that occurred earlier; its latest
    occurrence with k tokens after it, else its earliest."""
    length = len(context)
    for n in range(max_n, min_n - 1, -1):
        starts = [s for s in range(length - n) if context[s : s + n] == context[length - n :]]
        if starts:
            full = [s for s in starts if s + n + k <= length]
            start = full[-1] if full else starts[0]
            return tuple(context[start + n : start + n + k])
    return ()


def test_one_pass_lookup_agrees_with_the_brute_force_definition_on_random_contexts():
    rng = np.random.default_rng(0)
    for _ in range(400):
        context = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 40))).tolist()
        min_n = int(rng.integers(1, 4))
        max_n, k = min_n + int(rng.integers(0, 4)), int(rng.integers(1, 8))
        assert longest_lookup(np.array(context), min_n, max_n, k) == brute_force_lookup(context, min_n, max_n, k)


def test_ngram_prefers_the_longest_matching_tail():
    drafter = NgramProposer(min_n=1, max_n=3)
    # tail [5, 6] occurs once followed by 7 (n=2); token 6 alone also occurs followed by 9 (n=1)
    proposal = drafter.propose("r", [6, 9, 9, 5, 6, 7, 8, 0, 5, 6], 2, GREEDY)
    assert proposal.token_ids == (7, 8) and proposal.q is None


def test_ngram_sees_only_the_deltas_it_is_sent_and_respects_k():
    drafter = NgramProposer(min_n=1, max_n=2)
    assert drafter.propose("r", [1, 2, 3], 4, GREEDY).token_ids == ()
    assert drafter.propose("r", [1, 2], 1, GREEDY).token_ids == (3,)
    drafter.release("r")
    assert len(drafter.sessions) == 0


def test_ngram_rejects_an_impossible_window():
    with pytest.raises(InvalidRequestError, match="min_n"):
        NgramProposer(min_n=3, max_n=2)


def test_suffix_cache_drafts_what_followed_in_a_finished_request():
    drafter = SuffixProposer(min_match=2)
    drafter.propose("a", [10, 11, 12, 13, 14, 15], 3, GREEDY)
    assert drafter.propose("b", [11, 12], 3, GREEDY).token_ids == ()  # nothing finished yet
    drafter.release("a", [16])
    assert drafter.propose("b", [], 3, GREEDY).token_ids == (13, 14, 15)
    assert drafter.propose("c", [99, 14, 15], 5, GREEDY).token_ids == (16,)


def test_suffix_cache_follows_the_most_frequent_continuation():
    trie = SuffixTrie(max_depth=8)
    for tail in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        trie.insert(tail)
    assert trie.continuation([7, 1, 2], k=1, min_match=2, max_match=4) == (3,)


def test_suffix_cache_evicts_the_oldest_sequence_beyond_its_bound():
    trie = SuffixTrie(max_depth=4, max_cached_tokens=8)
    trie.insert([1, 2, 3, 4, 5])
    trie.insert([6, 7, 8, 9, 10])
    assert trie.cached_tokens == 5 and len(trie) == 1
    assert trie.continuation([1, 2], k=2, min_match=2, max_match=3) == ()
    assert trie.continuation([6, 7], k=2, min_match=2, max_match=3) == (8, 9)
    assert set(trie.root.children) == {6, 7, 8, 9, 10}  # evicted paths are gone, not just zeroed


def test_hierarchy_uses_the_context_first_then_past_requests():
    hierarchy = HierarchyProposer([NgramProposer(min_n=2), SuffixProposer(min_match=2)])
    hierarchy.propose("old", [20, 21, 22, 23], 2, GREEDY)
    hierarchy.release("old")
    from_context = hierarchy.propose("new", [5, 6, 7, 5, 6], 2, GREEDY)
    assert from_context.token_ids == (7, 5) and from_context.drafter == "hierarchy"
    assert from_context.source == "ngram"  # the level that drafted: its draft-length statistics are its own
    from_past = hierarchy.propose("new", [20, 21], 2, GREEDY)
    assert (from_past.token_ids, from_past.source) == ((22, 23), "suffix")


def test_hierarchy_forwards_every_unseen_token_to_each_source_on_release():
    suffix = SuffixProposer(min_match=2)
    hierarchy = HierarchyProposer([NgramProposer(min_n=2), suffix])
    hierarchy.propose("r", [1, 2, 3, 1, 2], 2, GREEDY)  # ngram answers; suffix is not asked
    hierarchy.release("r", [3, 9])
    assert suffix.trie.cached_tokens == 7


def test_the_no_draft_arm_proposes_nothing():
    assert NoDraftProposer().propose("r", [1, 2, 3], 5, GREEDY).token_ids == ()


def test_sessions_idle_past_their_ttl_are_evicted_when_a_new_one_opens(monkeypatch):
    from actors import session as session_module
    from actors.session import SessionStore

    now = [1000.0]
    monkeypatch.setattr(session_module.time, "monotonic", lambda: now[0])
    store = SessionStore(ttl_s=60, max_sessions=10)
    store.extend("old", [1])
    now[0] += 61
    store.extend("new", [2])
    assert store.pop("old") is None and store.pop("new").tokens == [2]


def test_the_session_store_is_bounded_in_count():
    from actors.session import SessionStore

    store = SessionStore(ttl_s=1e9, max_sessions=2)
    for name in ("a", "b", "c"):
        store.extend(name, [1])
    assert len(store) == 2 and store.pop("a") is None


def test_prompt_lookup_reports_the_length_of_the_tail_it_matched():
    drafter = NgramProposer(min_n=1, max_n=4)
    assert drafter.propose("s", [1, 2, 3, 9, 2, 3], k=2, sampling=GREEDY).match_length == 2
    assert drafter.propose("t", [5, 6, 7, 8, 9, 7], k=2, sampling=GREEDY).match_length == 1
    assert drafter.propose("u", [5, 6, 7], k=2, sampling=GREEDY).match_length == 0


def test_one_tenants_history_never_drafts_for_another():
    drafter = SuffixProposer(min_match=2)
    tenant_a, tenant_b = SamplingParams(cache_salt="a"), SamplingParams(cache_salt="b")
    drafter.propose("a-1", [5, 6, 7, 8, 9], 3, tenant_a)
    drafter.release("a-1")
    assert drafter.propose("b-1", [5, 6], 3, tenant_b).token_ids == ()  # A's text is no guess for B
    assert drafter.propose("a-2", [5, 6], 3, tenant_a).token_ids == (7, 8, 9)


def test_the_suffix_cache_is_bounded_in_memory_and_counts_its_nodes_exactly():
    trie = SuffixTrie(max_depth=4, max_bytes=40 * BYTES_PER_NODE)
    trie.insert(list(range(10)), tenant="a")  # 10 suffixes, 34 distinct nodes
    assert trie.nodes == 34
    trie.insert(list(range(100, 110)), tenant="b")  # 68 nodes > 40: A's sequence goes
    assert trie.nodes == 34 and set(trie.roots) == {"b"} and len(trie) == 1
    trie.insert([100, 101, 102], tenant="b")  # shares its nodes with the cached sequence
    assert trie.nodes == 34 and trie.cached_tokens == 13
