"""``torch.nn`` with its recurrent layers and cells computed by rnnkit.

``from rnnkit import nn  # was: from torch import nn`` keeps a program running unchanged:
every name of ``torch.nn`` is reachable here (``nn.Module``, ``nn.Linear``,
``nn.functional``, ``nn.utils.rnn``, ... are torch's own objects), and ``RNN``, ``LSTM``,
``GRU``, ``RNNCell``, ``LSTMCell``, ``GRUCell`` are replaced by subclasses of torch's
that compute with rnnkit (:mod:`rnnkit.layers.torch_nn`,
:mod:`rnnkit.layers.torch_nn_cells`; ``docs/torch-nn.md``).

>>> import torch
>>> from rnnkit import nn
>>> reference = torch.nn.LSTM(3, 4, num_layers=2)
>>> lstm = nn.LSTM(3, 4, num_layers=2)
>>> lstm.load_state_dict(reference.state_dict())
<All keys matched successfully>
>>> x = torch.randn(5, 2, 3)
>>> torch.allclose(lstm(x)[0], reference(x)[0], atol=1e-6)
True
>>> nn.Linear is torch.nn.Linear, isinstance(lstm, torch.nn.LSTM)
(True, True)
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

import torch

from rnnkit.layers.torch_nn import GRU, LSTM, RNN, plain_torch_copy
from rnnkit.layers.torch_nn_cells import GRUCell, LSTMCell, RNNCell

# rnnkit's own names (what ``from rnnkit.nn import *`` binds; after ``from torch.nn import
# *`` it replaces the six classes): with torch.nn's 180 names here, help(rnnkit.nn) would
# print all of torch.nn
__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "GRUCell",
    "LSTMCell",
    "RNNCell",
    "quantize_dynamic",
    "register_quantization",
]


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def __getattr__(name: str) -> Any:
    """Every other name is ``torch.nn``'s own (not its module attributes: torch's
    ``__path__`` would make Python load a second copy of torch's files as rnnkit.nn's)."""
    if not _is_dunder(name):
        try:
            return getattr(torch.nn, name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'rnnkit.nn' (torch.nn) has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(dir(torch.nn)) | set(__all__))


class _TorchPackage(types.ModuleType):
    """``rnnkit.nn.<package>`` for the import system: ``from rnnkit.nn.utils import prune``
    (or ``import *``) gives ``torch.nn.utils``'s own names, importing a submodule torch
    has not imported yet; setting or deleting a name (``mock.patch``) does it on torch's
    module, as the name says. Its ``__path__`` is empty, so ``import
    rnnkit.nn.<package>.<module>`` of a module not aliased yet is a plain
    ``ModuleNotFoundError``, never torch's file run again under another name (a second
    ``Parameter`` class that modules would not register)."""

    def __init__(self, name: str, package: types.ModuleType) -> None:
        super().__init__(name, package.__doc__)
        own = types.ModuleType.__setattr__  # this class's own: the rest goes to torch's
        own(self, "__path__", [])
        own(self, "__spec__", importlib.machinery.ModuleSpec(name, None, is_package=True))
        own(self, "_package", package)

    def __getattr__(self, name: str) -> Any:
        package = self.__dict__["_package"]
        if name == "__all__":
            names = getattr(package, "__all__", None)
            return list(names) if names is not None else [n for n in dir(package) if n[0] != "_"]
        if not _is_dunder(name):
            try:
                return getattr(package, name)
            except AttributeError:
                child = f"{package.__name__}.{name}"
                # a child imported already but not on its package was deleted there (a
                # mock.patch ending): not found, so that the patch puts the name back
                if child not in sys.modules and importlib.util.find_spec(child) is not None:
                    module = importlib.import_module(child)
                    _alias(f"{self.__name__}.{name}", module)
                    return module
        raise AttributeError(f"module {self.__name__!r} ({package.__name__}) has no {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_package"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__dict__["_package"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_package"])


def _alias(name: str, module: types.ModuleType) -> None:
    """Enter torch's ``module`` in ``sys.modules`` as ``name`` (a package as a
    :class:`_TorchPackage` over it), unless the name is taken."""
    if name not in sys.modules:
        sys.modules[name] = _TorchPackage(name, module) if hasattr(module, "__path__") else module


def _alias_torch_modules() -> None:
    """``import rnnkit.nn.functional``, ``from rnnkit.nn.utils.rnn import ...``,
    ``from rnnkit.nn.parameter import Parameter``: torch's own module objects, entered in
    ``sys.modules`` under rnnkit.nn's names (rnnkit's namespace only; nothing of torch's
    changes), for every ``torch.nn`` module imported so far."""
    prefix = "torch.nn."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and module is not None:
            _alias("rnnkit.nn." + name[len(prefix) :], module)


class _FromDropIn:
    """``from_float`` for a drop-in: torch's quantized module, built from torch's own class
    over the same parameters (torch's ``from_float`` accepts its exact classes only)."""

    def __init__(self, quantized: Any, torch_class: type[torch.nn.Module]) -> None:
        self.quantized, self.torch_class = quantized, torch_class

    def from_float(self, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> Any:
        plain = plain_torch_copy(mod, self.torch_class)
        return self.quantized.from_float(
            plain, use_precomputed_fake_quant=use_precomputed_fake_quant
        )


def _quantized_twins() -> tuple[dict[Any, Any], dict[Any, _FromDropIn]]:
    """torch's class → its drop-in, and each drop-in → how torch's quantized module is
    built from it."""
    from torch.ao.nn.quantized import dynamic as nnqd

    base = torch.nn
    twins = {base.LSTM: LSTM, base.GRU: GRU, base.LSTMCell: LSTMCell}
    twins |= {base.GRUCell: GRUCell, base.RNNCell: RNNCell}
    quantized = {LSTM: nnqd.LSTM, GRU: nnqd.GRU, LSTMCell: nnqd.LSTMCell}
    quantized |= {GRUCell: nnqd.GRUCell, RNNCell: nnqd.RNNCell}
    torch_of = {ours: theirs for theirs, ours in twins.items()}
    return twins, {c: _FromDropIn(q, torch_of[c]) for c, q in quantized.items()}


def register_quantization() -> None:
    """Let torch's own ``quantize_dynamic`` quantize the drop-ins: adds them to torch's
    default dynamic-quantization mapping (``torch.ao.quantization.quantization_mappings``),
    which is process-wide, so rnnkit does it only when asked.

    Afterwards the PyTorch recipe ``torch.ao.quantization.quantize_dynamic(model,
    {nn.LSTM, nn.Linear}, dtype=torch.qint8)`` with ``nn`` being ``rnnkit.nn`` quantizes
    the LSTM as it does torch's (the set names the drop-in's class). Without a set
    (``qconfig_spec=None``) torch picks modules by its own classes only: use
    :func:`quantize_dynamic` there. Calling it again changes nothing.
    """
    from torch.ao.quantization import quantization_mappings

    _, ours = _quantized_twins()
    quantization_mappings.get_default_dynamic_quant_module_mappings().update(ours)


def quantize_dynamic(
    model: torch.nn.Module,
    qconfig_spec: Any = None,
    dtype: torch.dtype = torch.qint8,
    mapping: dict[Any, Any] | None = None,
    inplace: bool = False,
) -> torch.nn.Module:
    """``torch.ao.quantization.quantize_dynamic`` that also quantizes the drop-ins.

    torch's function looks modules up by their exact class, so it leaves a subclass of
    ``torch.nn.LSTM`` as it is; this one maps rnnkit's ``LSTM``, ``GRU``, ``LSTMCell``,
    ``GRUCell`` and ``RNNCell`` to torch's quantized modules (which then compute, as for
    torch's layers), whether ``qconfig_spec`` names torch's classes or rnnkit's. Same
    arguments as torch's.
    """
    from torch.ao.quantization import quantization_mappings

    base = torch.nn
    twins, ours = _quantized_twins()
    if mapping is None:
        mapping = dict(quantization_mappings.get_default_dynamic_quant_module_mappings())
    mapping = {**mapping, **ours}
    if isinstance(qconfig_spec, set):
        qconfig_spec = qconfig_spec | {twins[c] for c in qconfig_spec if c in twins}
    elif isinstance(qconfig_spec, dict):
        qconfig_spec = {
            **qconfig_spec,
            **{twins[c]: v for c, v in qconfig_spec.items() if c in twins},
        }
    elif qconfig_spec is None and dtype in (torch.qint8, torch.float16):
        # torch's defaults for these dtypes: its recurrent layers, cells and Linear
        q = torch.ao.quantization
        qconfig = q.default_dynamic_qconfig if dtype == torch.qint8 else q.float16_dynamic_qconfig
        qconfig_spec = {c: qconfig for c in (*ours, base.Linear, *twins)}
    return torch.ao.quantization.quantize_dynamic(model, qconfig_spec, dtype, mapping, inplace)


_alias_torch_modules()
