"""Policy names users see, mapped to (bandit class, config, reward kind); the only such table.

    metasd-ucb        UCB + BD reward (the paper's default)
    metasd-ucb-be     UCB + BE reward
    metasd-ucb-cost   UCB + cost-aware reward (tokens/s; competes with the no-draft arm)
    exp3, thompson, sh, sw-ucb, random   (BD reward)
    fixed:<drafter>   always that drafter

Suffixes, in this order, each optional:  <base>[-m<N>|-mall|-mauto|-mbest|-mrated|-mtree][-cf][-warm]

    -m<N>, -mall  draft with the top N (or all) drafting arms by the policy's index each round,
                  verified together as one token tree (the paper uses one; default -m1)
    -mauto        choose N each round: a UCB over N = 1..AUTO_MAX_WIDTH on the round's cost reward
                  (accepted tokens per second of drafting + verification, shared across requests);
                  a round of width 1 verifies as -mbest does
    -mbest        the chosen arm and every model-free drafter draft each round; the engine verifies
                  the one draft (or plain step) that promises the most tokens per second by its
                  drafter's learned acceptance (deploy/engine.py); the others are scored as -cf
                  shadows. Several drafters draft, one draft is verified. Implies -cf.
    -mrated       as -mbest, then the round's other drafts, best rated first, join the verified
                  tree while the tree promises more tokens per second (its expected yield over its
                  forward's cost; deploy/draft_length.py `tree_rate`). Implies -cf.
    -mtree        as -mbest, then the tree of all the round's drafts is cut node by node: of each
                  size, its nodes most likely accepted, at the size that promises the most tokens
                  per second (deploy/draft_length.py `select_tree`). Implies -cf.
    -cf           counterfactual feedback: model-free drafters not chosen also draft each round
                  (no target cost) and learn from how far their draft matches the output; only
                  the chosen arm's draft is verified (a one-drafter policy)
    -warm         warm-start each request's bandit from earlier requests' statistics
                  (PRIOR_WEIGHT pseudo-pulls per arm; with -cf, PRIOR_WEIGHT_PULLED for the arms
                  the request sees only by pulling them: the costly model drafters)

Each request's bandit starts empty, as in the paper; `-warm` warm-starts it from the
statistics of earlier requests instead. Measured on the shipped mix (README), cold was as fast or
faster in all three side-by-side comparisons on the default pool, so cold is the default there.
UCB on the cost reward uses beta COST_BETA: that reward lies in [0, ~0.4] on real rounds (it
divides by the (k + 1)-token ideal), so the paper's 0.5 for [0, 1] rewards explored costly arms
for most of a request. BD and BE cannot score the no-draft arm (it drafts nothing), so those
policies choose among the drafting arms only; the cost reward includes it.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from actors.no_draft import NO_DRAFT
from deploy.errors import InvalidRequestError
from policy.bandit import ArmStats, Bandit
from policy.exp3 import EXP3
from policy.fixed import FixedArm
from policy.random_arm import RandomArm
from policy.reward import BD, BE, COST
from policy.sequential_halving import SequentialHalving
from policy.sw_ucb import SlidingWindowUCB
from policy.thompson import Thompson
from policy.ucb import UCB, UCBConfig

DEFAULT_POLICY = "metasd-ucb-cost"
PRIOR_WEIGHT = 4.0  # pseudo-pulls a warm start grants each arm (measured: see README)
PRIOR_WEIGHT_PULLED = 32.0  # ... with -cf, each arm not observed for free (measured: see README)
COST_BETA = 0.05  # UCB's exploration weight on the cost reward (measured: see README)
AUTO_MAX_WIDTH = 4  # -mauto chooses among 1..this many drafters a round
ALL = 0  # width: every drafting arm
_SUFFIXES = re.compile(r"^(?P<base>.+?)(?:-m(?P<width>[1-9][0-9]*|all|auto|best|rated|tree))?(?P<cf>-cf)?(?P<warm>-warm)?$")

_POLICIES: dict[str, tuple[Callable[..., Bandit], str]] = {
    "metasd-ucb": (UCB, BD),
    "metasd-ucb-be": (UCB, BE),
    "metasd-ucb-cost": (partial(UCB, config=UCBConfig(beta=COST_BETA)), COST),
    "exp3": (EXP3, BD),
    "thompson": (Thompson, BD),
    "sh": (SequentialHalving, BD),
    "sw-ucb": (SlidingWindowUCB, BD),
    "random": (RandomArm, BD),
}
BASE_POLICY_NAMES = tuple(_POLICIES)
POLICY_NAMES = BASE_POLICY_NAMES + ("fixed:<drafter>",)


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy name: `make(prior, rng)` builds one request's bandit over `arms`."""

    name: str
    reward: str
    arms: tuple[str, ...]
    warm_start: bool
    factory: Callable[..., Bandit]
    width: int = 1  # drafters a round; ALL = every arm
    auto_width: bool = False  # width chosen each round (up to AUTO_MAX_WIDTH)
    counterfactual: bool = False
    pick_best: bool = False  # of the chosen draft and the shadows, verify the best-rated one (-mbest)
    pick_set: bool = False  # ... and add the others while their tree promises more (-mrated)
    pick_nodes: bool = False  # ... or cut the tree of all of them node by node (-mtree)

    def make(self, prior: Mapping[str, ArmStats] | None, rng: np.random.Generator,
             observed_free: Collection[str] = ()) -> Bandit:
        """`observed_free`: the arms a -cf policy scores every round without pulling them."""
        if not self.warm_start:
            return self.factory(list(self.arms), rng, None, 0.0)
        weights = {arm: PRIOR_WEIGHT if not self.counterfactual or arm in observed_free else PRIOR_WEIGHT_PULLED
                   for arm in self.arms}
        return self.factory(list(self.arms), rng, prior, weights)


def drafts_with_several(name: str) -> bool:
    """Whether a policy name has several drafters draft each round (-m<N> with N > 1, -mall,
    -mauto, -mbest, -mrated, -mtree); no pool needed (the bench classifies its runs by it)."""
    parts = _SUFFIXES.match(name)
    return parts is not None and not name.startswith("fixed:") and parts["width"] not in (None, "1")


def parse_policy(name: str, drafters: Sequence[str]) -> PolicySpec:
    """Validate a policy name against the drafter pool; errors name the `policy` field."""
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("policy", "must be a non-empty string")
    if name.startswith("fixed:"):
        arm = name.removeprefix("fixed:")
        if arm not in drafters:
            raise InvalidRequestError("policy", f"fixed drafter {arm!r} is not in the pool {list(drafters)}")
        return PolicySpec(name, BD, (arm,), False, lambda arms, rng, prior, w: FixedArm(arms, rng, arm=arm))
    parts = _SUFFIXES.match(name)
    base = parts["base"]
    if base not in _POLICIES:
        raise InvalidRequestError(
            "policy", f"unknown policy {name!r}; known: {list(POLICY_NAMES)} (suffixes -m<N>|-mall|-mauto|-mbest|-mrated|-mtree, -cf, -warm)"
        )
    cls, reward = _POLICIES[base]
    arms = tuple(drafters) if reward == COST else tuple(d for d in drafters if d != NO_DRAFT)
    if not arms:
        raise InvalidRequestError("policy", f"{name!r} needs at least one drafting arm; the pool is {list(drafters)}")
    width_name = parts["width"] or "1"
    named = {"all": ALL, "auto": 1, "best": 1, "rated": 1, "tree": 1}
    width = named[width_name] if width_name in named else int(width_name)
    return PolicySpec(
        name, reward, arms, bool(parts["warm"]), lambda arms, rng, prior, w: cls(arms, rng, prior, w),
        width=width, auto_width=width_name == "auto", counterfactual=bool(parts["cf"]) or width_name in ("best", "rated", "tree"),
        pick_best=width_name in ("auto", "best", "rated", "tree"), pick_set=width_name == "rated",
        pick_nodes=width_name == "tree",
    )
