"""The eagle drafter on the real embedded target: the features it drafts from are the target's
own, alone and in a batch with chunked prefills; its greedy output equals plain decoding (chain,
tree, batched); its sampled drafts follow the q it sends; its head trains, saves and loads."""
import pytest
import torch

from actors.eagle import EagleProposer
from actors.eagle_head import load_eagle
from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.spec.engine import SpeculativeEngine
from deploy.spec.scheduler import BatchScheduler
from deploy.specialists.corpus import target_outputs
from deploy.specialists.eagle import train_eagle
from tests.conftest import CHAT_PROMPTS

pytestmark = pytest.mark.model
GREEDY = SamplingParams(max_tokens=32)


class RecordingEagle(EagleProposer):
    """An eagle drafter that keeps every session's tokens and features as they arrive."""

    def __init__(self, head) -> None:
        super().__init__(head)
        self.seen: dict[str, tuple[list[int], list[torch.Tensor]]] = {}

    def propose(self, session, context_delta, k, sampling, features=None):
        tokens, chunks = self.seen.setdefault(session, ([], []))
        tokens.extend(context_delta)
        chunks.extend([features] if isinstance(features, torch.Tensor) else features or ())
        return super().propose(session, context_delta, k, sampling, features)


@pytest.fixture(scope="module")
def trained(target):
    """A head trained (no held-out share) on the target's own answers to the test prompts."""
    examples = target_outputs(target, CHAT_PROMPTS, max_new_tokens=32)
    head, report = train_eagle(target, examples, epochs=30, heldout=0.0)
    return head.eval(), report


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return [engine.generate(messages=m, sampling=GREEDY) for m in CHAT_PROMPTS]


def test_training_lowers_the_heads_loss(trained):
    _, report = trained
    assert report.last_epoch_loss < 0.5 * report.first_epoch_loss
    assert report.head_size > 10 and report.train_s > 0


def test_the_eagle_drafter_reproduces_plain_greedy_decoding_and_its_drafts_are_accepted(target, trained, plain):
    engine = SpeculativeEngine(target, {"eagle": EagleProposer(trained[0])}, policy="fixed:eagle", cut_drafts=False)
    accepted = 0
    for index, messages in enumerate(CHAT_PROMPTS):
        result = engine.generate(messages=messages, sampling=GREEDY)
        assert result.token_ids == plain[index].token_ids, f"prompt {index}"
        accepted += result.summary["num_accepted_draft_tokens"]
    # the head learnt these answers: it can only draft them from features that line up with the tokens
    assert accepted > len(plain) * 10


def test_the_features_a_session_receives_are_the_targets_own_hidden_states_in_a_batch(target, trained):
    drafter = RecordingEagle(trained[0])
    engine = SpeculativeEngine(target, {"eagle": drafter, "ngram": build_drafters(["ngram"])["ngram"]},
                               policy="metasd-ucb")
    scheduler = BatchScheduler(engine, prefill_tokens=16)  # prompts are prefilled in chunks, beside decoding
    futures = [scheduler.submit(target.encode(messages=m), GREEDY) for m in CHAT_PROMPTS]
    results = [f.result(timeout=300) for f in futures]
    assert len(drafter.seen) == len(CHAT_PROMPTS)
    for tokens, chunks in drafter.seen.values():
        features = torch.cat(chunks).float()
        assert features.shape[0] == len(tokens) - 1  # one per committed token but the last
        with torch.inference_mode():
            expected = target.model.model(input_ids=torch.tensor([tokens[:-1]])).last_hidden_state[0]
        assert torch.allclose(features, expected, atol=0.05, rtol=0.01)
    assert all(r.finish_reason in ("stop", "length") for r in results)


@pytest.mark.parametrize("verify", ["tree", "counterfactual"])
def test_eagle_beside_lookup_drafters_reproduces_plain_greedy_decoding(target, trained, plain, verify):
    pool = build_drafters(["ngram", "suffix", NO_DRAFT]) | {"eagle": EagleProposer(trained[0])}
    engine = SpeculativeEngine(target, pool, policy="metasd-ucb-cost-warm", verify=verify)
    for index in (0, 2):
        assert engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY).token_ids == plain[index].token_ids


def test_sampled_drafts_follow_the_q_the_drafter_sends(target, trained):
    drafter = EagleProposer(trained[0], q_top_n=8)
    prompt = target.encode(messages=CHAT_PROMPTS[1])
    with torch.inference_mode():
        features = target.model.model(input_ids=torch.tensor([prompt[:-1]])).last_hidden_state[0]
    sampling = SamplingParams(temperature=0.7, top_k=8, seed=3)
    first = drafter.propose("r", prompt, 1, sampling, features)
    q = dict(zip(first.q[0].ids, first.q[0].probs))
    counts = dict.fromkeys(q, 0)
    draws = 4000
    for _ in range(draws):  # the same context each time: the head's distribution does not change
        (token,) = drafter.propose("r", [], 1, sampling).token_ids
        counts[token] += 1
    assert 0.5 * sum(abs(counts[t] / draws - p) for t, p in q.items()) < 0.03
    assert sum(q.values()) == pytest.approx(1.0, abs=1e-5) and len(q) <= 8


def test_a_head_saved_and_loaded_drafts_the_same_tokens(target, trained, tmp_path):
    head, report = trained
    head.save(tmp_path / "head", report.to_dict())
    loaded = load_eagle(tmp_path / "head")
    prompt = target.encode(messages=CHAT_PROMPTS[0])
    with torch.inference_mode():
        features = target.model.model(input_ids=torch.tensor([prompt[:-1]])).last_hidden_state[0]
    drafts = [EagleProposer(h).propose("r", prompt, 5, GREEDY, features).token_ids for h in (head, loaded)]
    assert drafts[0] == drafts[1] and len(drafts[0]) == 5


def test_a_session_without_its_features_drafts_nothing(target, trained):
    drafter = EagleProposer(trained[0])
    assert drafter.propose("r", target.encode(messages=CHAT_PROMPTS[0]), 5, GREEDY).token_ids == ()


def test_eagle_without_a_trained_head_is_refused_naming_drafters_and_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    with pytest.raises(InvalidRequestError) as err:
        build_drafters(["eagle"], target="smollm2-135m")
    assert err.value.field == "drafters" and "train-eagle" in str(err.value)
