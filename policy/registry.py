"""Policy names users see, mapped to (bandit class, config, reward kind); the only such table.
A policy is the bandit and its reward; how a round's drafts are verified is a setting of its own
(`VERIFY_MODES`, below).

    metasd-ucb        UCB + BD reward (the paper's default)
    metasd-ucb-be     UCB + BE reward
    metasd-ucb-cost   UCB + cost-aware reward (tokens/s; competes with the no-draft arm)
    exp3, thompson, sh, sw-ucb, random   (BD reward)
    fixed:<drafter>   always that drafter

    <base>-warm       warm-start each request's bandit from earlier requests' statistics
                      (PRIOR_WEIGHT pseudo-pulls per arm; when model-free drafters are scored
                      for free, PRIOR_WEIGHT_PULLED for the arms the request sees only by
                      pulling them: the costly model drafters)
    <base>-context    the warm start from the earlier requests whose prompts the target
                      represents most alike (policy/context_memory.py: their nearest
                      neighbours by the prompt's hidden states), the global statistics for
                      arms those never saw; the same pseudo-pulls as -warm

Verification (`verify`; config field, CLI `--verify`, bench `policy:<policy>@<verify>`):

    chosen          only the bandit's chosen drafter drafts; its draft is verified (the paper)
    counterfactual  the chosen draft is verified; every model-free drafter not chosen drafts too
                    as a shadow, scored against the output (never verified), and the bandit
                    learns from all of them (full information for the free arms)
    tree            the chosen drafter and every model-free drafter draft; the token tree of all
                    the drafts, the best rated first, is cut node by node (of each size the nodes
                    most likely accepted, at the size with the most expected tokens per second,
                    deploy/engine/draft_length.py `select_tree`) and verified in one forward; drafts
                    left out are scored as shadows
    ensemble        the chosen drafter and every model-free drafter draft; the drafts are combined
                    into one chain, each token the one their learned acceptances support most
                    (deploy/engine/ensemble.py, after TABED), cut as one draft and verified; every
                    drafter's own draft is scored as a shadow

The service's default is `metasd-ucb-cost-warm` with `tree` (DEFAULT_POLICY, DEFAULT_VERIFY): what
one request learns carries to the next (the warm bandit, and the draft-length statistics per
drafter, source and match length that rate and cut every draft), every free drafter is scored
every round, and a round whose drafts promise less than a plain step is one. Chosen on the
development prompts, reported on the test prompts (docs/benchmarks.md). A policy's own bandit
starts empty, as in the paper, unless its name ends in `-warm`. A bench run's label without
`@<verify>` means `chosen` (`split_run_policy`), as every report has meant it.
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

from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from policy.bandit import ArmStats, Bandit
from policy.exp3 import EXP3
from policy.fixed import FixedArm
from policy.random_arm import RandomArm
from policy.reward import BD, BE, COST
from policy.sequential_halving import SequentialHalving
from policy.sw_ucb import SlidingWindowUCB
from policy.thompson import Thompson
from policy.ucb import UCB, UCBConfig

DEFAULT_POLICY = "metasd-ucb-cost-warm"  # with DEFAULT_VERIFY: chosen on dev prompts (docs/benchmarks.md)
PRIOR_WEIGHT = 4.0  # pseudo-pulls a warm start grants each arm (measured: docs/experiments.md)
PRIOR_WEIGHT_PULLED = 32.0  # ... with shadows, each arm not observed for free (measured: docs/experiments.md)
COST_BETA = 0.05  # UCB's exploration weight on the cost reward (measured: docs/experiments.md)
CHOSEN, COUNTERFACTUAL, TREE, ENSEMBLE = "chosen", "counterfactual", "tree", "ensemble"
VERIFY_MODES = (CHOSEN, COUNTERFACTUAL, TREE, ENSEMBLE)
DEFAULT_VERIFY = TREE
WARM, CONTEXT = "-warm", "-context"  # the warm-start suffixes
_RETIRED = re.compile(r"-(m[1-9][0-9]*|mall|mauto|mbest|mrated|mtree|cf)(?=-warm$|-context$|$)")

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
    """A parsed policy name and verification mode: `make(prior, rng)` builds one request's bandit
    over `arms`."""

    name: str
    reward: str
    arms: tuple[str, ...]
    warm_start: bool
    factory: Callable[..., Bandit]
    verify: str = DEFAULT_VERIFY
    contextual: bool = False  # the warm start comes from the requests with the most similar prompts

    @property
    def shadows(self) -> bool:
        """Whether the model-free drafters not chosen draft too (scored as shadows)."""
        return self.verify != CHOSEN

    def make(self, prior: Mapping[str, ArmStats] | None, rng: np.random.Generator,
             observed_free: Collection[str] = ()) -> Bandit:
        """`observed_free`: the arms scored every round without pulling them (with shadows)."""
        if not self.warm_start:
            return self.factory(list(self.arms), rng, None, 0.0)
        weights = {arm: PRIOR_WEIGHT if not self.shadows or arm in observed_free else PRIOR_WEIGHT_PULLED
                   for arm in self.arms}
        return self.factory(list(self.arms), rng, prior, weights)


def parse_verify(verify: str) -> str:
    """Validate a verification mode; errors name the `verify` field."""
    if verify not in VERIFY_MODES:
        raise InvalidRequestError("verify", f"unknown verification mode {verify!r}; known: {list(VERIFY_MODES)}")
    return verify


def parse_policy(name: str, drafters: Sequence[str], verify: str = DEFAULT_VERIFY) -> PolicySpec:
    """Validate a policy name against the drafter pool; errors name the `policy` field."""
    verify = parse_verify(verify)
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("policy", "must be a non-empty string")
    if name.startswith("fixed:"):
        arm = name.removeprefix("fixed:")
        if arm not in drafters:
            raise InvalidRequestError("policy", f"fixed drafter {arm!r} is not in the pool {list(drafters)}")
        return PolicySpec(name, BD, (arm,), False, lambda arms, rng, prior, w: FixedArm(arms, rng, arm=arm), verify)
    retired = _RETIRED.search(name)
    if retired:
        raise InvalidRequestError(
            "policy", f"the suffix -{retired[1]} of {name!r} is retired: a policy is the bandit and its reward "
                      f"(-warm optional); how drafts are verified is the `verify` setting, one of {list(VERIFY_MODES)}")
    contextual = name.endswith(CONTEXT)
    warm = contextual or name.endswith(WARM)
    base = name.removesuffix(CONTEXT if contextual else WARM)
    if base not in _POLICIES:
        raise InvalidRequestError("policy", f"unknown policy {name!r}; known: {list(POLICY_NAMES)} "
                                            f"(suffix {WARM} or {CONTEXT})")
    cls, reward = _POLICIES[base]
    arms = tuple(drafters) if reward == COST else tuple(d for d in drafters if d != NO_DRAFT)
    if not arms:
        raise InvalidRequestError("policy", f"{name!r} needs at least one drafting arm; the pool is {list(drafters)}")
    return PolicySpec(name, reward, arms, warm, lambda arms, rng, prior, w: cls(arms, rng, prior, w), verify, contextual)


WITHOUT = "-without-"  # a bench run `<policy>[@<verify>]-without-<drafter>[+<drafter>...]`: the pool less those


def split_run_policy(label: str) -> tuple[str, str]:
    """A bench run's `<policy>[@<verify>][-without-...]` -> (policy, verify); no `@<verify>` means `chosen`."""
    policy, _, verify = label.partition(WITHOUT)[0].partition("@")
    return policy, verify or CHOSEN


def run_drafters(label: str, drafters: Sequence[str]) -> list[str]:
    """The pool a bench run's label gives its policy: `drafters`, less those named after `-without-`
    (joined by `+`), so one bench compares a policy with and without a drafter side by side."""
    _, without, excluded = label.partition(WITHOUT)
    names = [name for name in excluded.split("+") if name]
    if without and not names or any(name not in drafters for name in names):
        raise InvalidRequestError("runs", f"{label!r}: after {WITHOUT!r} name drafters of the pool {list(drafters)}, "
                                          "joined by +")
    return [d for d in drafters if d not in names]
