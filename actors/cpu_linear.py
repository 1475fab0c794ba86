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

Products of 3 rows or more (verification forwards, prefills) go further where oneDNN is
available: the weight is reordered once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`,
the prepacking PyTorch's own CPU compiler uses) and multiplied with `mkldnn._linear_pointwise`.
Here that makes a target forward over 8 positions cost about 1.3-1.5 plain steps instead of 1.9,
so longer drafts pay, and a 256-row product with the vocabulary projection 1.7x faster. The packed
copy (one more copy of the weights in memory) is made on first use and held in a `PackedWeight`
slot that copies and pickles leave empty (an opaque oneDNN tensor cannot be copied; state dicts
never see it); it is remade when the weight is replaced or its version counter moves (an
optimizer step, load_state_dict). With autograd on, the product stays unpacked. `install` turns
it on when it beats the unpacked product at load time.
"""
from __future__ import annotations

import os
import time

import torch

MAX_ROWS = 8  # above this (prefill) F.linear's large-M GEMM is the better path
PACKED_MIN_ROWS = 3  # products of this many rows or more take the prepacked oneDNN product (when installed)
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


def packed_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout for products of a few rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_MIN_ROWS + 1)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for `packed = pack_weight(weight)` (no autograd)."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


class PackedWeight:
    """One layer's packed weight and the (weight, version) it was packed from. Copies and pickles
    start empty: the packed tensor is opaque, and the copy packs its own weight on first use."""

    __slots__ = ("source", "tensor")

    def __init__(self) -> None:
        self.source: tuple[torch.Tensor, int] | None = None
        self.tensor: torch.Tensor | None = None

    def __deepcopy__(self, memo: dict) -> "PackedWeight":
        return PackedWeight()

    def __reduce__(self) -> tuple:
        return PackedWeight, ()


class SmallRowsLinear(torch.nn.Linear):
    """An nn.Linear whose forward takes `small_rows_linear` (installed by class swap), or the
    prepacked product for PACKED_MIN_ROWS rows or more when it has a `packed` slot."""

    packed: PackedWeight | None = None  # set per module by install when the packed product pays

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.numel() >= PACKED_MIN_ROWS * x.shape[-1] and not torch.is_grad_enabled():
            return packed_linear(x, self._packed_weight(), self.bias)
        return small_rows_linear(x, self.weight, self.bias)

    def _packed_weight(self) -> torch.Tensor:
        weight = self.weight
        # inference tensors (made under inference mode) keep no version: never updated by training
        source = (weight, -1 if weight.is_inference() else weight._version)
        packed = self.packed
        if packed.source is None or packed.source[0] is not weight or packed.source[1] != source[1]:
            packed.source, packed.tensor = source, pack_weight(weight)
        return packed.tensor


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


def packed_is_faster(weight: torch.Tensor, rows: tuple[int, ...] = (4, 8)) -> bool:
    """Whether the prepacked product beats small_rows_linear on `weight` at these row counts."""
    if not packed_available():
        return False
    with torch.inference_mode():
        try:
            packed = pack_weight(weight)
        except RuntimeError:
            return False
        inputs = [torch.randn(n, weight.shape[1], dtype=weight.dtype) for n in rows]
        small = sum(_best_of(lambda x=x: small_rows_linear(x, weight)) for x in inputs)
        prepacked = sum(_best_of(lambda x=x: packed_linear(x, packed)) for x in inputs)
    return prepacked < small


def install(model: torch.nn.Module) -> int:
    """Swap SmallRowsLinear in for the model's nn.Linear layers if it pays here, with the prepacked
    product for verification-sized inputs if that pays too. -> layers swapped."""
    choice = os.environ.get(ENV, "auto").lower()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if choice == "off" or not linears:
        return 0
    if any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in linears):
        return 0
    largest = max((m.weight for m in linears), key=torch.Tensor.numel)
    if choice != "on" and not is_faster(largest):
        return 0
    use_packed = packed_available() if choice == "on" else packed_is_faster(largest)
    for module in linears:
        module.__class__ = SmallRowsLinear
        module.packed = PackedWeight() if use_packed else None
    return len(linears)
