"""Count the reads of device values in a block of code, on the CPU.

On a GPU, ``float(t)``, ``bool(t)``, ``t.tolist()``, ``torch.nonzero(t)`` or ``t[bool_mask]``
of a tensor on the device waits for every kernel queued before it. On the CPU they cost
nothing, so a test cannot time them; it can count them. :class:`HostReads` marks what
would live on the device — the model's parameters and gradients, whatever is moved with
``.to(device)`` with a ``torch.device`` (on the CPU that is the CPU), whatever a factory
makes with ``device=`` a ``torch.device`` (``torch.arange(n, device=device)``), and
everything computed from those; ``.cpu()`` and ``.to("cpu")`` of a marked tensor count
as one read, and give a host tensor — and counts, by call site, each read of a marked
tensor's values on the host.
"""

from __future__ import annotations

import collections
import traceback
import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from host_syncs import READS


def _names_cpu(args: tuple, kwargs: dict) -> bool:
    """``t.to("cpu")`` or ``t.to(device="cpu")``: the host copy a library makes on purpose
    (a move to "the" device is ``t.to(device)`` with a ``torch.device``, as tasks do)."""
    return any(a == "cpu" for a in (*args, kwargs.get("device")) if isinstance(a, str))


class HostReads(TorchFunctionMode):
    """``with HostReads(model) as reads: ...``; ``reads.count`` and ``reads.sites``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._marked: dict[int, weakref.ref[torch.Tensor]] = {}
        for p in model.parameters():
            self._mark(p)
        self.sites: collections.Counter[str] = collections.Counter()

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def _mark(self, t: Any) -> None:
        if isinstance(t, torch.Tensor):
            self._marked[id(t)] = weakref.ref(t)
        elif isinstance(t, (tuple, list)):
            for x in t:
                self._mark(x)

    def _is_marked(self, t: Any) -> bool:
        if isinstance(t, torch.Tensor):
            ref = self._marked.get(id(t))
            return ref is not None and ref() is t
        if isinstance(t, (tuple, list)):
            return any(self._is_marked(x) for x in t)
        if isinstance(t, dict):
            return any(self._is_marked(x) for x in t.values())
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        inputs = (*args, *kwargs.values())
        to_host = name == "cpu" or (name == "to" and _names_cpu(args[1:], kwargs))
        moved = (
            not to_host
            and name in {"to", "cuda"}
            and any(
                isinstance(a, (torch.device, torch.Tensor)) for a in (*args[1:], *kwargs.values())
            )
        ) or (
            # made there: torch.arange(..., device=device) and the other factories
            name not in {"to", "cuda"} and isinstance(kwargs.get("device"), torch.device)
        )
        marked = any(self._is_marked(a) for a in inputs)
        if name == "__get__" and marked:  # p.grad of a parameter
            self._mark(out)
        elif to_host:  # a copy to the host: a read, and what it gives is on the host
            if marked:
                self._note()
                if out is args[0]:  # on the CPU the "copy" is the tensor itself
                    out = out.clone()
        elif marked or moved:
            if self._reads(name, args) and marked:
                self._note()
            if moved and not marked and out is args[0]:  # a host tensor's move: on the CPU
                out = out.clone()  # the tensor itself; on a GPU a copy apart from it
            self._mark(out)
        return out

    @staticmethod
    def _reads(name: str, args: tuple) -> bool:
        if name in READS:
            return True
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        return False

    def _note(self) -> None:
        frames = [
            f
            for f in traceback.extract_stack()[:-2]
            if "/rnnkit/" in f.filename and "host_reads" not in f.filename
        ]
        where = (
            f"{frames[-1].filename.rsplit('/rnnkit/', 1)[-1]}:{frames[-1].lineno}"
            if frames
            else "?"
        )
        self.sites[where] += 1


def step_reads(model: torch.nn.Module, monkeypatch: Any, run: Any) -> tuple[dict[str, int], list]:
    """The reads of one training step: ``run()`` (a ``LossOutput``) and its backward inside
    ``rnnkit.deferred.deferring``, the reads taking a GPU's paths (``deferred.waits``
    patched) and the fused path forced; returns the read sites and the step's figures
    (nats, tokens) read at its end."""
    from rnnkit import deferred
    from rnnkit.bptt.fused import use_fused

    monkeypatch.setattr(deferred, "waits", lambda tensor: True)  # as on a GPU
    with use_fused("fused"), HostReads(model) as reads, deferred.deferring() as d:
        out = run()
        out.loss.backward()
        figures = d.read(out.nats, out.tokens)
    return dict(reads.sites), figures
