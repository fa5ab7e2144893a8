"""What every launch of one call of the Triton steps shares (:mod:`rnnkit.bptt.gpu_steps`,
forward and backward: :mod:`rnnkit.bptt.gpu_steps_backward`): the kernels module, imported
on first use (``import rnnkit`` never imports triton), the grid over the ``B·H`` elements
of a step, the mask and reset flags in the int8 layout the kernels read, and the
regularizers' tensors, passed to each kernel as the keyword arguments it takes.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rnnkit.bptt.unrolled import differentiable_gradients
from rnnkit.cells.kernel import Weights
from rnnkit.errors import ConfigError

# Nothing public: the Triton steps start at rnnkit.bptt.gpu_steps.run_steps.
__all__: list[str] = []

#: The simple cell's nonlinearities as the kernels number them (``ACT``).
ACTIVATIONS = {"tanh": 0, "relu": 1, "sigmoid": 2}
_KERNELS = "rnnkit.bptt.triton_kernels"


class Reg(NamedTuple):
    """Recurrent dropout's mask and zoneout's keep factors (:mod:`rnnkit.bptt.regularized`),
    in the steps' dtype, or None; ``cn`` the cell's own new states the backward reads under
    zoneout (the LSTM's ``c̃``, the simple cell's ``h̃``), ``(T, B, H)``, contiguous."""

    rm: Tensor | None = None  # (B, H) on h_{t-1} in the recurrent product, contiguous
    kh: Tensor | None = None  # (T, B, H) zoneout's keep factor of h, strided (keep_views)
    kc: Tensor | None = None  # (T, B, H) that of c (the LSTM), kh's strides
    cn: Tensor | None = None


class Launch(NamedTuple):
    """What every launch of one call shares: the kernels module, the grid and the flags."""

    k: Any  # rnnkit.bptt.triton_kernels
    grid: tuple[int]
    block: int
    mask: Tensor  # (T, B) int8, or a stand-in when there is none
    reset: Tensor  # (T + 1, B) int8, or a stand-in
    has_mask: bool
    has_reset: bool
    reg: Reg

    def kw(self, fn: Any, **extra: Any) -> dict[str, Any]:
        """The keyword arguments ``fn`` takes of the options, the flags, the regularizers'
        tensors (a stand-in where absent) and ``extra``."""
        r, like = self.reg, self.mask
        zoned = r.kh if r.kh is not None else r.kc
        every = {
            # FMA contraction as cuBLAS and cuDNN have it, asked for explicitly: triton
            # 3.9 warns once where it is left to its default
            "BLOCK": self.block,
            "enable_fp_fusion": True,
            "HAS_MASK": self.has_mask,
            "HAS_RESET": self.has_reset,
            "RMASK": r.rm is not None,
            "ZH": r.kh is not None,
            "ZC": r.kc is not None,
            "CN": r.cn is not None,  # h̃/c̃ kept (zoneout, for a backward)
            # the keep factors' step and row strides (keep_views: shared by kh and kc)
            "kt": 0 if zoned is None else zoned.stride(0),
            "kb": 0 if zoned is None else zoned.stride(1),
            **{name: like if t is None else t for name, t in r._asdict().items()},
            **{name: like if t is None else t for name, t in extra.items()},
        }
        names = set(fn.arg_names)
        return {k: v for k, v in every.items() if k in names or k == "enable_fp_fusion"}


#: The most elements one program of the element-wise kernels takes.
BLOCK_MAX = 256


def grid_and_block(n: int) -> tuple[tuple[int], int]:
    """The launch grid and block of an element-wise kernel over ``n`` elements (an empty
    batch: one program, no element). At most :data:`BLOCK_MAX` elements a program:
    B·H = 32,768 (B 64, H 512) is then 128 programs, one for most of an H100's 132
    multiprocessors (1024 left ~100 idle, and an LSTM's float64 backward spilled
    registers at 1024 with 4 warps)."""
    block = 16
    while block < min(n, BLOCK_MAX):
        block *= 2
    return (max(1, (n + block - 1) // block),), block


def launch(
    x: Tensor, B: int, H: int, mask: Tensor | None, reset: Tensor | None, reg: Reg
) -> Launch:
    grid, block = grid_and_block(B * H)
    k = importlib.import_module(_KERNELS)  # sys.modules after the first call
    m = x if mask is None else mask
    r = x if reset is None else reset
    return Launch(k, grid, block, m, r, mask is not None, reset is not None, reg)


def as_int8(
    mask: Tensor | None, reset: Tensor | None, T: int, B: int, like: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """The int8 ``(T, B)`` mask and ``(T + 1, B)`` reset the kernels read (None: none)."""
    m = None if mask is None else mask.reshape(T, B).to(torch.int8).contiguous()
    r = None
    if reset is not None:
        r = torch.zeros(T + 1, B, dtype=torch.int8, device=like.device)
        r[:T] = reset.reshape(T, B).to(torch.int8)
    return m, r


def rerun_gradients(
    ctx: Any,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    reset: bool,
    grads: tuple[Tensor | None, ...],
) -> tuple[Tensor | None, ...]:
    """A Triton steps node's backward with a graph (``create_graph=True``, batched
    gradients): the forward run again in the layer kernel's differentiable steps from the
    node's inputs (``rnnkit.bptt.unrolled``); the node's five leading inputs get None.
    Resets inside the call are refused (their pieces are not rerun here)."""
    if reset:
        raise ConfigError(
            "resets inside one call: their gradient cannot be differentiated again "
            "(create_graph=True); run the pieces between the resets"
        )
    T, B = x.shape[0], x.shape[1]
    mask3 = None if mask is None else (mask != 0).reshape(T, B, 1)
    got = differentiable_gradients(
        ctx.layer_kernel, x, weights, states0, mask3, grads, ctx.needs_input_grad[5:]
    )
    return (None, None, None, None, None, *got)
