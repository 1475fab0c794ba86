"""A drafter of another vocabulary (actors/cross_vocab.py) drafts text that crosses into the
target's tokens: its drafts end on a safe token boundary, a strong drafter of another vocabulary
gets most of its drafts accepted, greedy output equals plain decoding, sampled output keeps the
target's distribution, and a model of another family given as the draft model drafts this way."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from actors.cross_vocab import CrossVocabularyProposer, target_draft
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.verify import dense_q, speculative_accept
from tests.conftest import CHAT_PROMPTS, tiny_llama

GREEDY = SamplingParams(max_tokens=40)


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return [engine.generate(messages=m, sampling=GREEDY) for m in CHAT_PROMPTS[:2]]


@pytest.fixture(scope="module")
def small_tokenizer(target):
    """A byte-level BPE of 600 tokens trained on a little text: another vocabulary than the target's."""
    from deploy.specialists.other_vocab import train_tokenizer

    texts = [target.tokenizer.decode(target.encode(messages=m), skip_special_tokens=False) for m in CHAT_PROMPTS] * 20
    texts += ["The weather is nice today. def squares(numbers): return [n * n for n in numbers]"] * 20
    return train_tokenizer(texts, 600, list(target.tokenizer.all_special_tokens), target.tokenizer.eos_token)


@pytest.fixture(scope="module")
def permuted(target):
    """The target itself as a drafter of another vocabulary: every token id permuted, in its
    tokenizer and in its embedding rows alike. It drafts what the target would, through other ids."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    vocab = target.vocab_size
    permutation = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))  # old id -> new id
    spec = json.loads(target.tokenizer.backend_tokenizer.to_str())
    spec["model"]["vocab"] = {piece: int(permutation[i]) for piece, i in spec["model"]["vocab"].items()}
    for added in spec["added_tokens"]:
        added["id"] = int(permutation[added["id"]])
    spec["post_processor"] = None
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token=target.tokenizer.eos_token)
    model = AutoModelForCausalLM.from_config(target.model.config).eval()
    model.load_state_dict(target.model.state_dict())
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        permuted_rows = torch.empty_like(weight)
        permuted_rows[permutation] = weight
        weight.copy_(permuted_rows)
    return model, tokenizer


def test_a_draft_is_cut_to_its_last_safe_token_boundary(target):
    whole = target_draft(" the world is", target.tokenizer, ended=False, k=8)
    assert target.tokenizer.decode(whole) == " the world"  # " is" could still grow into " island"
    assert target.tokenizer.decode(target_draft(" the world is", target.tokenizer, ended=True, k=8)) == " the world is"
    assert target_draft(" caf\ufffd", target.tokenizer, ended=True, k=8) == tuple(target.tokenizer.encode(" caf"))
    assert len(target_draft(" one two three four five", target.tokenizer, ended=False, k=2)) == 2


def test_the_target_behind_other_token_ids_drafts_what_the_target_decodes(target, permuted, plain):
    model, tokenizer = permuted
    drafter = CrossVocabularyProposer(model, tokenizer, target.tokenizer, name="permuted")
    assert tokenizer.encode("hello world") != target.tokenizer.encode("hello world")  # another vocabulary indeed
    engine = SpeculativeEngine(target, {"permuted": drafter}, policy="fixed:permuted", cut_drafts=False)
    result = engine.generate(messages=CHAT_PROMPTS[0], sampling=GREEDY)
    assert result.token_ids == plain[0].token_ids
    rounds = [r for r in result.rounds if r.drafted]
    assert sum(r.accepted for r in rounds) / sum(r.drafted for r in rounds) > 0.8  # it drafts the target's own tokens


def test_a_small_drafter_of_another_vocabulary_reproduces_plain_greedy_decoding(target, small_tokenizer, plain):
    drafter = CrossVocabularyProposer(tiny_llama(len(small_tokenizer)), small_tokenizer, target.tokenizer, name="othervocab")
    engine = SpeculativeEngine(target, {"othervocab": drafter, NO_DRAFT: build_drafters([NO_DRAFT])[NO_DRAFT]},
                               policy="metasd-ucb-cost")
    for index in range(2):
        assert engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY).token_ids == plain[index].token_ids


def test_sampled_drafts_verified_as_point_masses_keep_the_targets_distribution(target, small_tokenizer):
    """The drafter draws its text from its own distribution; verified as point masses on the
    target tokens it spells, the emitted token is distributed as the target's p. Verifying the
    same draws with a q they were not drawn from does not."""
    drafter = CrossVocabularyProposer(tiny_llama(len(small_tokenizer), seed=1), small_tokenizer, target.tokenizer,
                                      name="othervocab", q_top_n=small_tokenizer.vocab_size)
    prompt = target.encode(messages=CHAT_PROMPTS[2])
    sampling = SamplingParams(temperature=1.0, seed=4)
    firsts = [drafter.propose("r", prompt if i == 0 else [], 1, sampling).token_ids for i in range(600)]
    firsts = [d[0] for d in firsts if d]
    drafted, counts = np.unique(firsts, return_counts=True)
    assert len(drafted) >= 5  # its draws are spread: a check that could tell point masses from q
    # the target's p over the tokens it drafted and one it never drafts (index -1); zero elsewhere
    index = {int(t): i for i, t in enumerate(drafted)}
    vocab = len(drafted) + 1
    p = torch.zeros(2, vocab)
    p[0, torch.tensor([index[int(t)] for t in drafted[np.argsort(-counts)][:5]])] = torch.tensor([0.30, 0.10, 0.05, 0.05, 0.05])
    p[0, -1] = 0.45
    p[1] = 1.0 / vocab
    generator = torch.Generator().manual_seed(0)

    def emitted_first(q_of) -> np.ndarray:
        freq = np.zeros(vocab)
        for token in firsts * 8:
            _, emitted = speculative_accept([index[token]], p, q_of(index[token]), generator)
            freq[emitted[0]] += 1
        return freq / freq.sum()

    exact = emitted_first(lambda token: dense_q(None, [token], vocab))
    assert 0.5 * np.abs(exact - p[0].numpy()).sum() < 0.03
    claimed_uniform = torch.full((1, vocab), 1.0 / vocab)  # a draft passed off as a draw from another q
    broken = emitted_first(lambda token: claimed_uniform)
    assert 0.5 * np.abs(broken - p[0].numpy()).sum() > 0.1


def test_a_draft_model_of_another_family_drafts_across_vocabularies_through_the_pool(target, small_tokenizer, plain):
    model = tiny_llama(len(small_tokenizer))
    model.tokenizer = small_tokenizer  # as actors.models.load_draft_model leaves it
    pool = build_drafters(["hf", NO_DRAFT], model, target.vocab_size, target.name)
    assert isinstance(pool["hf"], CrossVocabularyProposer)
    engine = SpeculativeEngine(target, pool, policy="fixed:hf")
    assert engine.generate(messages=CHAT_PROMPTS[1], sampling=GREEDY).token_ids == plain[1].token_ids


def test_a_draft_model_of_another_vocabulary_without_its_tokenizer_is_refused_naming_drafters(target):
    from actors.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        build_drafters(["hf"], tiny_llama(600), target.vocab_size, target.name)
    assert err.value.field == "drafters"
