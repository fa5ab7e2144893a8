"""Count what a decoding step costs on a GPU, on the CPU: ATen operations and host syncs.

On a GPU a decoding step of a small model is bound by kernel launches: each ATen
operation dispatched on device tensors is (at least) one launch, whatever its size. And
each read of device values on the host (``.item()``, ``float(t)``, ``bool(t)``,
``t.tolist()``, ``t.nonzero()``) or copy of host data to the device (``torch.tensor(list,
device=...)``, which waits for the stream) stalls the host until every queued kernel has
run. Neither costs much on the CPU, so tests count them: :class:`OpCounts` records every
ATen operation by name (a ``TorchDispatchMode``) and every host sync by kind (a
``TorchFunctionMode``), and splits them into steps at the calls of a model's ``step``.

Everything the block computes is counted as if it lived on the device (decoding makes
all its tensors there); the operations of the compiled CPU library
(``rnnkit_native.*``) are ATen operations too, one launch each.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from host_syncs import READS

# The functions and tensor methods that read device values on the host (one sync each:
# host_syncs.READS), and the ones that copy host data to the device (a sync too: the copy
# waits for the stream).
UPLOADS = frozenset({"tensor", "as_tensor"})

# The kinds of ATen operation, for the tables: the products, the gate, attention and
# output math, the choice of tokens; every other operation is bookkeeping (views, fills,
# index juggling, casts, copies, concatenations, comparisons, host reads).
PRODUCTS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv"})
MATH = frozenset(
    {
        "sigmoid",
        "tanh",
        "_softmax",
        "_log_softmax",
        "softmax",
        "log_softmax",
        "lstm_step",
        "sigmoid_scores",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "addcmul",
        "lerp",
        "embedding",
        "mul",
        "add",
        "sub",
        "div",
        "relu",
    }
)
CHOICE = frozenset({"max", "argmax", "topk", "multinomial"})


# Operations that launch nothing on a GPU: views, allocations, and the host reads
# (counted apart).
NO_LAUNCH = frozenset(
    {
        "empty",
        "new_empty",
        "empty_like",
        "view",
        "_unsafe_view",
        "t",
        "select",
        "slice",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "expand",
        "unsafe_split",
        "split",
        "unbind",
        "alias",
        "_local_scalar_dense",
        "lift_fresh",
        "scalar_tensor",
    }
)


#: Per LSTM cell step on the CPU, the elementwise operations that a GPU runs as torch's
#: one fused kernel (``_thnn_fused_lstm_cell``), less that one: torch's ``lstm_cell``
#: (``add_``, three ``sigmoid_``, ``tanh_``, three ``mul``, ``add_``, ``tanh``: 9 saved)
#: and ``TorchInferenceStep``'s (``add``, two ``sigmoid``, two ``tanh``, two ``mul``,
#: ``addcmul``: 7 saved). One ``unsafe_split`` marks a torch cell step, one ``addcmul``
#: the inference step's.
FUSED_SAVED = {"aten.unsafe_split": 9, "aten.addcmul": 7}


def fused_on_gpu(names: collections.Counter[str]) -> int:
    """The kernels that the CPU's LSTM gate math counts beyond a GPU's one per cell, of
    the operations ``names`` (name → count)."""
    return sum(names.get(marker, 0) * saved for marker, saved in FUSED_SAVED.items())


def launches(name: str) -> bool:
    """Whether the op ``name`` (``"aten.addmm"``, ``"aten.add[int]"``) launches a kernel on
    a GPU: every operation but the views, allocations and host reads."""
    return name.split("[")[0].rsplit(".", 1)[-1] not in NO_LAUNCH


def kind(name: str) -> str:
    """``"product"``, ``"math"``, ``"choice"`` or ``"bookkeeping"`` for an op name such as
    ``"aten.addmm"`` or ``"rnnkit_native.lstm_step"``."""
    if name.endswith("[int]"):
        return "bookkeeping"
    base = name.rsplit(".", 1)[-1].rstrip("_")
    if base in PRODUCTS:
        return "product"
    if base in MATH:
        return "math"
    if base in CHOICE:
        return "choice"
    return "bookkeeping"


class _Dispatch(TorchDispatchMode):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        packet = func._overloadpacket  # e.g. aten.addmm (the overload left out)
        name = packet._qualified_op_name.replace("::", ".")
        if kind(name) == "math" and not any(
            isinstance(a, torch.Tensor) and a.is_floating_point() for a in args
        ):
            name += "[int]"  # index arithmetic (row numbers, token ids): bookkeeping
        self.log.append(name)
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, log: list[str], syncs: list[tuple[int, str]]) -> None:
        super().__init__()
        self.log = log
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name in READS or name in UPLOADS:
            # the position in the op log dates it (before or after a step began)
            self.syncs.append((len(self.log), name))
        elif name in ("__getitem__", "__setitem__") and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                self.syncs.append((len(self.log), f"{name}[bool]"))
        if isinstance(func, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
            # A library's own operator (rnnkit_native's) runs its C++ kernel for every
            # dispatch key: the dispatch mode never sees it, so it is logged here, once.
            at, name = len(self.log), str(func).split(".default")[0].replace("::", ".")
            out = func(*args, **(kwargs or {}))
            if name not in self.log[at:]:
                self.log.insert(at, name)
            return out
        return func(*args, **(kwargs or {}))


class OpCounts:
    """``with OpCounts(Model, Other) as counts: ...decode...``; then ``counts.per_step()``.

    ``step_owners``: classes (or objects) whose ``step`` method is the model's step; their
    calls are counted and split the log. The decoding's *steps* are its ``step`` calls;
    what runs from the first call's start to the end of the block (the steps and the
    search around them) is divided among them. What runs before the first call (encoding,
    setup) is left out: it is paid once per decoding, not per token.
    """

    def __init__(self, *step_owners: Any) -> None:
        self.owners = step_owners
        self.log: list[str] = []
        self.syncs: list[tuple[int, str]] = []
        self.starts: list[int] = []  # log position at each step call's start
        self.in_step = 0  # ops dispatched inside step calls
        self._stack = ExitStack()

    def __enter__(self) -> OpCounts:
        for owner in self.owners:
            self._stack.enter_context(self._wrapped(owner))
        self._stack.enter_context(_Function(self.log, self.syncs))
        self._stack.enter_context(_Dispatch(self.log))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @contextmanager
    def _wrapped(self, owner: Any) -> Iterator[None]:
        own = vars(owner).get("step")  # None: inherited (a class) or the class's (an object)
        original: Callable[..., Any] = owner.step

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            start = len(self.log)
            self.starts.append(start)
            try:
                return original(*args, **kwargs)
            finally:
                self.in_step += len(self.log) - start

        owner.step = step
        try:
            yield
        finally:
            if own is None:
                del owner.step
            else:
                owner.step = own

    @property
    def steps(self) -> int:
        return len(self.starts)

    def _from_first_step(self) -> list[str]:
        if not self.starts:
            raise AssertionError("no step call was counted")
        return self.log[self.starts[0] :]

    def per_step(self) -> float:
        """ATen operations per step (the steps and the search between them)."""
        return len(self._from_first_step()) / self.steps

    def model_per_step(self) -> float:
        """ATen operations per step inside the model's ``step`` calls."""
        return self.in_step / self.steps

    def by_name(self) -> collections.Counter[str]:
        """Op name → count from the first step on."""
        return collections.Counter(self._from_first_step())

    def kernels_per_step(self) -> float:
        """Operations that launch a kernel on a GPU (:func:`launches`) per step, from the
        first step on."""
        return sum(n for name, n in self.by_name().items() if launches(name)) / self.steps

    def gpu_kernels_per_step(self) -> float:
        """:meth:`kernels_per_step` with each LSTM cell's gate math as the one fused kernel
        a GPU runs (:data:`FUSED_SAVED`)."""
        return self.kernels_per_step() - fused_on_gpu(self.by_name()) / self.steps

    def by_kind(self) -> dict[str, float]:
        """Per step: products, math, choice, bookkeeping (see :func:`kind`)."""
        totals: collections.Counter[str] = collections.Counter()
        for name, n in self.by_name().items():
            totals[kind(name)] += n
        return {k: totals[k] / self.steps for k in ("product", "math", "choice", "bookkeeping")}

    def sync_names(self) -> collections.Counter[str]:
        """Host syncs (reads and uploads) by name from the first step on."""
        first = self.starts[0] if self.starts else 0
        return collections.Counter(name for at, name in self.syncs if at >= first)

    def syncs_per_step(self) -> float:
        """Host reads and uploads per step, from the first step on."""
        return sum(self.sync_names().values()) / self.steps
