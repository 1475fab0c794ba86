"""A model drafter that drafts ahead along its own path (actors/hf.py) offers the rest of that path
as its next draft when the committed context took the path's way, drafts afresh when it did not,
and changes no output: the engine that lets its model drafters draft ahead stays lossless."""
from __future__ import annotations

import json

import pytest

from actors.hf import HFModelProposer
from actors.hierarchy import HierarchyProposer
from actors.ngram import NgramProposer
from actors.pool import build_drafters
from deploy.cost_profile import CostProfile
from deploy.engine import SpeculativeEngine
from deploy.sampling import SamplingParams
from policy.coordinator import Coordinator
from tests.conftest import CHAT_PROMPTS, plain_text, tiny_llama

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPT = [5, 9, 2, 7, 3, 8, 1, 4]


def path_tokens(drafter: HFModelProposer, session: str) -> list[int]:
    return [step.token for step in drafter.sessions.get(session).state.path]


def fresh_draft(model, context: list[int], k: int) -> tuple[int, ...]:
    return HFModelProposer(model).propose("fresh", context, k, GREEDY).token_ids


def test_a_drafter_that_drafted_ahead_offers_the_rest_of_its_path_when_the_target_took_it():
    model = tiny_llama(vocab_size=50)
    drafter = HFModelProposer(model)
    drafter.set_draft_ahead(4)
    first = drafter.propose("r", PROMPT, 3, GREEDY)
    path = path_tokens(drafter, "r")
    assert path[:3] == list(first.token_ids) and len(path) == 7 and first.ready == 0
    accepted = path[:4]  # its 3 tokens accepted and the target's next token its own 4th
    assert drafter.ready("r", accepted) == 3
    second = drafter.propose("r", accepted, 3, GREEDY)
    assert second.ready == 3 and list(second.token_ids) == path[4:]
    assert second.token_ids == fresh_draft(model, PROMPT + accepted, 3)  # the same draft, drafted earlier


def test_a_context_that_left_the_path_gets_a_fresh_draft():
    model = tiny_llama(vocab_size=50)
    drafter = HFModelProposer(model)
    drafter.set_draft_ahead(4)
    first = drafter.propose("r", PROMPT, 3, GREEDY)
    other = (first.token_ids[1] + 1) % 50
    assert drafter.ready("r", [first.token_ids[0], other]) == 0
    second = drafter.propose("r", [first.token_ids[0], other], 3, GREEDY)
    assert second.ready == 0
    assert second.token_ids == fresh_draft(model, PROMPT + [first.token_ids[0], other], 3)


def test_without_drafting_ahead_a_drafter_keeps_only_its_draft():
    drafter = HFModelProposer(tiny_llama(vocab_size=50))
    first = drafter.propose("r", PROMPT, 3, GREEDY)
    assert path_tokens(drafter, "r") == list(first.token_ids) and first.ahead_s == 0.0
    assert drafter.ready("r", list(first.token_ids)) == 0  # nothing beyond the draft


def test_a_hierarchy_passes_its_model_sources_path_through():
    model = HFModelProposer(tiny_llama(vocab_size=50), name="m")
    hierarchy = HierarchyProposer([NgramProposer(name="lookup", min_n=3), model], name="h")
    hierarchy.set_draft_ahead(4)
    first = hierarchy.propose("r", PROMPT, 3, GREEDY)  # no repeated trigram: the model drafts
    assert first.source == "m" and model.draft_ahead == 4
    assert first.draft_s >= 0 and first.ahead_s > 0
    accepted = path_tokens(model, "r")[:4]
    assert hierarchy.ready("r", accepted) == 3


def test_a_model_drafter_not_chosen_is_offered_the_context_and_what_it_drafted_ahead_is_a_free_shadow():
    drafter = HFModelProposer(tiny_llama(vocab_size=50), name="small")
    drafter.set_draft_ahead(4)
    coordinator = Coordinator({"ngram": NgramProposer(), "small": drafter}, policy="metasd-ucb-cf", seed=0)
    first = coordinator.propose("r", PROMPT, None, 3, GREEDY)
    assert [p.drafter for p in first.proposals] == ["ngram"] and first.shadows == ()  # nothing drafted ahead yet
    path = path_tokens(drafter, "r")
    assert len(path) == 4 and first.ahead_s > 0  # offered the prompt, it drafted ahead from it
    second = coordinator.propose("r", path[:2], None, 3, GREEDY)  # the target took its way
    (shadow,) = second.shadows
    assert (shadow.drafter, list(shadow.token_ids), shadow.ready) == ("small", path[2:4], 2)


def test_an_engine_whose_model_drafter_drafts_ahead_stays_lossless_and_verifies_the_drafts_it_drafted_ahead(target, tmp_path):
    from actors.models import load_causal_lm

    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.004, "chain": {"1": 1.0, "40": 1.0}}))
    twin = load_causal_lm("smollm2-135m").model  # drafts what the target decodes: its drafts are taken whole

    def engine() -> tuple[SpeculativeEngine, HFModelProposer]:
        drafters = build_drafters(["hf"], twin, target.vocab_size)
        return SpeculativeEngine(target, drafters, policy="fixed:hf", device=CostProfile.load(path), draft_ahead=True), drafters["hf"]

    expected = plain_text(target, CHAT_PROMPTS[1], GREEDY.max_tokens)
    # as slow as the target, it can draft at most one token while the target verifies
    slow, drafter = engine()
    assert slow.generate(messages=CHAT_PROMPTS[1], sampling=GREEDY).text == expected
    assert drafter.draft_ahead <= 1
    # were it fast enough to draft a whole draft ahead (the target's next token, then k) ...
    fast, drafter = engine()
    fast._set_draft_ahead = lambda: drafter.set_draft_ahead(fast.k + 1)
    result = fast.generate(messages=CHAT_PROMPTS[1], sampling=GREEDY)
    assert result.text == expected
    drafted = [r for r in result.rounds if r.drafted]
    assert drafted[0].drafted_ahead == 0
    # ... from the second round on every verified draft would be one it drafted ahead
    assert len(drafted) >= 2 and all(r.drafted_ahead == r.drafted for r in drafted[1:])


def test_drafting_ahead_needs_a_device_profile(target):
    with pytest.raises(ValueError, match="draft_ahead needs device"):
        SpeculativeEngine(target, build_drafters(["ngram"]), policy="fixed:ngram", draft_ahead=True)


def test_a_drafter_actor_drafts_ahead_in_the_background_after_answering():
    from actors.remote import DrafterActor, DrafterSpec

    actor = DrafterActor(DrafterSpec("small", "hf", "smollm2-135m", num_layers=2, draft_ahead=4), target_vocab_size=None)
    first = actor.propose("r", PROMPT, 3, GREEDY)
    assert first.ahead_s == 0.0  # not drafted in the call
    actor._ahead.submit(lambda: None).result()  # the background drafting has run
    path = path_tokens(actor.proposer, "r")
    assert path[:3] == list(first.token_ids) and len(path) == 7
    second = actor.propose("r", path[:4], 3, GREEDY)
    assert second.ready == 3 and list(second.token_ids) == path[4:7]
