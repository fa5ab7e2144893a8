"""Rows of a recurrent state: select, expand or merge them along the batch dimension.

A search holds one state row per live sequence (or per beam) and drops, repeats or
reorders rows as sequences end and beams are ranked. States are tensors or nested
tuples / NamedTuples / lists / dicts of tensors; rows are selected along a batch
dimension (``state_batch_dim``, 2 for rnnkit's ``(L, D, B, H)``, or a matching nested
spec of dims) or by a ``reorder(state, index)`` callable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["select_state"]

# A batch-dimension spec: one int for every tensor, or a structure matching the state's.
DimSpec = Any
Reorder = Callable[[Any, Tensor], Any]


def _map_state(fn: Callable[..., Tensor], dim: DimSpec, *states: Any) -> Any:
    """Apply ``fn(tensor..., dim)`` leaf-wise over matching nested states."""
    first = states[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        if not isinstance(dim, int):
            raise TypeError(f"state_batch_dim {dim!r} does not match a tensor leaf")
        return fn(*states, dim)
    if isinstance(first, dict):
        by_key = dim if isinstance(dim, dict) else dict.fromkeys(first, dim)
        return {k: _map_state(fn, by_key[k], *(s[k] for s in states)) for k in first}
    if isinstance(first, (tuple, list)):
        dims = dim if isinstance(dim, (tuple, list)) else (dim,) * len(first)
        if len(dims) != len(first):
            raise TypeError(f"state_batch_dim {dim!r} does not match the state's structure")
        items = [
            _map_state(fn, d, *parts)
            for d, parts in zip(dims, zip(*states, strict=True), strict=True)
        ]
        if isinstance(first, list):
            return items
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    raise TypeError(f"cannot select rows of a state of type {type(first).__name__}")


def select_state(state: Any, index: Tensor, dim: DimSpec = 2) -> Any:
    """Rows ``index`` of every tensor of a (nested) state, along its batch dimension.

    Args:
        state: a tensor, None, or tuples / NamedTuples / lists / dicts of them.
        index: ``(B',)`` long row indices (repeats allowed: this also expands a state).
        dim: the batch dimension of every tensor (rnnkit states ``(L, D, B, H)``: 2), or
            a structure matching the state's with one dim per leaf.

    >>> from rnnkit.types import LSTMState
    >>> s = LSTMState(torch.arange(3.0).view(1, 1, 3, 1), torch.zeros(1, 1, 3, 1))
    >>> select_state(s, torch.tensor([2, 0, 0])).h.view(-1).tolist()
    [2.0, 0.0, 0.0]
    >>> select_state((torch.arange(3), s), torch.tensor([1]), dim=(0, 2))[0].tolist()
    [1]
    """
    return _map_state(lambda t, d: t.index_select(d, index.to(t.device)), dim, state)


def _where_state(rows: Tensor, new: Any, old: Any, dim: DimSpec) -> Any:
    """``new`` where ``rows (B,)`` is True, else ``old`` (None: the zero state)."""

    def pick(n: Tensor, o: Tensor | None, d: int) -> Tensor:
        shape = [1] * n.dim()
        shape[d] = -1
        return torch.where(rows.to(n.device).view(shape), n, 0.0 if o is None else o)

    if old is None:
        return _map_state(lambda n, d: pick(n, None, d), dim, new)
    return _map_state(pick, dim, new, old)


def _collect(into: list[Any], item: Any, leaf: Tensor) -> Tensor:
    """``into.append(item)``, then ``leaf``: a leaf function that reads and keeps."""
    into.append(item)
    return leaf


def _batch_size(state: Any, dim: DimSpec) -> int | None:
    sizes: list[int] = []
    try:
        _map_state(lambda t, d: _collect(sizes, t.shape[d], t), dim, state)
    except (IndexError, TypeError) as e:
        raise ValueError(
            f"cannot read the rows of the state with state_batch_dim={dim!r}: give "
            "state_batch_dim matching the state, or prompts"
        ) from e
    return sizes[0] if sizes else None


def _device(model: Any, state: Any) -> torch.device:
    leaves: list[Tensor] = []
    # A state only its own reorder callable understands tells nothing: TypeError ignored.
    with contextlib.suppress(TypeError):
        _map_state(lambda t, d: _collect(leaves, t, t), 0, state)
    if leaves:
        return leaves[0].device
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")
