"""The training loop the drafters built here share (distilled drafters, eagle heads).

`train(params, epochs, epoch_batches, loss_of, lr, warmup)` runs `epochs` passes: each takes its
batches from `epoch_batches()` (called once per epoch, so it may shuffle) and makes one AdamW
step (no weight decay, gradients clipped to norm 1) per batch on `loss_of(batch)`, the learning
rate warming up over `warmup` steps and then decaying linearly to zero at the last step.
-> the mean loss of each epoch.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch

Batch = TypeVar("Batch")


def train(params: Sequence[torch.nn.Parameter], epochs: int, steps_per_epoch: int,
          epoch_batches: Callable[[], Iterable[Batch]], loss_of: Callable[[Batch], torch.Tensor], lr: float,
          warmup: int, log: Callable[[str], None] | None = None) -> list[float]:
    total = max(1, epochs * steps_per_epoch)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * (1 - step / total))
    epoch_losses: list[float] = []
    start = time.perf_counter()
    for epoch in range(epochs):
        losses = []
        for batch in epoch_batches():
            loss = loss_of(batch)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        epoch_losses.append(sum(losses) / len(losses))
        if log:
            log(f"epoch {epoch + 1}/{epochs}: loss {epoch_losses[-1]:.4f} ({time.perf_counter() - start:.0f} s)")
    return epoch_losses
