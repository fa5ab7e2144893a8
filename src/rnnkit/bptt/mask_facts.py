"""What the time loop's choices need to know about a mask, read once on the host.

A layer asks of its mask ``(T, B)`` whether every step is real (no mask at all, then) and,
on a GPU, whether each sequence's real steps are a prefix and how long each is (the fused
kernels take lengths on the host). Each question asked of a CUDA mask is a wait for the
device: asked separately, once per question, direction and layer, they would be a handful
of waits per layer. Here the mask is copied to the host once, and every answer is computed
from that copy; the answers are kept for the mask they came from, so the layers of one
call that share a mask share one copy.

The answers are kept for the last few masks of this thread, each recognised by identity
and by its version counter (an in-place change to the mask is a new mask), so a result is
never read for a mask it was not computed from. A view of a mask (a slice of its steps, as
scheduled sampling and segments take, or its transpose) is answered from the same view of
its base's host copy, and a derived mask (a reverse direction's flipped one) from its
source's, transformed on the host: one wait per mask, whatever is asked of its parts. A
mask a task made on the host and moved with :func:`move_mask` is not waited for at all.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rnnkit.data.batching import to_device

__all__ = ["all_real", "derive", "host_mask", "move_mask", "prefix_lengths"]

_KEEP = 16  # masks remembered per thread: a model's masks, their views and flipped ones
_local = threading.local()


def _facts(mask: Tensor) -> dict[str, Any]:
    """The answers known for ``mask`` (its host copy under ``"host"``), found or new."""
    # one copy to the host (one wait for a GPU); a CPU mask is used as it is
    if mask.is_inference():  # no version counter to recognise it by: not remembered
        return {"host": mask.detach().to("cpu")}
    memo: list[tuple[weakref.ref[Tensor], int, dict[str, Any]]] = getattr(_local, "memo", [])
    version = mask._version
    for i, (ref, seen, facts) in enumerate(memo):
        if ref() is mask and seen == version:
            if "host" not in facts:  # derived from another mask's host copy (derive())
                facts["host"] = _derived_host(mask, facts.pop("from"))
            _local.memo = [memo[i], *memo[:i], *memo[i + 1 :]]  # the latest asked first
            return facts
    facts = {"host": _view_of_base(mask)}
    _remember(mask, version, facts)
    return facts


def _view_of_base(mask: Tensor) -> Tensor:
    """The host copy of ``mask``: where it is a view (a slice of the steps, the
    transposed layout), the same view of its base's host copy, so that the slices of one
    mask (one per step or segment) are one wait, not one each; else a copy of its own."""
    base = mask._base
    if base is not None and not base.is_inference():
        host = _facts(base)["host"]
        if (
            host.stride() == base.stride()
        ):  # the same layout: the view's elements at the same offsets
            offset = mask.storage_offset() - base.storage_offset() + host.storage_offset()
            return host.as_strided(mask.shape, mask.stride(), offset)
    return mask.detach().to("cpu")


def _remember(mask: Tensor, version: int, facts: dict[str, Any]) -> None:
    # the mask's older answers (changed since) and masks no longer alive make room
    memo = getattr(_local, "memo", [])
    alive = [(entry, entry[0]()) for entry in memo]  # (`in` would compare tensors' values)
    others = [entry for entry, held in alive if held is not None and held is not mask]
    _local.memo = [(weakref.ref(mask), version, facts), *others[: _KEEP - 1]]


def derive(mask: Tensor, source: Tensor, transform: Callable[[Tensor], Tensor]) -> None:
    """Declare ``mask = transform(source)`` (e.g. the flipped mask of a layer's reverse
    direction), so that ``mask``'s answers come from ``source``'s host copy, transformed
    on the host: one wait for both. Not for inference tensors (no version counter)."""
    if mask.is_inference() or source.is_inference():
        return
    _remember(mask, mask._version, {"from": (weakref.ref(source), source._version, transform)})


def _derived_host(mask: Tensor, origin: tuple[Any, int, Callable[[Tensor], Tensor]]) -> Tensor:
    """The host copy of a derived mask: its source's, transformed, if the source is
    alive and unchanged since; else a copy of its own."""
    ref, version, transform = origin
    source = ref()
    if source is None or source._version != version:
        return mask.detach().to("cpu")
    return transform(_facts(source)["host"])


def move_mask(mask: Tensor, device: torch.device | str) -> Tensor:
    """``mask``, made on the host, moved to ``device`` (without a wait,
    :func:`rnnkit.data.batching.to_device`), with ``mask`` kept as the moved one's host
    copy: what the time loop asks of it (and of its views and flipped forms) then reads
    nothing from the device. ``mask`` must not change afterwards (a batch's does not).
    The same for a tensor masks are made from (a tagger's characters: :func:`derive`).

    >>> m = torch.tensor([[True, False]])
    >>> move_mask(m, "cpu") is m
    True
    """
    moved = to_device(mask, device)
    if moved is not mask and mask.device.type == "cpu" and not moved.is_inference():
        _remember(moved, moved._version, {"host": mask})
    return moved


def host_mask(mask: Tensor) -> Tensor:
    """``mask`` on the host, read once and shared with the time loop's questions about it
    (and its views): counting its steps there waits for nothing more.

    >>> host_mask(torch.tensor([[True, False]])).sum().item()
    1
    """
    return _facts(mask)["host"]


def all_real(mask: Tensor) -> bool:
    """Whether every step of ``mask`` (bool, any shape) is real.

    >>> all_real(torch.tensor([[True, True], [True, False]]))
    False
    """
    facts = _facts(mask)
    if "all" not in facts:
        facts["all"] = bool(facts["host"].all())
    return bool(facts["all"])


def prefix_lengths(mask: Tensor) -> Tensor | None:
    """Each column's length, on the host (int64), if the real steps of every column of
    ``mask (T, B)`` are a prefix (``True…True False…False``), else None (a hole inside a
    sequence).

    >>> prefix_lengths(torch.tensor([[1, 1], [1, 0], [0, 0]]).bool()).tolist()
    [2, 1]
    >>> prefix_lengths(torch.tensor([[1], [0], [1]]).bool()) is None
    True
    """
    facts = _facts(mask)
    if "lengths" not in facts:
        host = facts["host"]
        lengths = host.sum(0)
        steps = torch.arange(host.shape[0])
        facts["lengths"] = lengths if torch.equal(steps[:, None] < lengths, host) else None
    return facts["lengths"]
