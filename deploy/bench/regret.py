"""Regret of a drafter-choosing policy against the best fixed arm of each request (the bandit
literature's check), from one bench report's rows.

`request_regret(policy, arms)`: `policy` is a bench row with `samples` and `prompt_rounds`
({prompt id: {drafter: rounds}}); `arms` maps each arm's drafter name to the row that used only it
(`single:<drafter>`; plain decoding, `ar`, is the arm `none` when no `single:none` ran). For
each prompt, the best fixed arm is the arm whose row generated it in the fewest seconds (every
row generates the same tokens: the bench checks it). Returns

    seconds_lost_share   sum over prompts of (policy's seconds - the best arm's seconds), over
                         the policy's seconds: the share of its time a per-request oracle saves
    vs_request_oracle    the best arms' seconds over the policy's (<= 1 unless the policy beat
                         every fixed arm on some prompts)
    rounds_off_best      the share of the policy's rounds spent on another arm than the prompt's
                         best (exploration and mistakes together)
    rounds_dominated     the share of its rounds spent on an arm that, used alone, was slower on
                         that prompt than plain decoding (`none`): rounds drafting did not pay
    prompts              how many prompts were scored

A round on several drafters at once (a `tree` round, named `a+b`) or on an arm no row used alone
counts as off the best arm and is not rated as dominated. The best arm is picked on the same
timings it is scored on, so noise makes the oracle look better than it is: the regret is an upper
estimate (docs/benchmarks.md, "Regret").
"""
from __future__ import annotations

from collections.abc import Mapping

from actors.no_draft import NO_DRAFT


def _seconds_by_prompt(row: dict) -> dict[str, float]:
    return {sample[0]: sample[3] for sample in row["samples"]}


def request_regret(policy: dict, arms: Mapping[str, dict]) -> dict | None:
    """-> the regret figures above, or None when no prompt has a time for the policy and every arm."""
    arm_seconds = {arm: _seconds_by_prompt(row) for arm, row in arms.items()}
    policy_seconds = _seconds_by_prompt(policy)
    plain = arm_seconds.get(NO_DRAFT, {})
    spent = best_spent = 0.0
    rounds = off_best = dominated = scored = 0
    for prompt, seconds in policy_seconds.items():
        times = {arm: by_prompt[prompt] for arm, by_prompt in arm_seconds.items() if prompt in by_prompt}
        if len(times) < len(arm_seconds) or not times:
            continue
        best = min(times, key=times.get)
        spent, best_spent, scored = spent + seconds, best_spent + times[best], scored + 1
        for arm, count in policy["prompt_rounds"].get(prompt, {}).items():
            rounds += count
            off_best += count if arm != best else 0
            if arm in times and prompt in plain and times[arm] > plain[prompt]:
                dominated += count
    if not scored or not spent:
        return None
    return {
        "seconds_lost_share": round((spent - best_spent) / spent, 4),
        "vs_request_oracle": round(best_spent / spent, 4),
        "rounds_off_best": round(off_best / rounds, 4) if rounds else None,
        "rounds_dominated": round(dominated / rounds, 4) if rounds else None,
        "prompts": scored,
    }
