"""Faster float32 linear layers for the few-row products of decoding on CPU.

Decoding multiplies every weight by 1 to ~8 rows (a plain step, a drafted token, a verification).
On some CPUs the BLAS's path for that is far below memory bandwidth: on the 2-core AMD EPYC of
this project's CI (MKL 2024.2), `F.linear` on SmolLM2's 49152x576 vocabulary projection takes
9.6 ms for one row (gemv) and 21 ms for two, while the same product with the weight as the left
operand, `W @ x.T`, takes 5.2 ms for two rows. `SmallRowsLinear` computes `(W @ x.T).T` for 2 to
`MAX_ROWS` rows and pads a single row to two (gemv is the slowest path); more rows (a prefill,
a training batch) go to `F.linear` unchanged.

`install(model)` turns every `nn.Linear` of a float32 CPU model into a `SmallRowsLinear` (a class
swap: the weights, state dict, ties and saving are untouched) when a measurement at load time on
the model's largest projection shows the product faster, so CPUs whose BLAS is already fast keep
`F.linear`. `SPECFLEET_CPU_LINEAR=on|off` skips the measurement. Results equal `F.linear`'s up
to float rounding (another summation order): the target's own decoding and its verification both
run through it, so outputs stay lossless with respect to the target as served.
"""
from __future__ import annotations

import os
import time

import torch

MAX_ROWS = 8  # above this (prefill) F.linear's large-M GEMM is the better path
ENV = "SPECFLEET_CPU_LINEAR"


def small_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as (weight @ x.T).T when x has 1..MAX_ROWS rows."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    if not 1 <= count <= MAX_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    if count == 1:
        out = torch.mm(weight, torch.cat([rows, rows]).t())[:, :1]
    else:
        out = torch.mm(weight, rows.t())
    out = out.t().contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class SmallRowsLinear(torch.nn.Linear):
    """An nn.Linear whose forward takes `small_rows_linear` (installed by class swap)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return small_rows_linear(x, self.weight, self.bias)


def _best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def is_faster(weight: torch.Tensor, rows: tuple[int, ...] = (1, 4)) -> bool:
    """Whether small_rows_linear beats F.linear on `weight` at these row counts (summed best times)."""
    with torch.inference_mode():
        inputs = [torch.randn(n, weight.shape[1], dtype=weight.dtype) for n in rows]
        plain = sum(_best_of(lambda x=x: torch.nn.functional.linear(x, weight)) for x in inputs)
        small = sum(_best_of(lambda x=x: small_rows_linear(x, weight)) for x in inputs)
    return small < plain


def install(model: torch.nn.Module) -> int:
    """Swap SmallRowsLinear in for the model's nn.Linear layers if it pays here. -> layers swapped."""
    choice = os.environ.get(ENV, "auto").lower()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if choice == "off" or not linears:
        return 0
    if any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in linears):
        return 0
    if choice != "on" and not is_faster(max((m.weight for m in linears), key=torch.Tensor.numel)):
        return 0
    for module in linears:
        module.__class__ = SmallRowsLinear
    return len(linears)
