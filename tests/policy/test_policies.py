"""Bandit policies on simulated Bernoulli drafters: the UCB family finds the best arm, regret is
sublinear, warm starts skip exploration, and arms come and go by name."""
import numpy as np
import pytest

from actors.errors import InvalidRequestError
from policy.bandit import ArmStats
from policy.exp3 import EXP3
from policy.registry import parse_policy
from policy.sequential_halving import SequentialHalving, SequentialHalvingConfig
from policy.sw_ucb import SlidingWindowUCB
from policy.thompson import Thompson
from policy.ucb import UCB, UCBConfig

MEANS = {"weak": 0.3, "medium": 0.5, "strong": 0.7}


def play(policy, rounds: int, seed: int = 0) -> tuple[float, dict[str, int]]:
    """Pseudo-regret after `rounds` pulls, and the pull counts."""
    env = np.random.default_rng(seed + 100)
    regret, pulls = 0.0, dict.fromkeys(MEANS, 0)
    for _ in range(rounds):
        arm = policy.select(1)[0]
        policy.update(arm, float(env.random() < MEANS[arm]))
        regret += max(MEANS.values()) - MEANS[arm]
        pulls[arm] += 1
    return regret, pulls


UCB_FAMILY = {
    "ucb": lambda rng: UCB(list(MEANS), rng, config=UCBConfig(beta=0.5)),
    "ucb-beta1": lambda rng: UCB(list(MEANS), rng, config=UCBConfig(beta=1.0)),
    "sw-ucb": lambda rng: SlidingWindowUCB(list(MEANS), rng),
}


@pytest.mark.parametrize("name", list(UCB_FAMILY))
def test_each_ucb_variant_pulls_the_best_arm_most(name):
    _, pulls = play(UCB_FAMILY[name](np.random.default_rng(1)), 3000)
    assert max(pulls, key=pulls.get) == "strong"
    if name != "sw-ucb":  # the sliding window keeps re-exploring by design
        assert pulls["strong"] > 0.8 * 3000


@pytest.mark.parametrize("name", ["ucb", "ucb-beta1"])
def test_ucb_regret_grows_sublinearly(name):
    short = np.mean([play(UCB_FAMILY[name](np.random.default_rng(s)), 1000, s)[0] for s in range(4)])
    long = np.mean([play(UCB_FAMILY[name](np.random.default_rng(s)), 8000, s)[0] for s in range(4)])
    assert long / short < 3.0  # linear regret would give 8


def test_thompson_and_sequential_halving_find_the_best_arm():
    _, pulls = play(Thompson(list(MEANS), np.random.default_rng(2)), 2000)
    assert pulls["strong"] > 0.8 * 2000
    sh = SequentialHalving(list(MEANS), np.random.default_rng(3), config=SequentialHalvingConfig(budget=600))
    play(sh, 2000)
    assert sh.survivors == ["strong"]


def test_exp3_moves_probability_towards_the_best_arm():
    policy = EXP3(list(MEANS), np.random.default_rng(4))
    play(policy, 3000)
    probs = policy.probabilities()
    assert max(probs, key=probs.get) == "strong"


def test_a_warm_start_skips_exploring_arms_the_prior_already_measured():
    prior = {"weak": ArmStats(50, 10.0), "medium": ArmStats(50, 25.0), "strong": ArmStats(50, 40.0)}
    policy = UCB(list(MEANS), np.random.default_rng(0), prior=prior, prior_weight=4)
    assert policy.select(1) == ["strong"]
    assert policy.stats["strong"].pulls == 4 and policy.stats["strong"].mean == pytest.approx(0.8)
    cold = UCB(list(MEANS), np.random.default_rng(0))
    assert len(cold.untried()) == 3  # a cold request explores every arm first


def test_the_same_seed_gives_the_same_choices():
    a = [Thompson(list(MEANS), np.random.default_rng(9)).select(1)[0] for _ in range(5)]
    b = [Thompson(list(MEANS), np.random.default_rng(9)).select(1)[0] for _ in range(5)]
    assert a == b


def test_arms_can_be_added_and_removed_by_name():
    policy = UCB(["a", "b"], np.random.default_rng(0))
    policy.add_arm("c")
    assert policy.arms == ["a", "b", "c"] and "c" in policy.untried()
    policy.remove_arm("a")
    assert policy.arms == ["b", "c"]
    policy.update("a", 1.0)  # feedback for a removed arm is dropped, not an error
    with pytest.raises(ValueError):
        policy.add_arm("b")


def test_ucb_config_is_validated():
    with pytest.raises(ValueError, match="beta"):
        UCBConfig(beta=-1)


def test_policy_names_map_to_their_rewards_and_arms():
    pool = ["ngram", "suffix", "none"]
    assert parse_policy("metasd-ucb", pool).reward == "bd"
    assert parse_policy("metasd-ucb", pool).arms == ("ngram", "suffix")  # BD cannot score the no-draft arm
    assert parse_policy("metasd-ucb-be", pool).reward == "be"
    assert parse_policy("metasd-ucb-cost", pool).arms == ("ngram", "suffix", "none")
    assert parse_policy("metasd-ucb-cost", pool).warm_start is False
    assert parse_policy("metasd-ucb-cost-warm", pool).warm_start is True
    assert parse_policy("metasd-ucb-cost-warm", pool).contextual is False
    contextual = parse_policy("metasd-ucb-cost-context", pool)
    assert contextual.warm_start and contextual.contextual and contextual.reward == "cost"
    assert parse_policy("fixed:suffix", pool).arms == ("suffix",)


@pytest.mark.parametrize("name", ["ucb", "fixed:hf", "metasd-ucb-hot", "", "metasd-ucb-context-warm", "ucb-context"])
def test_unknown_policies_raise_an_error_naming_the_policy_field(name):
    with pytest.raises(InvalidRequestError) as err:
        parse_policy(name, ["ngram", "none"])
    assert err.value.field == "policy"


def test_a_policy_is_the_bandit_and_its_reward_and_the_verification_mode_is_a_setting_of_its_own():
    from policy.registry import split_run_policy

    pool = ["ngram", "suffix", "none"]
    spec = parse_policy("metasd-ucb-cost-warm", pool, "tree")
    assert (spec.reward, spec.warm_start, spec.verify, spec.shadows) == ("cost", True, "tree", True)
    assert parse_policy("metasd-ucb-cost-warm", pool, "counterfactual").shadows
    assert not parse_policy("sw-ucb", pool, "chosen").shadows
    assert split_run_policy("metasd-ucb-cost-warm@tree") == ("metasd-ucb-cost-warm", "tree")
    assert split_run_policy("fixed:ngram") == ("fixed:ngram", "chosen")
    with pytest.raises(InvalidRequestError) as err:
        parse_policy("metasd-ucb", pool, "best")
    assert err.value.field == "verify"


def test_the_default_learns_across_requests_and_verifies_the_tree_of_every_free_draft():
    from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY

    spec = parse_policy(DEFAULT_POLICY, ["ngram", "suffix", "hierarchy", "none"])
    assert (spec.name, spec.verify) == ("metasd-ucb-cost-warm", "tree")
    assert spec.warm_start and spec.shadows and spec.reward == "cost" and "none" in spec.arms
    assert DEFAULT_VERIFY == "tree"


@pytest.mark.parametrize("retired", ["metasd-ucb-cost-mtree-warm", "metasd-ucb-cf", "metasd-ucb-m2", "metasd-ucb-mall",
                                     "metasd-ucb-mauto-cf", "metasd-ucb-cost-mbest", "metasd-ucb-cost-mrated-warm"])
def test_a_retired_suffix_is_refused_with_the_verify_setting_named(retired):
    with pytest.raises(InvalidRequestError, match="verify") as err:
        parse_policy(retired, ["ngram", "suffix", "none"])
    assert err.value.field == "policy"


def test_rounds_weighted_by_their_duration_make_an_arms_mean_its_throughput_not_its_mean_rate():
    """An arm whose rounds are either cheap and short or slow and long: the mean of its rounds'
    rates flatters it; weighted by duration, its mean is Σ tokens / Σ seconds."""
    rounds = [(1.0, 1.0), (2.0, 8.0)]  # (tokens, seconds): 1 token in 1 s, then 2 tokens in 8 s
    bandit = UCB(["mixed"], np.random.default_rng(0))
    for tokens, seconds in rounds:
        bandit.update("mixed", tokens / seconds, weight=seconds)
    assert bandit.stats["mixed"].mean == pytest.approx(3 / 9)  # not (1 + 0.25) / 2
    assert bandit.t == pytest.approx(9.0)
