"""A task corpus from the target itself: its greedy answers to the task's training prompts.

`target_outputs(target, prompts, max_new_tokens, batch_size)` runs the target's own `generate`
over left-padded batches (several prompts a forward: a corpus of ~20k tokens takes minutes on
two CPU cores) and returns one `Example` (prompt ids, output ids up to its first EOS) per
prompt. The prompts are encoded exactly as the engine encodes chat requests (TargetModel.encode).
A corpus is saved and read as token ids by actors/task_corpus.py (where `Example` lives).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.task_corpus import Example
from deploy.engine.target import TargetModel


@torch.inference_mode()
def target_outputs(
    target: TargetModel, prompts: Sequence[Sequence[dict]], max_new_tokens: int = 128, batch_size: int = 16,
    progress: bool = False,
) -> list[Example]:
    from tqdm import tqdm

    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(target.eos_ids)
    encoded = [target.encode(messages=messages) for messages in prompts]
    examples: list[Example] = []
    for start in tqdm(range(0, len(encoded), batch_size), desc="target outputs", disable=not progress):
        batch = encoded[start : start + batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=target.device)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=target.device)
        out = target.model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=pad)
        for ids, row in zip(batch, out[:, width:].tolist()):
            end = next((i for i, t in enumerate(row) if t in target.eos_ids), len(row))
            examples.append(Example(tuple(ids), tuple(row[:end])))
    return examples
