"""Where tensors live, checked on the CPU: a stand-in device for the GPU.

On a GPU, a tensor made on the host meeting the model's weights in one operation, a
``.numpy()`` of a tensor on the device, or a generator on the other side of a draw fails
with torch's error; on the CPU all of these run, so a command whose code mixes them
passes every CPU test and breaks on the first GPU. :func:`simulated_device` makes the
mix visible here: ``--device cpu`` (``choose_device``) gives ``cpu:0``, a device torch
tells apart from ``cpu`` though both are the host, and :class:`DevicePlacement` marks what
would live on the GPU — parameters, whatever is moved to ``cpu:0`` or made there
(``device=``), whatever is computed from those — and records every operation that mixes a
marked tensor with an unmarked one (a 0-dimensional one excepted: torch moves those
itself), every ``.numpy()`` of a marked tensor, a host tensor indexed by a marked index,
and a generator of the other kind than the tensor it draws for. ``.cpu()`` and
``.to("cpu")`` give unmarked tensors, as on a GPU. While it is on, reads of marked values
take the paths a GPU takes (``rnnkit.deferred.waits``), and every layer whose function is
cuDNN's runs PyTorch's fused kernels (``use_fused("fused")``), as on a GPU.

What it cannot see: code that runs only where the device type is ``cuda`` (pinned
memory, the Triton steps, CUDA graphs); those have their own tests on a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import traceback
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

#: The stand-in for the GPU: the host under another name.
DEVICE = torch.device("cpu", 0)
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"  # the checkout, cut from file names

_FACTORIES = {
    "zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn",
    "randint", "randperm", "eye", "linspace", "logspace", "empty_strided", "scalar_tensor",
}  # fmt: skip
# torch's operations that take a host tensor beside device ones by design: a packed
# sequence's lengths and batch sizes stay on the host (PyTorch's rule, on a GPU too)
_HOST_ARGUMENTS = {
    "_pack_padded_sequence", "pack_padded_sequence", "_pad_packed_sequence",
    "pad_packed_sequence", "lstm", "gru", "rnn_tanh", "rnn_relu",
}  # fmt: skip
# a copy between devices, attribute access, Module.to's check before it converts
_NOT_COMPUTING = {"copy_", "__get__", "__set__", "_has_compatible_shallow_copy_type"}
_LIKE = {"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like"}
_NEW = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}


def _on_device(device: Any) -> bool | None:
    """True: the stand-in device; False: the host; None: not a device."""
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            return None
    if isinstance(device, torch.device):
        return device == DEVICE
    return None


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


_TorchGenerator = torch.Generator  # the class itself: torch.Generator is replaced below


class _Generator(_TorchGenerator):
    """A generator that remembers whether it was made for the stand-in device."""

    def __new__(cls, device: Any = None) -> _Generator:
        return _TorchGenerator.__new__(cls, device="cpu")  # type: ignore[call-arg]

    def __init__(self, device: Any = None) -> None:
        self.on_device = bool(_on_device(device))

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return DEVICE if self.on_device else torch.device("cpu")


class DevicePlacement(TorchFunctionMode):
    """``with DevicePlacement() as placed: ...``; ``placed.violations`` counts each kind of
    mix by the rnnkit lines that made it. ``parameters``: every parameter counts as on the
    device (a command's model is loaded there); False: only those moved there (a program
    that keeps a CPU reference model beside the device's)."""

    def __init__(self, parameters: bool = True) -> None:
        super().__init__()
        self._parameters = parameters
        self._marked: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self.violations: collections.Counter[str] = collections.Counter()

    def on_device(self, t: Any) -> bool:
        return (self._parameters and isinstance(t, nn.Parameter)) or (
            isinstance(t, torch.Tensor) and self._marked.get(id(t)) is t
        )

    def _mark(self, out: Any) -> None:
        for t in _tensors(out, []):
            self._marked[id(t)] = t

    def _record(self, kind: str, name: str) -> None:
        frames = [  # rnnkit's own lines, and the benchmarks'
            f"{f.filename.split('/src/')[-1].removeprefix(_ROOT)}:{f.lineno}"
            for f in traceback.extract_stack()[:-2]
            if "/src/rnnkit/" in f.filename or "/benchmarks/" in f.filename
        ]
        self.violations[f"{kind} ({name}) at {' <- '.join(reversed(frames[-3:]))}"] += 1

    def _check_generator(self, name: str, kwargs: dict, on_device: bool) -> None:
        gen = kwargs.get("generator")
        if isinstance(gen, _Generator) and gen.on_device != on_device:
            self._record("a generator of the other device", name)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == (
            "device"
        ):
            return DEVICE if self.on_device(args[0]) else func(*args, **kwargs)
        if name in ("to", "cpu"):
            return self._moved(func, name, args, kwargs)
        if name == "__set__" and getattr(getattr(func, "__self__", None), "__name__", "") == (
            "data"
        ):  # `p.data = t` (Module.to converts its parameters so): p goes where t is
            if self.on_device(args[1]):
                self._mark(args[0])
            else:
                self._marked.pop(id(args[0]), None)
            return func(*args, **kwargs)
        if name in ("numpy", "__array__"):
            if self.on_device(args[0]):
                self._record(".numpy() of a tensor on the device", name)
            return func(*args, **kwargs)
        if name in _FACTORIES:
            # no device given: torch's default (``with device:`` blocks set it)
            on = bool(_on_device(kwargs.get("device") or torch.get_default_device()))
            self._check_generator(name, kwargs, on)
            out = func(*args, **kwargs)
            if on:
                self._mark(out)
            return out
        if name in _LIKE or name in _NEW:
            given = _on_device(kwargs.get("device"))
            on = self.on_device(args[0]) if given is None else given
            self._check_generator(name, kwargs, on)
            out = func(*args, **kwargs)
            if on:
                self._mark(out)
            return out
        inputs = _tensors(args, []) + _tensors(kwargs, [])
        device = [t for t in inputs if self.on_device(t)]
        host = [t for t in inputs if not self.on_device(t) and t.dim() > 0]
        if name in ("__getitem__", "__setitem__"):
            index = _tensors(args[1], [])
            if not self.on_device(args[0]) and any(self.on_device(t) for t in index):
                self._record("a host tensor indexed on the device", name)
            value = args[2] if name == "__setitem__" else None
            written = isinstance(value, torch.Tensor) and value.dim() > 0 and index
            if written and self.on_device(value) != self.on_device(args[0]):
                self._record("an indexed write across devices", name)
        elif device and host and name not in _NOT_COMPUTING and name not in _HOST_ARGUMENTS:
            self._record("host and device tensors in one operation", name)
        if "generator" in kwargs and inputs:
            self._check_generator(name, kwargs, self.on_device(inputs[0]))
        out = func(*args, **kwargs)
        if device:  # computed from the device's tensors (a parameter's .grad too)
            self._mark(out)
        return out

    def _moved(self, func, name: str, args: tuple, kwargs: dict) -> Any:
        """``t.to(...)`` / ``t.cpu()``: marked where it goes to the device (or to a marked
        tensor's), unmarked where it goes to the host, as it was otherwise."""
        source = args[0]
        target: bool | None = False if name == "cpu" else None
        for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if target is not None:
                break
            target = self.on_device(a) if isinstance(a, torch.Tensor) else _on_device(a)
        out = func(*args, **kwargs)
        if target is None:
            if self.on_device(source):
                self._mark(out)
            return out
        if (
            out is source
            and not isinstance(source, nn.Parameter)
            and target != self.on_device(source)
        ):
            out = out.view_as(out)  # a tensor of its own, so that its mark can differ
        if target:
            self._mark(out)
        return out


@contextlib.contextmanager
def simulated_device(monkeypatch: Any) -> Iterator[DevicePlacement]:
    """Within the block, ``--device cpu`` loads onto :data:`DEVICE` and the placement is
    checked (see the module's text); reads of device values take a GPU's paths."""
    from rnnkit import deferred
    from rnnkit.app.tasks import settings
    from rnnkit.bptt.fused import use_fused

    original = settings.choose_device

    def choose(name: str, argument: str = "device") -> torch.device:
        device = original(name, argument)
        return DEVICE if device.type == "cpu" else device

    # every module that imported the function by name
    for module in list(sys.modules.values()):
        if getattr(module, "choose_device", None) is original:
            monkeypatch.setattr(module, "choose_device", choose)
    monkeypatch.setattr(torch, "Generator", _Generator)
    placement = DevicePlacement()
    monkeypatch.setattr(deferred, "waits", placement.on_device)
    with use_fused("fused"), placement:
        yield placement
