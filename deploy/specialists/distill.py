"""Self-distillation of a task drafter from the target (sequence-level KD, as in MetaSD's drafters).

`distill(base, examples, ...)` starts from the target's own first decoder layers, final norm and
embeddings (`base`, frozen), adds a head over the tokens the corpus's outputs use (initialised
from the tied embedding rows), and trains, with AdamW on the target's greedy outputs
(cross-entropy of each output token given the prompt and the output so far): a rank-`rank` LoRA
delta on every projection of those layers (peft's adapters, scale 1), the norms and the head.
So the drafter is the target's layers plus what it learned, small enough to ship
(actors/distilled.py saves it as that difference). A tenth of the examples is held out; the
result reports the loss of the first and last epochs and the held-out top-1 agreement with the
target (a proxy for its acceptance).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from actors.distilled import ReducedHeadLM
from actors.task_corpus import Example
from deploy.specialists.training import train as train_epochs

IGNORE = -100
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # what the deltas adapt
RANK = 32  # of each projection's delta (docs/experiments.md, "Specialists that ship")


@dataclass(frozen=True)
class DistillReport:
    num_layers: int
    rank: int
    head_size: int
    steps: int
    examples: int
    first_epoch_loss: float
    last_epoch_loss: float
    heldout_agreement: float
    train_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def head_vocabulary(examples: Sequence[Example], eos_ids: Sequence[int]) -> torch.Tensor:
    """The distinct tokens of the outputs (and EOS), most frequent first."""
    counts: dict[int, int] = {}
    for example in examples:
        for token in example.output_ids:
            counts[token] = counts.get(token, 0) + 1
    for token in eos_ids:
        counts.setdefault(int(token), 0)
    return torch.tensor(sorted(counts, key=lambda t: -counts[t]), dtype=torch.long)


def _batch(examples: Sequence[Example], to_head: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> input ids, attention mask, labels (head indices of output tokens, IGNORE elsewhere), right-padded."""
    width = max(len(e.token_ids) for e in examples) - 1
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, example in enumerate(examples):
        seq = torch.tensor(example.token_ids, dtype=torch.long)
        n = seq.shape[0] - 1
        ids[row, :n], mask[row, :n] = seq[:-1], 1
        first_output = max(len(example.prompt_ids) - 1, 0)  # position whose next token is the first output token (the second of a text)
        labels[row, first_output:n] = to_head[seq[first_output + 1 :]]
    return ids, mask, labels


def _loss(model: ReducedHeadLM, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int, int]:
    ids, mask, labels = batch
    logits = model.head_logits(ids, attention_mask=mask)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    counted = labels != IGNORE
    agree = int(((logits.argmax(-1) == labels) & counted).sum())
    return loss, agree, int(counted.sum())


def distill(
    base: torch.nn.Module,
    examples: Sequence[Example],
    eos_ids: Sequence[int],
    pad_id: int,
    epochs: int = 8,
    batch_size: int = 8,
    lr: float = 5e-3,
    rank: int = RANK,
    seed: int = 0,
    log=None,
) -> tuple[ReducedHeadLM, DistillReport, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """base: the target's model already truncated to the drafter's layers (adapters are added to it).
    -> the drafter, its report, and each projection's delta (delta_a [r, in], delta_b [out, r]) by module name."""
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    start = time.perf_counter()
    torch.manual_seed(seed)
    base.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(PROJECTIONS), lora_dropout=0.0), base)
    for name, param in base.named_parameters():
        param.requires_grad_("lora_" in name or name.endswith("norm.weight"))
    examples = [e for e in examples if e.output_ids]
    rng = random.Random(seed)
    shuffled = rng.sample(examples, len(examples))
    heldout, train = shuffled[: max(1, len(shuffled) // 10)], shuffled[max(1, len(shuffled) // 10) :]
    head_ids = head_vocabulary(train, eos_ids)
    embedding = base.get_input_embeddings().weight  # tied to the base's full head: frozen, shared with the input side
    model = ReducedHeadLM(base, head_ids, embedding.detach()[head_ids].clone())
    to_head = torch.full((embedding.shape[0],), IGNORE, dtype=torch.long)
    to_head[head_ids] = torch.arange(head_ids.shape[0])
    params = [p for p in model.parameters() if p.requires_grad]
    steps_per_epoch = math.ceil(len(train) / batch_size)
    model.train()

    def epoch_batches():
        order = rng.sample(train, len(train))
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]

    epoch_losses = train_epochs(params, epochs, steps_per_epoch, epoch_batches,
                                lambda batch: _loss(model, _batch(batch, to_head, pad_id))[0], lr, warmup=10, log=log)
    total = epochs * steps_per_epoch
    model.eval()
    with torch.no_grad():
        agree = counted = 0
        for i in range(0, len(heldout), batch_size):
            _, a, c = _loss(model, _batch(heldout[i : i + batch_size], to_head, pad_id))
            agree, counted = agree + a, counted + c
    for p in params:
        p.requires_grad_(False)
    adapters = get_peft_model_state_dict(base)  # <module>.lora_A.weight [r, in], <module>.lora_B.weight [out, r]
    deltas = {key.removesuffix(".lora_A.weight"): (a, adapters[key.replace(".lora_A.", ".lora_B.")])
              for key, a in adapters.items() if key.endswith(".lora_A.weight")}
    report = DistillReport(
        num_layers=int(base.config.num_hidden_layers), rank=rank, head_size=int(head_ids.shape[0]), steps=total, examples=len(train),
        first_epoch_loss=round(epoch_losses[0], 4), last_epoch_loss=round(epoch_losses[-1], 4),
        heldout_agreement=round(agree / max(counted, 1), 4), train_s=round(time.perf_counter() - start, 1),
    )
    return model, report, deltas
