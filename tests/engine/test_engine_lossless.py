"""On the real embedded model, greedy speculative output equals plain decoding token for token,
for every drafter and every policy; sampled output is reproducible from its seed."""
import pytest

from actors.hf import HFModelProposer
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from policy.registry import BASE_POLICY_NAMES
from tests.conftest import CHAT_PROMPTS

pytestmark = pytest.mark.model
MAX_TOKENS = 32
GREEDY = SamplingParams(max_tokens=MAX_TOKENS)
# prompt 0 again at the end: the suffix cache then holds its whole answer, so that path is exercised
SEQUENCE = [0, 1, 2, 0]
POLICY_SEQUENCE = [0, 2]  # each policy over the same drafters: two prompts (every drafter runs SEQUENCE)


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return [engine.generate(messages=m, sampling=GREEDY) for m in CHAT_PROMPTS]


def assert_matches_plain(engine, plain, sequence=SEQUENCE):
    for index in sequence:
        result = engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY)
        assert result.token_ids == plain[index].token_ids, f"prompt {index}"
        assert result.text == plain[index].text
    return result


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "hierarchy", "hf"])
def test_every_drafter_reproduces_plain_greedy_decoding(target, early_exit_drafter_model, plain, drafter):
    drafters = build_drafters([drafter], early_exit_drafter_model, target.vocab_size)
    # every drafted token verified, so each drafter's whole drafts go through verification
    last = assert_matches_plain(SpeculativeEngine(target, drafters, policy=f"fixed:{drafter}", cut_drafts=False), plain)
    assert last.summary["num_accepted_draft_tokens"] > 0  # the drafter really drafted and was verified


@pytest.mark.parametrize("policy", list(BASE_POLICY_NAMES) + ["metasd-ucb-cost-warm"])
def test_every_policy_reproduces_plain_greedy_decoding(target, early_exit_drafter_model, plain, policy):
    drafters = build_drafters(["ngram", "suffix", "hierarchy", "hf", NO_DRAFT], early_exit_drafter_model, target.vocab_size)
    assert_matches_plain(SpeculativeEngine(target, drafters, policy=policy), plain, POLICY_SEQUENCE)


def test_plain_decoding_stops_at_eos_or_max_tokens(plain):
    for result in plain:
        assert result.finish_reason in ("stop", "length")
        assert len(result.token_ids) <= MAX_TOKENS
        assert (result.finish_reason == "length") == (len(result.token_ids) == MAX_TOKENS)


def test_the_suffix_cache_drafts_a_repeated_answer_almost_entirely(target, plain):
    # drafts verified whole: how far they are cut depends on measured forward times, not on the cache
    engine = SpeculativeEngine(target, build_drafters(["suffix"]), policy="fixed:suffix", cut_drafts=False)
    engine.generate(messages=CHAT_PROMPTS[1], sampling=GREEDY)
    repeat = engine.generate(messages=CHAT_PROMPTS[1], sampling=GREEDY)
    assert repeat.token_ids == plain[1].token_ids
    assert repeat.summary["mean_acceptance_length"] > 3


def test_the_trace_records_every_round(target):
    engine = SpeculativeEngine(target, build_drafters(["ngram", NO_DRAFT]), policy="metasd-ucb-cost")
    result = engine.generate(messages=CHAT_PROMPTS[0], sampling=GREEDY)
    assert sum(r.emitted for r in result.rounds) == len(result.token_ids)
    assert all(0.0 <= r.reward <= 1.0 and r.accepted <= r.drafted for r in result.rounds)
    assert {r.drafter for r in result.rounds} <= {"ngram", NO_DRAFT}


def test_stop_strings_end_the_text_before_the_stop(target, plain):
    stop = plain[1].text[10:14]
    engine = SpeculativeEngine(target, build_drafters(["ngram"]), policy="fixed:ngram")
    result = engine.generate(messages=CHAT_PROMPTS[1], sampling=SamplingParams(max_tokens=MAX_TOKENS, stop=(stop,)))
    assert result.finish_reason == "stop"
    assert result.text == plain[1].text[: plain[1].text.find(stop)]
    assert result.token_ids == plain[1].token_ids[: len(result.token_ids)]


@pytest.mark.parametrize("drafter", ["ngram", "hf"])
def test_sampling_is_reproducible_from_the_seed(target, early_exit_drafter_model, drafter):
    sampling = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, top_k=50, seed=11)

    def run(params):
        drafters = build_drafters([drafter], early_exit_drafter_model, target.vocab_size)
        return SpeculativeEngine(target, drafters, policy=f"fixed:{drafter}").generate(
            messages=CHAT_PROMPTS[2], sampling=params).token_ids

    first = run(sampling)
    assert first == run(sampling)
    assert first != run(SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, top_k=50, seed=12))


def test_a_model_drafter_sends_the_sparse_q_it_sampled_from(target, early_exit_drafter_model):
    drafter = HFModelProposer(early_exit_drafter_model, target_vocab_size=target.vocab_size, q_top_n=16)
    prompt = target.encode(messages=CHAT_PROMPTS[2])
    proposal = drafter.propose("r", prompt, 4, SamplingParams(temperature=1.0, top_k=8, seed=1))
    assert len(proposal.token_ids) == 4 and len(proposal.q) == 4
    for token, dist in zip(proposal.token_ids, proposal.q):
        assert token in dist.ids and len(dist.ids) <= 8
        assert sum(dist.probs) == pytest.approx(1.0, abs=1e-5)


def test_a_model_drafter_crops_its_cache_to_the_accepted_prefix(target, early_exit_drafter_model):
    drafter = HFModelProposer(early_exit_drafter_model, target_vocab_size=target.vocab_size)
    prompt = target.encode(messages=CHAT_PROMPTS[0])
    first = drafter.propose("r", prompt, 4, GREEDY)
    state = drafter.sessions.extend("r", []).state
    assert state.cached == prompt + list(first.token_ids[:-1])
    # the target accepted one drafted token, then emitted a different one
    drafter.propose("r", [first.token_ids[0], 7], 4, GREEDY)
    assert state.cached[: len(prompt) + 2] == prompt + [first.token_ids[0], 7]
    assert state.cache.get_seq_length() == len(state.cached)


def test_greedy_drafts_are_cut_to_the_rules_length_and_stay_lossless_while_seeded_sampling_verifies_them_whole(target, plain):
    engine = SpeculativeEngine(target, build_drafters(["ngram"]), policy="fixed:ngram")
    engine.draft_lengths.best_length = lambda proposal: min(1, len(proposal.token_ids))
    greedy = engine.generate(messages=CHAT_PROMPTS[0], sampling=GREEDY)
    assert greedy.token_ids == plain[0].token_ids
    assert max(r.drafted for r in greedy.rounds) == 1
    seeded = engine.generate(messages=CHAT_PROMPTS[0], sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.5, seed=3))
    assert max(r.drafted for r in seeded.rounds) > 1


def test_an_engine_deciding_as_on_a_flat_cost_device_stays_lossless_and_scales_only_model_drafting(
        target, early_exit_drafter_model, plain, tmp_path):
    import json

    from actors.proposal import is_model_free
    from deploy.bench.cost_profile import CostProfile
    from deploy.bench.device_costs import DeviceCosts
    from deploy.engine.cost_model import max_positions

    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.004, "chain": {"1": 1.0, "40": 1.0}}))
    device = CostProfile.load(path)

    def engine(drafter: str) -> SpeculativeEngine:
        drafters = build_drafters([drafter], early_exit_drafter_model, target.vocab_size)
        costs = DeviceCosts(device, target, max_positions(7), [n for n, d in drafters.items() if is_model_free(d)])
        return SpeculativeEngine(target, drafters, policy=f"fixed:{drafter}", costs=costs)

    model = engine("hf")
    results = [model.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY) for index in POLICY_SEQUENCE]
    assert [r.token_ids for r in results] == [plain[index].token_ids for index in POLICY_SEQUENCE]
    # its costs are the device's: no padding, every forward size one plain step there
    costs = model.costs
    assert costs.padded_size == list(range(costs.max_positions + 1))
    assert costs.verify_s_by_size[1:] == [0.004] * costs.max_positions
    assert costs.draft_scale == pytest.approx(0.004 / target.forward_profile(costs.max_positions)[0])
    # on a flat-cost device a fresh drafter's whole draft is worth verifying
    assert model.draft_lengths.best_length(Proposal("fresh", token_ids=(1,) * 7)) == 7
    # a model drafter's drafting time counts as the same share of a plain step there as here ...
    # (this weak drafter is asked only until a plain step promises more: its first rounds)
    drafted = [r for result in results for r in result.rounds if r.drafting_sum_s > 0]
    assert drafted and all(r.drafter_s == pytest.approx(r.drafting_sum_s * costs.draft_scale) for r in drafted)
    # ... a model-free drafter's as measured (it runs on a CPU beside the device either way)
    lookup = assert_matches_plain(engine("ngram"), plain, [0])
    assert all(r.drafter_s == pytest.approx(r.drafting_sum_s) for r in lookup.rounds)
