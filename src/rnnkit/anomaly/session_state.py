"""One model step per event and the recurrent states of open sessions, for streaming.

:func:`step_function` gives ``p(· | e_<t)`` from the previous event and state in one step
of the model; :class:`StatePool` keeps the state of every open session as one row of one
tensor per state part, so a batch of sessions is one ``index_select`` in and one
``index_copy_`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from rnnkit.types import LSTMState

__all__ = ["step_function"]


class StatePool:
    """Recurrent states of open sessions, one row each, in one tensor per state part.

    Rows are recycled through a free list; the pool doubles up to ``capacity`` rows.
    """

    def __init__(self, model: torch.nn.Module, capacity: int) -> None:
        enc: Any = model.encoder  # the model's recurrent stack (duck-typed)
        param = next(model.parameters())
        self.is_lstm = bool(enc.is_lstm)
        self.shape = (int(enc.num_layers), int(enc.num_directions), int(enc.hidden_size))
        self.capacity = capacity
        self._dtype, self._device = param.dtype, param.device
        self.parts: list[torch.Tensor] = []
        self.free: list[int] = []
        self._grow(min(capacity, 64))

    def _grow(self, rows: int) -> None:
        L, D, H = self.shape
        old = self.parts[0].shape[2] if self.parts else 0
        new = [
            torch.zeros(L, D, rows, H, dtype=self._dtype, device=self._device)
            for _ in range(2 if self.is_lstm else 1)
        ]
        for part, prev in zip(new, self.parts, strict=False):
            part[:, :, :old] = prev
        self.parts = new
        self.free.extend(range(rows - 1, old - 1, -1))

    def alloc(self) -> int:
        if not self.free:
            self._grow(min(self.capacity, 2 * self.parts[0].shape[2]))
        row = self.free.pop()
        for part in self.parts:
            part[:, :, row] = 0.0
        return row

    def release(self, row: int) -> None:
        self.free.append(row)

    def gather(self, rows: torch.Tensor) -> Any:
        taken = [part.index_select(2, rows) for part in self.parts]
        return LSTMState(*taken) if self.is_lstm else taken[0]

    def scatter(self, rows: torch.Tensor, state: Any) -> None:
        for part, new in zip(self.parts, state if self.is_lstm else (state,), strict=True):
            part.index_copy_(2, rows, new)

    def bytes_per_session(self) -> int:
        L, D, H = self.shape
        return len(self.parts) * L * D * H * self.parts[0].element_size()


def step_function(model: torch.nn.Module) -> Callable[[torch.Tensor, Any], tuple[Any, Any]]:
    """``(tokens (B,), state) -> (log-probabilities (B, V), state)`` for one event.

    For a :class:`~rnnkit.models.language_model.LanguageModel` in eval mode this calls the
    cells of its unidirectional stack directly (embedding → cell of each layer → head):
    the same function as ``model.step`` without the whole-sequence machinery around a
    one-step sequence, about 4× less overhead per event on CPU. Anything else (a stack
    with zoneout too) falls back to ``model.step``.

    >>> from rnnkit.models import ModelSpec, build_language_model
    >>> lm = build_language_model(ModelSpec(hidden=5, embedding=3, layers=2), 7)
    >>> lm = lm.eval()
    >>> tokens = torch.tensor([4, 5])
    >>> fast, state = step_function(lm)(tokens, None)
    >>> slow, _ = lm.step(tokens)
    >>> bool(torch.allclose(fast, slow, atol=1e-6)), tuple(state.h.shape)
    (True, (2, 1, 2, 5))
    """
    encoder = getattr(model, "encoder", None)
    parts = ("embedding", "head", "step")
    if (
        encoder is None
        or not all(hasattr(model, name) for name in parts)
        or not hasattr(encoder, "cells")
        or encoder.num_directions != 1
        or getattr(encoder, "zoneout", 0.0)  # mixes h_{t-1} in at evaluation: the stack's
    ):
        return model.step  # type: ignore[return-value]
    cells = encoder.cells()
    is_lstm = bool(encoder.is_lstm)
    embedding = cast(torch.nn.Module, model.embedding)
    head = cast(torch.nn.Module, model.head)
    slow_step = cast(Callable[..., tuple[torch.Tensor, Any]], model.step)

    @torch.no_grad()
    def step(tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        if model.training:  # dropout would make the fast path differ from model.step
            return slow_step(tokens, state)
        x = embedding(tokens)  # (B, E)
        new = []
        for layer, cell in enumerate(cells):
            if state is None:
                prev = None
            elif is_lstm:
                prev = LSTMState(state.h[layer, 0], state.c[layer, 0])
            else:
                prev = state[layer, 0]
            s = cell(x, prev)
            new.append(s)
            x = s.h if is_lstm else s  # (B, H)
        log_probs = torch.log_softmax(head(x), dim=-1)  # (B, V)
        if is_lstm:
            h = torch.stack([s.h for s in new])[:, None]  # (L, 1, B, H)
            c = torch.stack([s.c for s in new])[:, None]
            return log_probs, LSTMState(h, c)
        return log_probs, torch.stack(new)[:, None]

    return step
