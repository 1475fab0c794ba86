"""Learning from a round: each verified draft's reward (computed here, where the timings are),
the shadows scored against the output as it is committed (deploy/engine/counterfactual.py), and
the draft-length statistics' update (an `ensemble` draft teaches only these: the bandit learns
from its drafters' own drafts, scored as shadows). The feedback rides on the request's next coordinator call
(or on `finish`). The rewards follow policy/reward.py; a batched forward charges each request's
round its share (`BatchPricing`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from actors.proposal import BRANCH, Proposal
from deploy.engine.acceptance import Verdict
from deploy.engine.cost_model import BatchCosts, ForwardCosts
from deploy.engine.counterfactual import ShadowScore
from deploy.engine.draft_length import DraftLengths
from deploy.engine.planner import Drafts
from deploy.engine.request import RequestState
from policy.coordinator import DraftRound, Feedback, RoundFeedback
from policy.registry import ENSEMBLE
from policy.reward import COST, round_reward


@dataclass(frozen=True)
class BatchPricing:
    """What a batched forward charges each request's round in rewards: a plain step's share of
    the batch, plus each verified (or shadow) draft token's marginal cost (goodput's prices)."""

    plain_step_s: float
    per_token_s: float

    def verify_s(self, drafted: int) -> float:
        return self.plain_step_s + self.per_token_s * drafted


def batch_pricing(costs: BatchCosts, rows: int, positions: int, forward_s: float) -> BatchPricing:
    """The forward's seconds split as goodput priced them: a plain step's share per request, the
    rest per draft position (scaled to what the forward measured); the batch costs learn the forward."""
    predicted, plain = costs.forward_s(positions), costs.forward_s(rows)
    costs.observe(positions, forward_s)
    per_token = (predicted - plain) / (positions - rows) if positions > rows else costs.forward_s(rows + 1) - plain
    scale = forward_s / predicted
    return BatchPricing(scale * plain / rows, scale * max(per_token, 0.0))


class RoundLearner:
    def __init__(self, reward_kind: str, k: int, costs: ForwardCosts, draft_lengths: DraftLengths) -> None:
        self.reward_kind, self.k, self.costs, self.draft_lengths = reward_kind, k, costs, draft_lengths

    def learn(self, request: RequestState, drafts: Drafts, chosen: DraftRound, verdict: Verdict,
              draft_s: float, pricing: BatchPricing | None = None) -> tuple[RoundFeedback | None, float]:
        """The round's feedback for the coordinator (each verified draft's reward, and the shadows
        whose score became final) and the draft-length statistics' update. -> (feedback, the
        best verified draft's reward)."""
        if pricing is None:  # the cost model's sizes are forwards of one request
            self.costs.observe(verdict.chain_size, verdict.verify_s)
            priced_s = self.costs.priced_verify_s(verdict.chain_size, verdict.drafted + 1, verdict.verify_s)
        else:
            priced_s = verdict.verify_s
        seen: set[tuple[str, tuple[int, ...]]] = set()  # a draft tree's chains share prefixes: each node counts once
        for proposal, outcome in zip(chosen.proposals, verdict.outcomes):
            tokens = proposal.token_ids
            shared = next((i for i in range(len(tokens), 0, -1) if (proposal.drafter, tokens[:i]) in seen), 0)
            seen.update((proposal.drafter, tokens[:i]) for i in range(1, len(tokens) + 1))
            self.draft_lengths.observe(proposal, outcome.accepted, skip=shared)
        # what the round cost beyond drafting (selection, RPCs), shared by every draft in it
        overhead_s = max(0.0, draft_s - drafts.drafting_s)
        plain_step_s = pricing.plain_step_s if pricing else self.costs.plain_step_s
        best = {}  # a draft tree's chains earn their drafter one reward: its longest accepted chain's
        for p, outcome in zip(chosen.proposals, verdict.outcomes):
            best[p.drafter] = max(best.get(p.drafter, 0), outcome.accepted)
        feedback = [self._feedback(p, best[p.drafter] if p.source != BRANCH else outcome.accepted, outcome.overlaps,
                                   p.draft_s + overhead_s, priced_s, plain_step_s)
                    for p, outcome in zip(chosen.proposals, verdict.outcomes) if p.source != BRANCH]
        position = len(request.tokens)
        # a draft tree's other chains are no shadows: its drafter is scored on its first chain
        final = request.shadows.add([replace(s, draft_s=s.draft_s + overhead_s) for s in chosen.shadows
                                     if s.source != BRANCH], position)
        p, rows = verdict.p, verdict.branch_rows
        final += request.shadows.observe(position, verdict.emitted, lambda i: p[rows[i]])
        for score in final:  # a shadow teaches the draft lengths as a verified draft would
            self.draft_lengths.observe(score.proposal, score.matched)
        feedback += [self._counterfactual(s, pricing) for s in final]
        reward = max((f.reward for f in feedback if not f.counterfactual), default=0.0)
        # an ensemble draft is no arm of the bandit: its drafters learn from their own drafts (shadows)
        feedback = [f for f in feedback if f.drafter != ENSEMBLE]
        return (RoundFeedback(tuple(feedback)) if feedback else None), reward

    def last_feedback(self, request: RequestState) -> RoundFeedback | None:
        """A finished request's feedback for `finish`: its last round's, and the shadows still open, scored."""
        last = tuple(self._counterfactual(s) for s in request.shadows.finish())
        feedback = request.feedback
        if last:
            feedback = replace(feedback, drafts=feedback.drafts + last) if feedback else RoundFeedback(last)
        return feedback

    def _feedback(self, proposal: Proposal, accepted: int, overlaps: Sequence[float], draft_s: float, verify_s: float,
                  plain_step_s: float, counterfactual: bool = False) -> Feedback:
        """plain_step_s: what a plain step costs the request (alone, or its share of a batch)."""
        reward = round_reward(
            self.reward_kind, accepted=accepted, drafted=len(proposal.token_ids), overlaps=overlaps,
            draft_s=draft_s, verify_s=verify_s, plain_step_s=plain_step_s, k=self.k,
        )
        # the cost reward is a rate: weighed by the round's duration, an arm's mean is its throughput
        weight = (draft_s + verify_s) / plain_step_s if self.reward_kind == COST and plain_step_s else 1.0
        return Feedback(proposal.drafter, len(proposal.token_ids), accepted, reward, counterfactual, weight)

    def _counterfactual(self, shadow: ShadowScore, pricing: BatchPricing | None = None) -> Feedback:
        """A shadow draft's feedback: its matched tokens as accepted; the cost reward prices it as
        if verified (its drafting time plus its round's overhead, a verification of its size,
        alone or in the batch that scored it)."""
        proposal, drafted = shadow.proposal, len(shadow.proposal.token_ids)
        overlaps = tuple(shadow.overlaps)
        if overlaps and shadow.matched < len(overlaps):  # a mismatch: the positions after it count 0
            overlaps += (0.0,) * (drafted - len(overlaps))
        if pricing is None:
            verify_s, plain_step_s = self.costs.shadow_verify_s(drafted), self.costs.plain_step_s
        else:
            verify_s, plain_step_s = pricing.verify_s(drafted), pricing.plain_step_s
        return self._feedback(proposal, shadow.matched, overlaps, proposal.draft_s, verify_s, plain_step_s,
                              counterfactual=True)
