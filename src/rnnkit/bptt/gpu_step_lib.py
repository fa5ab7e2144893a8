"""The compiled library's one-step LSTM operators in Triton, for loops that stay in Python
on a GPU.

The attention decoder with attention before the step (:mod:`rnnkit.layers.attention_loop`)
runs its recurrence step by step in Python. On the CPU an LSTM step there is two products
in torch and the gate math in one call of the compiled library
(:class:`rnnkit.cells.lstm.NativeLSTMStep` on ``lib.lstm_step`` /
``lib.lstm_step_backward``); :class:`TritonStepLib` offers the same two operators, with
the same semantics, as one Triton launch each (kernels in
:mod:`rnnkit.bptt.triton_step_kernels`), so that ``NativeLSTMStep(TritonStepLib())`` runs
the gate math of a step in one launch instead of some ten eager kernels.

:func:`rnnkit.bptt.dispatch.python_step_kernel` chooses it where the layer path would run
the Triton steps (:func:`rnnkit.bptt.gpu_steps.wants_steps`): CUDA tensors with triton
installed by default, ``RNNKIT_GPU_PATH=triton`` on any device (the CPU only in
Triton's interpreter, ``TRITON_INTERPRET=1``). Triton is imported on first use only.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import Tensor

__all__ = ["TritonStepLib"]

_KERNELS = "rnnkit.bptt.triton_step_kernels"
_DTYPES = (torch.float32, torch.float64)


def _grid(n: int) -> tuple[tuple[int], int]:
    """The launch grid and block over ``n`` elements (an empty batch: one program, no
    element)."""
    block = 16
    while block < min(n, 1024):
        block *= 2
    return (max(1, (n + block - 1) // block),), block


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
        grid, block = _grid(B * H)
        k: Any = importlib.import_module(_KERNELS)  # sys.modules after the first call
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
        grid, block = _grid(B * H)
        k: Any = importlib.import_module(_KERNELS)
        k.lstm_step_backward[grid](
            gates, tanh_c, c_prev, d_h, d_c, d_gates, d_h if d_out is None else d_out, B, H,
            HAS_DOUT=d_out is not None, BLOCK=block, enable_fp_fusion=True,
        )  # fmt: skip
