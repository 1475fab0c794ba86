"""The speculative engine: one request's draft -> verify -> accept loop on the target.

Per round: one coordinator call (the newly committed tokens and the previous round's feedback
go in, the drafts of up to k tokens of the drafters the coordinator's bandit chose come out);
one target forward verifies them, each draft first cut to the length whose expected yield pays
for its forward (deploy/draft_length.py). A `-mbest` round (one chosen draft and shadow drafts)
verifies whichever of them promises the most tokens per second by those same statistics (its
drafter's learned acceptance for the draft's source and match length): the bandit picks which
drafters run, the evidence of the round's own drafts picks which one to verify, and the others
are scored as shadows; a `-mrated` round then adds the others, best rated first, while the tree
they make promises more (`DraftLengths.tree_rate`); a `-mtree` round instead cuts the tree of
every uncut draft node by node (`DraftLengths.select_tree`); a `-cf` round verifies its chosen draft and
only scores the shadows. A model drafter is asked for as many tokens as pay for their drafting time
too, and for none when a model-free draft in hand already promises more (drafting in one process
is sequential: the cheap drafters draft first). One draft: the forward runs over [last token, draft],
gives p for every draft position plus the bonus position, `verify` accepts losslessly and the KV
cache is cropped to the accepted path. Several distinct drafts: they are merged into a token tree
(deploy/draft_tree.py), one forward with a tree attention mask scores every node,
`verify_tree` accepts losslessly, and the cache keeps the accepted branch only. Each drafter's
reward (computed here, where the timings are) rides on the next call; shadow drafts (`-cf`) are
scored against the output as it is committed, never verified (deploy/counterfactual.py), and their
cost reward prices their draft at its own drafting time plus the measured cost of verifying a
draft of its length. The no-draft arm, empty proposals or a
one-token budget make the round a plain target step. Greedy output equals plain decoding token
for token; sampled output follows the target's distribution.

With `device=` (a measured cost profile of another device, deploy/cost_profile.py) the engine
decides as it would there: the profile's forward costs price verifications (cuts, model-drafter
budgets, rewards; no padding), and a model drafter's drafting time is scaled to the same share of
a plain step there as here. Only decisions change; every forward still runs here, losslessly.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal, Proposer
from deploy.cost_profile import CostProfile
from deploy.counterfactual import CounterfactualScorer, ShadowScore
from deploy.draft_length import DraftLengths
from deploy.draft_tree import ROOT, DraftTree
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams, warp_probs
from deploy.target import TargetModel
from deploy.tree_verify import per_draft_outcome, verify_tree
from deploy.verify import draft_overlaps, verify
from policy.coordinator import Coordinator, DraftRound, Feedback, RoundFeedback
from policy.registry import DEFAULT_POLICY
from policy.reward import BD, COST, cost_reward, round_reward

MAX_K = 32
PLAIN_DRAFT = Proposal(drafter=NO_DRAFT)  # an empty draft: a plain step


@dataclass(frozen=True)
class RoundTrace:
    drafter: str  # several drafters of one round joined by '+'
    drafted: int  # positions verified (a tree's distinct nodes)
    accepted: int
    emitted: int
    reward: float
    draft_s: float  # the coordinator call as the target saw it (selection, RPCs, drafting)
    verify_s: float
    drafter_s: float = 0.0  # the slowest drafter's own drafting time (chosen and shadow drafts; on the engine's device)
    drafting_sum_s: float = 0.0  # every drafter's own drafting time as measured here, summed

    @property
    def parallel_draft_s(self) -> float:
        """The coordinator call had its drafters drafted in parallel, as drafter actors on their
        own devices do: its overhead (selection, RPCs, merging) plus the slowest drafter. Equal to
        draft_s for one drafter; in-process drafting pays their sum."""
        return max(0.0, self.draft_s - self.drafting_sum_s) + self.drafter_s


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    rounds: list[RoundTrace] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        per_drafter: dict[str, dict[str, int]] = {}
        for r in self.rounds:
            d = per_drafter.setdefault(r.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
            d["steps"] += 1
            d["drafted"] += r.drafted
            d["accepted"] += r.accepted
        drafted = sum(r.drafted for r in self.rounds)
        accepted = sum(r.accepted for r in self.rounds)
        return {
            "rounds": len(self.rounds),
            "num_spec_steps": sum(1 for r in self.rounds if r.drafted),
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": len(self.token_ids) / len(self.rounds) if self.rounds else None,
            "draft_s": sum(r.draft_s for r in self.rounds),
            "verify_s": sum(r.verify_s for r in self.rounds),
            "per_drafter": per_drafter,
        }

    def to_dict(self, trace: bool = False) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.summary}
        if trace:
            out["rounds"] = [asdict(r) for r in self.rounds]
        return out


class SpeculativeEngine:
    """Runs requests against one target. Drafting goes through a coordinator: a local
    `Coordinator` over `drafters` (default), or any object with the same `propose` / `finish` /
    `reward_kind` (the Ray coordinator actor's proxy)."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Mapping[str, Proposer] | None = None,
        policy: str = DEFAULT_POLICY,
        k: int = 7,
        seed: int = 0,
        max_padding: int = 4,
        coordinator: Coordinator | None = None,
        cut_drafts: bool = True,
        device: CostProfile | None = None,
    ) -> None:
        """cut_drafts: verify only as much of each draft as pays for its forward, and in a `-mbest`
        round, of one chosen draft and its shadows the one that pays most (deploy/draft_length.py); False verifies every
        drafted token of the drafts chosen. A sampled request with a seed always verifies the
        chosen drafts whole: cut and pick depend on measured times, and its output must depend on
        the seed alone. device: decide on that device's costs (module docstring); it needs a local
        coordinator, which knows which drafters run a model."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidRequestError("k", f"must be an integer in 1..{MAX_K}, got {k!r}")
        if (drafters is None) == (coordinator is None):
            raise ValueError("give drafters (a local coordinator is built) or a coordinator, not both")
        self.target, self.k, self.cut_drafts, self.device = target, k, cut_drafts, device
        self.coordinator = coordinator if coordinator is not None else Coordinator(drafters, policy, seed)
        if device is not None and not isinstance(self.coordinator, Coordinator):
            raise ValueError("device= needs a local coordinator (it scales the model drafters' drafting times)")
        self.reward_kind = self.coordinator.reward_kind
        self._seeds = np.random.default_rng(seed)
        self._seed_lock = threading.Lock()
        # Forward sizes cost non-monotonically on CPU (measured once per target): a draft's forward
        # is padded with up to max_padding throwaway positions when a larger size is cheaper.
        self.max_positions = k + 1 + max_padding
        only_plain = drafters is not None and set(drafters) == {NO_DRAFT}
        # padded_size[n]: the forward size for n positions (the cheapest size >= n)
        self.padded_size = list(range(self.max_positions + 1))
        if max_padding and not only_plain and device is None:
            self.padded_size = [target.padded_length(n, self.max_positions) for n in self.padded_size]
        # verify_s_by_size[n]: seconds of a one-draft verification over a forward of n positions
        # (the target's profile at first, then a running mean of the rounds seen; 1 = a plain
        # step; on a device: its profile, fixed): what the cost reward compares with, and what a
        # shadow draft would have cost
        here = [0.0] * (self.max_positions + 1) if only_plain else [0.0, *target.forward_profile(self.max_positions)]
        self.verify_s_by_size = here if device is None or only_plain else [
            0.0, *(device.forward_s(n) for n in range(1, self.max_positions + 1))]
        # a model drafter's drafting seconds here -> on the device: the same share of a plain step
        self.draft_scale = device.plain_step_s / here[1] if device is not None and here[1] else 1.0
        # how many of each draft's tokens to verify, learned from the verifications (deploy/draft_length.py)
        self.draft_s_per_token: dict[str, float] = {}  # each drafter's drafting seconds per token (running mean)
        self.draft_lengths = DraftLengths(self._forward_cost_s, lambda n: self.padded_size[n], k)

    def generate(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingParams = SamplingParams(),
    ) -> GenerationResult:
        return self.run(self.target.encode(prompt=prompt, messages=messages, token_ids=token_ids), sampling)

    def run(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None) -> GenerationResult:
        """Generate from prompt token ids; `on_tokens(list[int])` is called with each round's output."""
        self.target.check_length(len(prompt_ids), sampling.max_tokens)
        request_id = uuid.uuid4().hex
        with self._seed_lock:
            seed = sampling.seed if sampling.seed is not None else int(self._seeds.integers(2**62))
        generator = torch.Generator().manual_seed(seed)
        tokens = list(prompt_ids)  # committed context; the cache always covers tokens[:-1]
        sent = 0  # committed tokens the coordinator has seen
        cache = self.target.new_cache()
        if len(tokens) > 1:
            self.target.forward(cache, tokens[:-1], logits_for=0)  # prefill: only the K/V cache is needed
        output: list[int] = []
        rounds: list[RoundTrace] = []
        feedback: RoundFeedback | None = None
        shadows = CounterfactualScorer(with_overlaps=self.reward_kind == BD)
        cutting = self.cut_drafts and self.plain_step_s > 0 and (sampling.greedy or sampling.seed is None)
        finish: str | None = None
        try:
            while finish is None:
                budget = min(self.k, sampling.max_tokens - len(output) - 1)  # leaves room for the bonus
                start = time.perf_counter()
                draft_round = self.coordinator.propose(request_id, tokens[sent:], feedback, budget, sampling,
                                                       model_tokens=self._model_tokens if cutting else None)
                drafting_s = sum(p.draft_s for p in draft_round.proposals + draft_round.shadows)  # measured here
                draft_round = self._on_device(draft_round)
                self._time_drafting(draft_round)
                if cutting:
                    draft_round = self._pick(self._cut(draft_round), uncut=draft_round)
                draft_s = time.perf_counter() - start
                sent = len(tokens)
                start = time.perf_counter()
                emitted_ids, drafted, scores, branch, chain_size = self._verify(cache, tokens, draft_round, sampling, generator)
                verify_s = time.perf_counter() - start
                self._track_verify_cost(chain_size, verify_s)
                priced_s = self._priced_verify_s(chain_size, drafted + 1, verify_s)
                accepted = len(emitted_ids) - 1
                for proposal, (proposal_accepted, _) in zip(draft_round.proposals, scores):
                    self.draft_lengths.observe(proposal, proposal_accepted)
                own_s = [p.draft_s for p in draft_round.proposals + draft_round.shadows]  # each drafter's own time
                # what the round cost beyond drafting (selection, RPCs), shared by every draft in it
                overhead_s = max(0.0, draft_s - drafting_s)
                drafts = [self._feedback(p, *scores[i], p.draft_s + overhead_s, priced_s)
                          for i, p in enumerate(draft_round.proposals)]
                final = shadows.add([replace(s, draft_s=s.draft_s + overhead_s) for s in draft_round.shadows], len(tokens))
                final += shadows.observe(len(tokens), emitted_ids, self._branch_probs(branch, sampling))
                for score in final:  # a shadow teaches the draft lengths as a verified draft would
                    self.draft_lengths.observe(score.proposal, score.matched)
                drafts += [self._counterfactual(s) for s in final]
                # on a device its drafters draft in parallel, as actors on their own devices
                round_draft_s = draft_s if self.device is None else overhead_s + max(own_s, default=0.0)
                round_reward_ = cost_reward(accepted, round_draft_s, priced_s, self.plain_step_s, self.k)
                feedback = RoundFeedback(tuple(drafts), draft_round.width, round_reward_) if drafts else None
                before = len(output)
                emitted, finish = self._emit(output, emitted_ids, sampling)
                tokens.extend(emitted_ids)
                reward = max((f.reward for f in drafts if not f.counterfactual), default=0.0)
                rounds.append(RoundTrace(draft_round.label, drafted, accepted, emitted, reward, draft_s, verify_s,
                                         max(own_s, default=0.0), drafting_s))
                if on_tokens is not None and emitted:
                    on_tokens(output[before:])
        finally:
            committed = list(prompt_ids) + output
            last = tuple(self._counterfactual(s) for s in shadows.finish())
            if last:
                feedback = replace(feedback, drafts=feedback.drafts + last) if feedback else RoundFeedback(last, width=0)
            self.coordinator.finish(request_id, committed[sent:], feedback)
        text = self.target.decode(output)
        cuts = [cut for cut in (text.find(stop) for stop in sampling.stop) if cut >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
            while output and any(stop in self.target.decode(output[:-1]) for stop in sampling.stop):
                output.pop()  # token ids end with the token that completed the stop string
        return GenerationResult(text, output, finish, len(prompt_ids), rounds)

    def _forward_cost_s(self, n: int) -> float:
        """Seconds of a verification forward over n positions: the padded size's, for a one-draft
        forward; a larger tree on a device at the device's cost, here in proportion to the largest
        size measured."""
        if n <= self.max_positions:
            return self.verify_s_by_size[self.padded_size[n]]
        if self.device is not None:
            return self.device.forward_s(n)
        return self.verify_s_by_size[self.max_positions] * n / self.max_positions

    def _on_device(self, draft_round: DraftRound) -> DraftRound:
        """The round's drafts with each model drafter's drafting time as on the engine's device."""
        if self.draft_scale == 1.0:
            return draft_round
        model_free = self.coordinator.model_free

        def scaled(proposals: tuple[Proposal, ...]) -> tuple[Proposal, ...]:
            return tuple(p if p.drafter in model_free else replace(p, draft_s=p.draft_s * self.draft_scale) for p in proposals)

        return replace(draft_round, proposals=scaled(draft_round.proposals), shadows=scaled(draft_round.shadows))

    def _time_drafting(self, draft_round: DraftRound) -> None:
        """Running mean of each drafter's drafting seconds per drafted token."""
        for proposal in draft_round.proposals + draft_round.shadows:
            if proposal.token_ids:
                per_token_s = proposal.draft_s / len(proposal.token_ids)
                before = self.draft_s_per_token.get(proposal.drafter)
                self.draft_s_per_token[proposal.drafter] = per_token_s if before is None else 0.9 * before + 0.1 * per_token_s

    def _model_tokens(self, drafter: str, in_hand: Sequence[Proposal]) -> int:
        """How many tokens to ask a model drafter for, its drafting time counted: none when a draft
        in hand already promises more tokens per second (deploy/draft_length.py); k until its
        drafting has been timed."""
        per_token_s = self.draft_s_per_token.get(drafter)
        if per_token_s is None:
            return self.k
        floor = max((self.draft_lengths.rate(self.draft_lengths.cut(p)) for p in in_hand if p.token_ids), default=0.0)
        return self.draft_lengths.tokens_to_draft(drafter, per_token_s, self.k, floor)

    def _cut(self, draft_round: DraftRound) -> DraftRound:
        """Each draft (chosen or shadow) cut to the length worth verifying (deploy/draft_length.py)."""
        return replace(draft_round, proposals=tuple(self.draft_lengths.cut(p) for p in draft_round.proposals),
                       shadows=tuple(self.draft_lengths.cut(p) for p in draft_round.shadows))

    def _pick(self, draft_round: DraftRound, uncut: DraftRound | None = None) -> DraftRound:
        """A `pick_best` round of one chosen draft (or none: its model drafter sat the round out)
        and shadows, each cut (`uncut`: the same round before `_cut`): verify the draft with the
        highest expected rate (the chosen one, or a plain step, on a tie); the others become the
        round's shadows. `pick_set` widens it to a tree (`_widen`); `pick_nodes` instead cuts the
        tree of every uncut draft, the best first, node by node (DraftLengths.select_tree)."""
        if not draft_round.pick_best or len(draft_round.proposals) > 1 or not draft_round.shadows:
            return draft_round
        chosen = draft_round.proposals  # none when the chosen model drafter sat the round out
        rated = [(self.draft_lengths.rate(p), p) for p in (*chosen, *draft_round.shadows)]  # each draft rated once
        best_rate, best = max(rated[len(chosen):], key=lambda pair: pair[0])
        chosen_rate = rated[0][0] if chosen else self.draft_lengths.rate(PLAIN_DRAFT)
        if best_rate > chosen_rate:
            chosen, chosen_rate = (best,), best_rate
        if draft_round.pick_nodes and chosen and chosen[0].token_ids:
            return self._select_nodes(draft_round, uncut or draft_round, rated, chosen[0])
        if draft_round.pick_set and chosen and chosen[0].token_ids:
            chosen = self._widen(chosen[0], chosen_rate, [(r, p) for r, p in rated if p.token_ids and p is not chosen[0]])
        return replace(draft_round, proposals=chosen,
                       shadows=tuple(p for _, p in rated if not any(p is c for c in chosen)))

    def _select_nodes(self, draft_round: DraftRound, uncut: DraftRound, rated: list[tuple[float, Proposal]],
                      best: Proposal) -> DraftRound:
        """`pick_nodes`: the tree of every draft, uncut, the best rated first, then the others best
        rated first, cut node by node; the drafts left out become the round's shadows (as cut)."""
        whole = (*uncut.proposals, *uncut.shadows)
        first = next(i for i, (_, p) in enumerate(rated) if p is best)
        order = [first, *sorted((i for i, (_, p) in enumerate(rated) if i != first and whole[i].token_ids),
                                key=lambda i: -rated[i][0])]
        lengths = dict(zip(order, self.draft_lengths.select_tree([whole[i] for i in order])))
        return replace(draft_round, proposals=tuple(whole[i].cut(lengths[i]) for i in order if lengths[i]),
                       shadows=tuple(p for i, (_, p) in enumerate(rated) if not lengths.get(i)))

    def _widen(self, best: Proposal, best_rate: float, others: list[tuple[float, Proposal]]) -> tuple[Proposal, ...]:
        """`pick_set`: add the round's other drafts (with their rates), best rated first, while the
        tree they make with the drafts taken promises more tokens per second (deploy/draft_length.py
        `tree_rate`)."""
        taken, taken_rate = [best], best_rate
        for _, other in sorted(others, key=lambda pair: pair[0], reverse=True):
            with_it = self.draft_lengths.tree_rate([*taken, other])
            if with_it > taken_rate:
                taken, taken_rate = [*taken, other], with_it
        return tuple(taken)

    def _verify(
        self, cache: object, tokens: list[int], draft_round: DraftRound, sampling: SamplingParams, generator: torch.Generator
    ) -> tuple[tuple[int, ...], int, list[tuple[int, tuple[float, ...]]], tuple[torch.Tensor, list[int]], int]:
        """Verify the round's drafts in one target forward and keep the cache on the accepted path.

        -> (emitted tokens, positions verified, per proposal (its accepted tokens, its BD overlaps),
        (the forward's logits, the rows of the accepted branch) for counterfactual scoring,
        the forward's size when it verified one draft or none (0 for a tree)).
        """
        with_overlaps = self.reward_kind == BD
        distinct = list({p.token_ids: p for p in reversed(draft_round.proposals) if p.token_ids}.values())[::-1]
        if len(distinct) <= 1:
            draft, q = (distinct[0].token_ids, distinct[0].q) if distinct else ((), None)
            positions = [tokens[-1], *draft]
            if draft:  # extra positions only change speed; their K/V is cropped
                positions += [draft[-1]] * (self.padded_size[len(positions)] - len(positions))
            # every padded row's logits: the size was chosen by the cost of exactly that (see padded_length)
            logits = self.target.forward(cache, positions)[: len(draft) + 1]  # [d+1, V]
            result = verify(draft, q, logits, sampling, generator, with_overlaps=with_overlaps)
            self.target.crop(cache, len(tokens) + result.accepted)
            p = warp_probs(logits[: len(draft)], sampling) if with_overlaps and len(draft_round.proposals) > 1 else None
            scores = [
                (0, ()) if not proposal.token_ids
                else (result.accepted, result.overlaps if proposal.q is q or p is None else draft_overlaps(draft, proposal.q, p))
                for proposal in draft_round.proposals
            ]
            return result.token_ids, len(draft), scores, (logits, list(range(result.accepted + 1))), len(positions)
        drafts = [p.token_ids for p in distinct]
        tree = DraftTree.build(drafts)
        positions = [tokens[-1], *tree.tokens]
        parents = [-1] + [0 if parent == ROOT else 1 + parent for parent in tree.parents]
        if len(positions) < len(self.padded_size):  # padding attends to the prefix only; cropped below
            padding = self.padded_size[len(positions)] - len(positions)
            positions, parents = positions + [tree.tokens[-1]] * padding, parents + [-1] * padding
        logits = self.target.forward(cache, positions, parents=parents)[: 1 + tree.size]  # [1+n, V]
        result = verify_tree(tree, [p.q for p in distinct], drafts, logits, sampling, generator)
        self.target.keep(cache, len(tokens), [len(tokens) + node for node in result.nodes])
        p = warp_probs(logits, sampling) if with_overlaps else None  # [1+n, V]
        index = {proposal.token_ids: i for i, proposal in enumerate(distinct)}
        scores = [
            per_draft_outcome(tree, index[proposal.token_ids], proposal.token_ids, proposal.q, p, result)
            if proposal.token_ids else (0, ())
            for proposal in draft_round.proposals
        ]
        return result.token_ids, tree.size, scores, (logits, [0] + [1 + node for node in result.nodes]), 0

    def _feedback(self, proposal: Proposal, accepted: int, overlaps: Sequence[float], draft_s: float, verify_s: float,
                  counterfactual: bool = False) -> Feedback:
        reward = round_reward(
            self.reward_kind, accepted=accepted, drafted=len(proposal.token_ids), overlaps=overlaps,
            draft_s=draft_s, verify_s=verify_s, plain_step_s=self.plain_step_s, k=self.k,
        )
        # the cost reward is a rate: weighed by the round's duration, an arm's mean is its throughput
        weight = (draft_s + verify_s) / self.plain_step_s if self.reward_kind == COST and self.plain_step_s else 1.0
        return Feedback(proposal.drafter, len(proposal.token_ids), accepted, reward, counterfactual, weight)

    def _counterfactual(self, shadow: ShadowScore) -> Feedback:
        """A shadow draft's feedback: its matched tokens as accepted; the cost reward prices it as
        if verified (its drafting time plus its round's overhead, a verification of its size)."""
        proposal, drafted = shadow.proposal, len(shadow.proposal.token_ids)
        overlaps = tuple(shadow.overlaps)
        if overlaps and shadow.matched < len(overlaps):  # a mismatch: the positions after it count 0
            overlaps += (0.0,) * (drafted - len(overlaps))
        verify_s = self.verify_s_by_size[self.padded_size[drafted + 1]]
        return self._feedback(proposal, shadow.matched, overlaps, proposal.draft_s, verify_s, counterfactual=True)

    @staticmethod
    def _branch_probs(branch: tuple[torch.Tensor, list[int]], sampling: SamplingParams):
        """i -> the target's warped distribution for the round's i-th committed token (computed
        when a shadow asks)."""
        logits, rows = branch
        return lambda i: warp_probs(logits[rows[i]], sampling)

    @property
    def plain_step_s(self) -> float:
        """Seconds of a plain target step (0 for a plain-decoding-only engine)."""
        return self.verify_s_by_size[1]

    def _priced_verify_s(self, chain_size: int, positions: int, verify_s: float) -> float:
        """What a verification is charged in rewards: the running mean for its forward size, the
        price a shadow draft of that size is charged too, so one slow forward (the machine's noise,
        not the drafter's doing) does not sink the arm that happened to be pulled; a tree's
        forward (no running mean) is charged as measured. On a device: its cost for the positions."""
        if self.device is not None:
            return self.device.forward_s(positions)
        return self.verify_s_by_size[chain_size] if chain_size and self.verify_s_by_size[chain_size] else verify_s

    def _track_verify_cost(self, chain_size: int, verify_s: float) -> None:
        """Running mean of the verification time of a one-draft (or plain) forward of that size."""
        if chain_size and self.verify_s_by_size[chain_size] and self.device is None:
            self.verify_s_by_size[chain_size] = 0.9 * self.verify_s_by_size[chain_size] + 0.1 * verify_s

    def _emit(self, output: list[int], new_tokens: Sequence[int], sampling: SamplingParams) -> tuple[int, str | None]:
        """Append a round's tokens to the output, honouring EOS, max_tokens and stop strings."""
        before = len(output)
        for token in new_tokens:
            if token in self.target.eos_ids:
                return len(output) - before, "stop"
            output.append(token)
            if len(output) >= sampling.max_tokens:
                return len(output) - before, "length"
        if sampling.stop:
            tail = self.target.decode(output[-(len(new_tokens) + 16) :])
            if any(stop in tail for stop in sampling.stop):
                return len(output) - before, "stop"
        return len(output) - before, None
