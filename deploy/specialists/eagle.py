"""Train an EAGLE-style head (actors/eagle_head.py) from the target itself: `specfleet train-eagle`.

`train_eagle(target, examples, ...)`:
1. the head's vocabulary: the distinct tokens of the corpus's answers (and EOS), most frequent first;
2. features: one target forward per batch of examples (prompt + the target's own greedy answer,
   the specialists' corpus) gives every position's top-layer feature f_t (post-norm last
   hidden state), kept in float16;
3. training (AdamW, warm-up then linear decay): at every pair t the head sees (f_t + noise,
   x_{t+1}) and predicts f_{t+1}; the loss is EAGLE's, a smooth-L1 regression on the feature
   plus `CLS_WEIGHT` times the cross-entropy of its token distribution against the target's own
   (both through the target's output rows over the head's vocabulary). The noise (Gaussian,
   `noise` times the features' standard deviation) stands in for the head's own errors, and so
   does unrolling (`UNROLL` steps, EAGLE-3's training-time test in short): step j reads, in
   place of each target feature, the head's own prediction of it from step j - 1, as when it
   drafts j tokens ahead.
A share of the examples (`heldout`, a tenth by default) is held out: the report gives the first and last epochs' losses, the
held-out top-1 agreement with the target at the answers' positions (the first drafted token,
from true features, and the second, from the head's own first prediction) and the times of the
feature pass and of training. `build_eagle` trains the generic
head on the specialists' task corpora (the target's answers to deploy/prompts/train/) and saves it
where the `eagle` drafter finds it (actors/eagle_head.eagle_dir).
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from actors.eagle_head import EagleHead
from deploy.spec.target import TargetModel
from deploy.specialists.corpus import Example
from deploy.specialists.distill import head_vocabulary
from deploy.specialists.training import train as train_epochs

CLS_WEIGHT = 1.0  # the token loss's weight beside the feature regression (EAGLE's 0.1 measured worse here)
UNROLL = 3  # drafting steps trained (step j reads the head's own step j - 1 predictions)
FEATURE_BATCH_TOKENS = 4096  # padded positions per target forward of the feature pass
TRAIN_BATCH_TOKENS = 1024  # padded positions per training step


@dataclass(frozen=True)
class EagleReport:
    examples: int
    positions: int
    head_size: int
    epochs: int
    steps: int
    first_epoch_loss: float
    last_epoch_loss: float
    heldout_agreement: float
    heldout_agreement_second: float  # the second drafted token's, from the head's own first prediction
    features_s: float
    train_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Sequence:
    token_ids: torch.Tensor  # [L]
    features: torch.Tensor  # [L, H] float16
    first_output: int  # index of the first answer token
    index: int = 0  # its example's index


def _batches(items: Sequence[_Sequence], rng: random.Random | None, budget: int = TRAIN_BATCH_TOKENS) -> list[list[_Sequence]]:
    """Sequences of similar length together, at most `budget` padded positions a batch (shuffled when rng)."""
    ordered = sorted(items, key=lambda s: len(s.token_ids))
    batches, current = [], []
    for item in ordered:
        if current and len(item.token_ids) * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


@torch.inference_mode()
def target_features(target: TargetModel, examples: Sequence[Example], progress: bool = False) -> list[_Sequence]:
    """Every position's top-layer feature of each example (prompt + answer), one forward a batch;
    in the examples' order."""
    from tqdm import tqdm

    pad = min(target.eos_ids)
    items = [_Sequence(torch.tensor(e.token_ids), torch.empty(0), len(e.prompt_ids), i) for i, e in enumerate(examples)]
    out: list[_Sequence | None] = [None] * len(items)
    for batch in tqdm(_batches(items, None, FEATURE_BATCH_TOKENS), desc="target features", disable=not progress):
        width = max(len(s.token_ids) for s in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, : len(s.token_ids)], mask[row, : len(s.token_ids)] = s.token_ids, 1
        hidden = target.model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device)).last_hidden_state
        for row, s in enumerate(batch):
            out[s.index] = _Sequence(s.token_ids, hidden[row, : len(s.token_ids)].to(torch.float16).cpu(), s.first_output,
                                     s.index)
    return out


def _pairs(batch: Sequence[_Sequence], device: torch.device) -> tuple[torch.Tensor, ...]:
    """-> next tokens [B, n], features [B, n, H], target features [B, n, H], mask [B, n], answer mask [B, n]
    (right-padded; n = longest length - 1)."""
    width = max(len(s.token_ids) for s in batch) - 1
    hidden = batch[0].features.shape[1]
    tokens = torch.zeros((len(batch), width), dtype=torch.long)
    inputs = torch.zeros((len(batch), width, hidden))
    targets = torch.zeros((len(batch), width, hidden))
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    answer = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, s in enumerate(batch):
        n = len(s.token_ids) - 1
        tokens[row, :n] = s.token_ids[1:]
        inputs[row, :n] = s.features[:-1].float()
        targets[row, :n] = s.features[1:].float()
        mask[row, :n] = 1
        answer[row, max(0, s.first_output - 1) : n] = True  # pairs whose prediction is an answer token's successor
    return tuple(t.to(device) for t in (tokens, inputs, targets, mask, answer))


def _loss(head: EagleHead, batch: Sequence[_Sequence], noise_std: float, device: torch.device,
          cls_weight: float = CLS_WEIGHT, unroll: int = 1) -> tuple[torch.Tensor, list[int], int]:
    """-> (loss, per step: answer positions where the head's top token is the target's, answer positions).
    Step 1 reads the target's features; step j > 1 reads the head's own predictions of step j - 1
    (each pair's feature is then the head's prediction of it, as when it drafts j tokens ahead)."""
    tokens, inputs, targets, mask, answer = _pairs(batch, device)
    valid = mask.bool()
    counted = answer[valid]
    with torch.no_grad():
        target_probs = torch.softmax(head.logits(targets[valid]), dim=-1)
        target_top = target_probs.argmax(-1)
    if noise_std:
        inputs = inputs + noise_std * torch.randn_like(inputs)
    loss, agree = 0.0, []
    for step in range(unroll):
        predicted = head.features(tokens, inputs, attention_mask=mask)
        regression = torch.nn.functional.smooth_l1_loss(predicted[valid], targets[valid])
        logits = head.logits(predicted[valid])
        token_loss = -(target_probs * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        loss = loss + regression + cls_weight * token_loss
        agree.append(int(((logits.argmax(-1) == target_top) & counted).sum()))
        # the next step's pair t reads the prediction of f_t made at pair t - 1 (pair 0 keeps the target's)
        inputs = torch.cat([inputs[:, :1], predicted[:, :-1]], dim=1)
    return loss / unroll, agree, int(counted.sum())


def train_eagle(
    target: TargetModel,
    examples: Sequence[Example],
    epochs: int = 10,
    lr: float = 3e-3,
    noise: float = 0.2,
    heldout: float = 0.1,
    cls_weight: float = CLS_WEIGHT,
    unroll: int = UNROLL,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> tuple[EagleHead, EagleReport]:
    start = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    examples = [e for e in examples if e.output_ids]
    shuffled = rng.sample(examples, len(examples))
    cut = max(1, int(len(shuffled) * heldout)) if heldout > 0 else 0
    head_ids = head_vocabulary(shuffled[cut:], sorted(target.eos_ids))
    sequences = target_features(target, shuffled, progress)
    heldout, train = sequences[:cut], sequences[cut:]
    features_s = time.perf_counter() - start
    noise_std = noise * float(torch.cat([s.features[:64].float() for s in train[:64]]).std())
    head = EagleHead.from_target(target.model, head_ids).to(target.device)
    params = [p for p in head.parameters() if p.requires_grad]
    steps_per_epoch = len(_batches(train, None))
    train_start = time.perf_counter()
    head.train()
    epoch_losses = train_epochs(params, epochs, steps_per_epoch, lambda: _batches(train, rng),
                                lambda batch: _loss(head, batch, noise_std, target.device, cls_weight, unroll)[0],
                                lr, warmup=20, log=log)
    total = epochs * steps_per_epoch
    head.eval()
    agree, counted = [0, 0], 0
    with torch.no_grad():
        for batch in _batches(heldout, None):
            _, a, c = _loss(head, batch, 0.0, target.device, cls_weight, unroll=2)
            agree, counted = [x + y for x, y in zip(agree, a)], counted + c
    report = EagleReport(len(examples), sum(len(s.token_ids) for s in train), int(head_ids.shape[0]), epochs, total,
                         epoch_losses[0] if epoch_losses else math.nan, epoch_losses[-1] if epoch_losses else math.nan,
                         agree[0] / counted if counted else 0.0, agree[1] / counted if counted else 0.0, round(features_s, 1),
                         round(time.perf_counter() - train_start, 1))
    return head, report


def build_eagle(target: TargetModel, tasks: Sequence[str], out_dir: Path, epochs: int = 10, max_new_tokens: int = 128,
                documents: int = 160, prompt_files: Sequence[Path] = (), progress: bool = True) -> dict:
    """The generic head for `target`, saved at `out_dir`, trained on: the specialists' task corpora
    (the target's answers to deploy/prompts/train/<task>.jsonl, built and cached under
    actors/specialists.specialists_root() when missing), `documents` document tasks the target
    writes itself (deploy/specialists/documents.py; cached beside the head's directory), and the
    target's answers to the prompts of `prompt_files` (a user's own traffic, JSONL as the bench's).
    -> its meta (the report, the corpus time, what it was trained on, the target)."""
    from actors.specialists import specialists_root
    from deploy.bench.prompts import load_prompts
    from deploy.specialists.build import CORPUS_FILE, TRAIN_PROMPTS, corpus_for
    from deploy.specialists.corpus import load_examples, save_examples, target_outputs
    from deploy.specialists.documents import document_examples

    log = print if progress else None
    started = time.perf_counter()
    examples: list[Example] = []
    for task in tasks:
        examples += corpus_for(target, TRAIN_PROMPTS / f"{task}.jsonl", specialists_root() / task / CORPUS_FILE,
                               max_new_tokens, progress)
    if documents:
        path = out_dir.parent / "corpora" / f"documents-{documents}.jsonl"
        if not path.is_file():
            save_examples(document_examples(target, documents, max_new_tokens, progress=progress), path)
        examples += load_examples(path)
    for prompt_file in prompt_files:
        prompts = [p.messages if p.messages else [{"role": "user", "content": p.prompt}] for p in load_prompts(prompt_file)]
        examples += target_outputs(target, prompts, max_new_tokens, progress=progress)
    corpus_s = time.perf_counter() - started
    head, report = train_eagle(target, examples, epochs=epochs, log=log, progress=progress)
    meta = report.to_dict() | {"target": target.name, "tasks": list(tasks), "documents": documents,
                               "prompt_files": [str(p) for p in prompt_files], "corpus_s": round(corpus_s, 1),
                               "build_s": round(time.perf_counter() - started, 1)}
    head.save(out_dir, meta)
    return meta
