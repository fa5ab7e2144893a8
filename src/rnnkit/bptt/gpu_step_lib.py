"""The compiled library's one-step LSTM operators, and a GRU's step, in Triton, for loops
that stay in Python on a GPU.

The attention decoder with attention before the step (:mod:`rnnkit.layers.attention_loop`)
runs its recurrence step by step in Python. On the CPU an LSTM step there is two products
in torch and the gate math in one call of the compiled library
(:class:`rnnkit.cells.lstm.NativeLSTMStep` on ``lib.lstm_step`` /
``lib.lstm_step_backward``); :class:`TritonStepLib` offers the same two operators, with
the same semantics, as one Triton launch each (kernels in
:mod:`rnnkit.bptt.triton_step_kernels`), so that ``NativeLSTMStep(TritonStepLib())`` runs
the gate math of a step in one launch instead of some ten eager kernels.
:class:`TritonGRUStep` does the same for :class:`rnnkit.cells.gru.GRUKernel`'s step (its
buffers, its interface): one launch per step with ``reset="after"``, two with
``"before"`` (the candidate's product ``(r ⊙ h_{t-1}) W_nhᵀ`` lies between them),
forward and backward. A simple cell's step is already one product and one activation.

:func:`rnnkit.bptt.dispatch.python_step_kernel` chooses it where the layer path would run
the Triton steps (:func:`rnnkit.bptt.gpu_route.wants_steps`): CUDA tensors with triton
installed by default, ``RNNKIT_GPU_PATH=triton`` on any device (the CPU only in
Triton's interpreter, ``TRITON_INTERPRET=1``). Triton is imported on first use only.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rnnkit.bptt.gpu_launch import grid_and_block
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import StepKernel, Weights
from rnnkit.cells.lstm import LSTMKernel, NativeLSTMStep

__all__ = ["TritonGRUStep", "TritonStepLib", "triton_step"]

_KERNELS = "rnnkit.bptt.triton_step_kernels"
_DTYPES = (torch.float32, torch.float64)


def _on(t: Tensor) -> Any:
    """The context of ``t``'s CUDA device around a step's launches: Triton launches on the
    current device, which for tensors on ``cuda:1`` need not be theirs (CPU: none)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _check(gates: Tensor, wide: dict[str, Tensor], narrow: dict[str, Tensor]) -> tuple[int, int]:
    """``(B, H)`` of a step: ``gates`` and every ``wide`` tensor ``(B, 4H)`` (a ``bias``
    ``(4H,)``), every ``narrow`` one ``(B, H)``; all contiguous, of one float dtype and
    device (what the compiled operators check)."""
    if gates.dim() != 2 or gates.shape[1] % 4:
        raise ValueError(f"the gates must be (B, 4H), got {tuple(gates.shape)}")
    B, H = gates.shape[0], gates.shape[1] // 4
    shapes = {n: (4 * H,) if n == "bias" else (B, 4 * H) for n in wide}
    shapes.update({n: (B, H) for n in narrow})
    for name, t in {"gates": gates, **wide, **narrow}.items():
        if name in shapes and tuple(t.shape) != shapes[name]:
            raise ValueError(f"{name} must be {shapes[name]}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.dtype != gates.dtype or t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be float32 or float64, as the gates: {t.dtype}")
        if t.device != gates.device:
            raise ValueError(f"{name} must be on the gates' device {gates.device}: {t.device}")
    return B, H


class TritonStepLib:
    """``lstm_step`` and ``lstm_step_backward`` of the compiled library
    (``torch.ops.rnnkit_native``), as one Triton launch each; the buffers are read and
    written in place as those operators do (their docstrings)."""

    def lstm_step(
        self, xp: Tensor, rec: Tensor, bias: Tensor, c_prev: Tensor, h: Tensor, c: Tensor,
        tanh_c: Tensor,
    ) -> None:  # fmt: skip
        """One LSTM step, gate order i, f, g, o.

        Args:
            xp: ``(B, 4H)`` the input product ``x_t W_ihᵀ`` without bias; overwritten by
                the activated gates (the backward's cache).
            rec: ``(B, 4H)`` the recurrent product ``h_{t-1} W_hhᵀ``.  bias: ``(4H,)``.
            c_prev: ``c_{t-1}`` ``(B, H)``.
            h, c, tanh_c: ``(B, H)``, written: ``c_t = f c_{t-1} + i g``,
                ``tanh(c_t)``, ``h_t = o tanh(c_t)``, with ``a = (xp + bias) + rec``,
                ``i, f, o = σ(a)``, ``g = tanh(a)``.
        """
        narrow = {"c_prev": c_prev, "h": h, "c": c, "tanh_c": tanh_c}
        B, H = _check(xp, {"rec": rec, "bias": bias}, narrow)
        grid, block = grid_and_block(B * H)
        k: Any = importlib.import_module(_KERNELS)  # sys.modules after the first call
        with _on(xp):
            k.lstm_step[grid](xp, rec, bias, c_prev, h, c, tanh_c, B, H, BLOCK=block,
                              enable_fp_fusion=True)  # fmt: skip

    def lstm_step_backward(
        self, gates: Tensor, tanh_c: Tensor, c_prev: Tensor, d_h: Tensor, d_c: Tensor,
        d_gates: Tensor, d_out: Tensor | None = None,
    ) -> None:  # fmt: skip
        """The backward of :meth:`lstm_step`.

        Args:
            gates, tanh_c: what :meth:`lstm_step` wrote.  c_prev: ``c_{t-1}``.
            d_h: ``(B, H)`` ∂L/∂h_t (``d_out`` added, if given); zeroed: its recurrent
                part ``d_gates W_hh`` is the caller's product.
            d_c: ``(B, H)`` ∂L/∂c_t, becomes ∂L/∂c_{t-1} = ``d_ct f``.
            d_gates: ``(B, 4H)``, written: the pre-activations' gradient (order i, f, g, o).
        """
        narrow = {"tanh_c": tanh_c, "c_prev": c_prev, "d_h": d_h, "d_c": d_c}
        if d_out is not None:
            narrow["d_out"] = d_out
        B, H = _check(gates, {"d_gates": d_gates}, narrow)
        grid, block = grid_and_block(B * H)
        k: Any = importlib.import_module(_KERNELS)
        with _on(gates):
            k.lstm_step_backward[grid](
                gates, tanh_c, c_prev, d_h, d_c, d_gates, d_h if d_out is None else d_out, B,
                H, HAS_DOUT=d_out is not None, BLOCK=block, enable_fp_fusion=True,
            )  # fmt: skip


def _contiguous(**tensors: Tensor) -> None:
    """The launches read rows of their buffers as contiguous."""
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


class _GRUPrepared(NamedTuple):
    weight_hh_t: Tensor  # (H, 3H) "after": r, z and n rows; (H, 2H) "before": r, z rows
    weight_hn_t: Tensor  # (H, H): the n rows, transposed
    bias_hn: Tensor | None  # (H,) "after" only


@dataclass(frozen=True)
class TritonGRUStep(GRUKernel):
    """:class:`~rnnkit.cells.gru.GRUKernel`'s buffers and step interface (its input
    projections, cache ``rz``, ``n``, ``rec`` and weight gradients), each step's gate math
    in Triton launches (kernels in :mod:`rnnkit.bptt.triton_step_kernels`), for loops that
    stay in Python on a GPU.

    ``reset="after"``: per step ONE product ``h_{t-1} W_hhᵀ`` and ONE launch; backward one
    launch and two products. ``reset="before"`` needs ``(r ⊙ h_{t-1}) W_nhᵀ`` inside the
    step: two products and two launches, and the same in the backward. The backward cache
    is the forward's (the launches take σ' and tanh' from the gates)."""

    def prepare(self, w: Weights) -> Any:  # _GRUPrepared (GRUKernel.prepare: its own)
        H = w.weight_hh.shape[1]
        if self.reset == "after":
            assert w.bias_hn is not None  # a GRU with reset="after" has b_hn
            return _GRUPrepared(w.weight_hh.T, w.weight_hh[2 * H :].T, w.bias_hn.contiguous())
        return _GRUPrepared(w.weight_hh[: 2 * H].T, w.weight_hh[2 * H :].T, None)

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        (h_prev,) = prev
        rz, n, rec = cache  # rz, n are the projection buffers, overwritten in place
        _contiguous(rz=rz, n=n, rec=rec, h_prev=h_prev, h=out[0])
        B, H = h_prev.shape
        grid, block = grid_and_block(B * H)
        k: Any = importlib.import_module(_KERNELS)
        keep = self.update == "keep"
        with _on(h_prev):
            if self.reset == "after":
                rec3 = torch.mm(h_prev, prep.weight_hh_t)  # (B, 3H)
                k.gru_after_step[grid](rz, n, rec3, prep.bias_hn, h_prev, out[0], rec, B, H,
                                       KEEP=keep, BLOCK=block, enable_fp_fusion=True)  # fmt: skip
                return
            rec2 = torch.mm(h_prev, prep.weight_hh_t)  # (B, 2H)
            k.gru_before_gates[grid](rz, rec2, h_prev, rec, B, H, BLOCK=block,
                                     enable_fp_fusion=True)  # fmt: skip
            n.addmm_(rec, prep.weight_hn_t)  # + (r ⊙ h_{t-1}) W_nhᵀ
            k.gru_before_state[grid](rz, n, h_prev, out[0], B, H, KEEP=keep, BLOCK=block,
                                     enable_fp_fusion=True)  # fmt: skip

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        return cache

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: Any,  # what this kernel's prepare_backward returns
    ) -> tuple[Tensor, ...]:
        (d_h,) = d_new
        (h_prev,) = prev
        rz, n, rec = cache
        d_h = d_h.contiguous()
        _contiguous(rz=rz, n=n, rec=rec, h_prev=h_prev, d_xp=d_xp, d_hp=d_hp)
        B, H = h_prev.shape
        grid, block = grid_and_block(B * H)
        k: Any = importlib.import_module(_KERNELS)
        after = self.reset == "after"
        d_prev = torch.empty_like(d_h)  # the direct part of ∂L/∂h_{t-1}
        W = w.weight_hh
        with _on(h_prev):
            k.gru_step_backward[grid](
                rz, n, rec, h_prev, d_h, d_xp, d_hp, d_prev, B, H,
                KEEP=self.update == "keep", AFTER=after, BLOCK=block, enable_fp_fusion=True,
            )  # fmt: skip
            if after:  # d_hp: the candidate's recurrent gradient d_an ⊙ r
                return (d_prev.addmm_(d_xp[:, : 2 * H], W[: 2 * H]).addmm_(d_hp, W[2 * H :]),)
            d_rh = d_xp[:, 2 * H :] @ W[2 * H :]  # ∂L/∂(r ⊙ h_{t-1})
            k.gru_before_backward[grid](rz, h_prev, d_rh, d_xp, d_prev, B, H, BLOCK=block,
                                        enable_fp_fusion=True)  # fmt: skip
        return (d_prev.addmm_(d_xp[:, : 2 * H], W[: 2 * H]),)


def triton_step(kernel: StepKernel) -> StepKernel | None:
    """The Triton form of ``kernel``'s step for a loop that stays in Python: an LSTM's
    through :class:`~rnnkit.cells.lstm.NativeLSTMStep` on :class:`TritonStepLib`, a GRU's
    :class:`TritonGRUStep`; None for every other kernel (a simple cell's step is already
    one product and one activation)."""
    if type(kernel) is LSTMKernel:
        return NativeLSTMStep(TritonStepLib())
    if type(kernel) is GRUKernel:
        return TritonGRUStep(kernel.update, kernel.reset)
    return None
