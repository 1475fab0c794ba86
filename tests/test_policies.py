"""Bandit policies on simulated Bernoulli drafters: the UCB family finds the best arm, regret is
sublinear, warm starts skip exploration, and arms come and go by name."""
import numpy as np
import pytest

from deploy.errors import InvalidRequestError
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
    assert parse_policy("fixed:suffix", pool).arms == ("suffix",)


@pytest.mark.parametrize("name", ["ucb", "fixed:hf", "metasd-ucb-hot", ""])
def test_unknown_policies_raise_an_error_naming_the_policy_field(name):
    with pytest.raises(InvalidRequestError) as err:
        parse_policy(name, ["ngram", "none"])
    assert err.value.field == "policy"


def test_policy_names_take_width_counterfactual_and_warm_suffixes_in_that_order():
    from policy.registry import ALL

    pool = ["ngram", "suffix", "none"]
    spec = parse_policy("metasd-ucb-cost-m3-cf-warm", pool)
    assert (spec.reward, spec.width, spec.auto_width, spec.counterfactual, spec.warm_start) == ("cost", 3, False, True, True)
    assert parse_policy("metasd-ucb-mall", pool).width == ALL
    assert parse_policy("thompson-mauto", pool).auto_width
    assert parse_policy("sw-ucb", pool).width == 1 and not parse_policy("sw-ucb", pool).counterfactual
    # -mbest: several draft (it implies -cf), the best-rated draft is verified; -cf alone verifies the chosen arm
    best = parse_policy("metasd-ucb-cost-mbest-warm", pool)
    assert (best.width, best.counterfactual, best.pick_best, best.warm_start) == (1, True, True, True)
    assert not parse_policy("metasd-ucb-cost-cf-warm", pool).pick_best and parse_policy("metasd-ucb-mauto-cf", pool).pick_best
    rated = parse_policy("metasd-ucb-cost-mrated", pool)
    assert (rated.counterfactual, rated.pick_best, rated.pick_set) == (True, True, True) and not best.pick_set
    tree = parse_policy("metasd-ucb-cost-mtree-warm", pool)
    assert (tree.width, tree.counterfactual, tree.pick_best, tree.pick_nodes) == (1, True, True, True) and not rated.pick_nodes
    for bad in ("metasd-ucb-m0", "metasd-ucb-warm-m2", "metasd-ucb-mmany", "metasd-ucb-cf-m2"):
        with pytest.raises(InvalidRequestError, match="policy"):
            parse_policy(bad, pool)


def test_rounds_weighted_by_their_duration_make_an_arms_mean_its_throughput_not_its_mean_rate():
    """An arm whose rounds are either cheap and short or slow and long: the mean of its rounds'
    rates flatters it; weighted by duration, its mean is Σ tokens / Σ seconds."""
    rounds = [(1.0, 1.0), (2.0, 8.0)]  # (tokens, seconds): 1 token in 1 s, then 2 tokens in 8 s
    bandit = UCB(["mixed"], np.random.default_rng(0))
    for tokens, seconds in rounds:
        bandit.update("mixed", tokens / seconds, weight=seconds)
    assert bandit.stats["mixed"].mean == pytest.approx(3 / 9)  # not (1 + 0.25) / 2
    assert bandit.t == pytest.approx(9.0)
