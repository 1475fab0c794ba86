"""An ensemble draft (the `ensemble` verification mode, after TABED): a round's drafts combined
into one chain by weights learned online from the target's output (pure).

At depth i the drafts that agree with the chain so far vote. Draft d's weight there is a_{d,i},
its P(accepted | reached) as the draft-length statistics learned it from every verified and every
counterfactually scored draft of its drafter, source and match length (DraftLengths.acceptance).
A token's support is 1 - prod(1 - a_d) over the drafts proposing it (drafts that agree count
for more than either alone). Under greedy decoding the chain takes the best-supported token
(the earlier draft on a tie). Under sampling it draws the token from the mixture
sum_d a_d q_d / sum_d a_d of the voting drafts' distributions (a point mass for a lookup draft,
the drafter's own q for a model), and that mixture is the chain's q: rejection sampling against
it keeps the output distributed as the target's. A model draft's q at depth i is conditioned on
its own tokens before i, which are the chain's while it votes. Each token's support is its
`confidence`, which the draft-length statistics calibrate against what the target accepts (under
the drafter name `ensemble`, the mode's). The chain ends where no draft continues it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from actors.proposal import Proposal, SparseDist
from actors.sampling import SamplingParams
from policy.registry import ENSEMBLE


def ensemble_draft(drafts: Sequence[Proposal], acceptance: Callable[[Proposal, int], list[float]],
                   sampling: SamplingParams, generator: torch.Generator, k: int) -> Proposal:
    """One chain of at most k tokens from `drafts` (in order of precedence); acceptance(d, n): a_{d,1..n}."""
    drafts = [d for d in drafts if d.token_ids]
    weights = [acceptance(d, min(len(d.token_ids), k)) for d in drafts]
    tokens: list[int] = []
    q: list[SparseDist] = []
    confidence: list[float] = []
    voters = list(range(len(drafts)))
    while voters and len(tokens) < k:
        depth = len(tokens)
        support: dict[int, float] = {}  # token -> P(every draft proposing it is wrong), then 1 - that
        for d in voters:
            token = drafts[d].token_ids[depth]
            support[token] = support.get(token, 1.0) * (1.0 - weights[d][depth])
        support = {token: 1.0 - missed for token, missed in support.items()}
        if sampling.greedy:
            token = max(support, key=lambda t: support[t])  # dicts keep the first voter's order on a tie
            confidence.append(support[token])
        else:
            dist = _mixture([drafts[d] for d in voters], [weights[d][depth] for d in voters], depth)
            index = int(torch.multinomial(torch.tensor(dist.probs, dtype=torch.float64), 1, generator=generator))
            token = dist.ids[index]
            q.append(dist)  # a token no draft proposed (drawn from a model's q): its mixture mass
            confidence.append(support.get(token, dist.probs[index]))
        tokens.append(token)
        voters = [d for d in voters if drafts[d].token_ids[depth] == token and len(drafts[d].token_ids) > depth + 1]
    return Proposal(ENSEMBLE, tuple(tokens), q=tuple(q) if q else None, confidence=tuple(confidence) or None)


def _mixture(voters: Sequence[Proposal], weights: Sequence[float], depth: int) -> SparseDist:
    """sum_d w_d q_d / sum_d w_d at `depth` (a draft without q: a point mass on its token)."""
    total = sum(weights)
    mass: dict[int, float] = {}
    for draft, weight in zip(voters, weights):
        share = weight / total if total > 0 else 1.0 / len(weights)
        dist = draft.q[depth] if draft.q is not None else SparseDist((draft.token_ids[depth],), (1.0,))
        for token, prob in zip(dist.ids, dist.probs):
            mass[token] = mass.get(token, 0.0) + share * prob
    return SparseDist(tuple(mass), tuple(mass.values()))
