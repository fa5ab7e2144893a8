"""``torch.nn.RNN`` / ``LSTM`` / ``GRU`` with torch's exact interface, run by rnnkit.

Replacing ``from torch import nn`` by ``from rnnkit import nn`` keeps a program's
behaviour. The three classes *are* torch's (subclasses of ``torch.nn.RNN``, ``LSTM`` and
``GRU``): the same constructor, parameters, ``state_dict``, initial weights from the
same seed, ``_flat_weights``, ``flatten_parameters``, ``check_forward_args``,
``permute_hidden``, ``isinstance`` checks (so ``torch.ao.quantization.quantize_dynamic``
quantizes them as it does torch's), the same ``hx`` handling and state layout
``(L·D, B, H)``, ``PackedSequence`` in and out, unbatched ``(T, I)`` input. Only
``forward`` differs: the computation is rnnkit's stacked layers with the explicit BPTT,
fed these parameters.

PyTorch keeps two biases per gate; rnnkit's cells one. The cells are given
``b = b_ih + b_hh`` (for the GRU: ``b_ih + b_hh`` for r and z, and ``b_in`` with
``b_hn`` kept apart inside ``r ⊙ (W_hn h + b_hn)``), so the gradients reach both biases as
in torch. torch's GRU is rnnkit's ``update="keep", reset="after"``.

Where rnnkit has no such layer or a tool cannot see through its time loop, torch's own
``forward`` computes the same function: a projected LSTM (``proj_size > 0``),
``dropout=1``, a batch of size 0, TorchScript (``torch.jit.trace``, ``torch.jit.script``,
the TorchScript ONNX exporter), a graph being traced (``torch.compile``,
``torch.export``, the ONNX exporter), a ``torch.func`` transform (``grad``,
``jacrev``, ``jacfwd``, ``vmap``) and forward-mode AD (``torch.autograd.forward_ad``),
and wherever rnnkit would run PyTorch's fused kernels (a GPU: :func:`_fused_computes`):
there the drop-in is what torch's layer is, one
``aten.lstm``/``gru``/``rnn_*`` operator (a compiled program runs it eagerly between its
graphs, as it runs torch's), so a program compiles and exports as it does with torch's
layers. ``torch.fx.symbolic_trace`` records one ``call_module`` node, as for torch's
layers (:func:`fx_leaf_call`). A pickled model names the public
classes (``rnnkit.nn.LSTM``), so ``torch.load(..., weights_only=True)`` with those
allow-listed loads it. Dropout between layers draws torch's masks on the CPU (the same
draws from torch's generator, padded or packed: :class:`_RowsDropout`).
``docs/torch-nn.md`` lists the differences.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeGuard, cast

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.rnn import PackedSequence

from rnnkit.bptt.fused import fused_path_on, path_in_force, plain_step_call
from rnnkit.bptt.tracing import TracingError, transforming, vmapping
from rnnkit.cells.amp import autocast_devices_on, autocast_reconciles
from rnnkit.layers import cell_stacks
from rnnkit.layers.packing import pack_like, unpack
from rnnkit.layers.stacked import StackedRecurrent, between_layers
from rnnkit.types import LSTMState

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "dropin_forward",
    "fx_leaf_call",
    "overriding_forward",
    "plain_torch_copy",
    "scriptable_copy",
]


class _Stacks(threading.local):
    """One thread's inner stack of a drop-in, the configuration it was built for, its
    cells (layers, then directions, as torch orders them) and the training mode it was
    last set to (set on first use in each thread)."""

    stack: StackedRecurrent | None = None
    config: tuple[Any, ...] | None = None
    cells: list[nn.Module]
    training: bool | None = None

    def __reduce__(self) -> tuple[type[_Stacks], tuple[()]]:
        """A copy (``copy.deepcopy`` of a drop-in whose weights carry a parametrization,
        which copies its ``__dict__`` as it is) gets a room of its own, empty: a
        ``threading.local`` itself cannot be copied or pickled."""
        return (_Stacks, ())


def overriding_forward(module: nn.Module) -> type | None:
    """The user's subclass of a drop-in that defines its own ``forward`` over rnnkit's
    (the nearest in the method resolution order, ahead of rnnkit's classes), or None."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("rnnkit."):
            return None
        if "forward" in vars(cls):
            return cls
    return None


def scriptable_copy(module: nn.Module, torch_class: type[nn.Module]) -> nn.Module:
    """What ``torch.jit.script`` compiles in place of a drop-in: torch's class over the
    same parameters (:func:`plain_torch_copy`; TorchScript cannot compile rnnkit's time
    loop). Refused where that copy would silently compute something else: a subclass
    with a ``forward`` of its own (the copy has torch's), and a parametrized weight
    (the copy would hold the weight last computed, or none)."""
    name = f"rnnkit.nn.{torch_class.__name__}"
    own = overriding_forward(module)
    if own is not None:
        whose = type(module).__qualname__
        if own is not type(module):
            whose += f" (its forward is {own.__qualname__}'s)"
        raise TracingError(
            f"torch.jit.script: {whose} has a forward of its own over {name}'s, and "
            f"TorchScript compiles torch.nn.{torch_class.__name__} in place of a drop-in, "
            f"which would drop that forward; record it with torch.jit.trace, or use "
            f"torch.compile or torch.export"
        )
    if parametrize.is_parametrized(module):
        names = ", ".join(sorted(cast(Any, module).parametrizations.keys()))
        raise TracingError(
            f"torch.jit.script: {name}'s {names} carries a parametrization, which "
            f"TorchScript cannot compile (the scripted layer would hold a stale weight); "
            f"record it with torch.jit.trace, or use torch.compile or torch.export"
        )
    return plain_torch_copy(module, torch_class)


def plain_torch_copy(module: nn.Module, torch_class: type[nn.Module]) -> nn.Module:
    """The same module as an instance of ``torch_class`` (torch's own class), sharing its
    parameters: what TorchScript compiles in place of an rnnkit drop-in."""
    plain = torch_class.__new__(torch_class)
    plain.__dict__.update({k: v for k, v in module.__dict__.items() if k != "_inner"})
    return plain


def fx_leaf_call(module: nn.Module, input: Any, hx: Any) -> Any:
    """Under ``torch.fx.symbolic_trace``: one ``call_module`` node for the drop-in, as FX
    records torch's own layers (its tracer keeps the modules of ``torch.nn``'s package
    whole and would otherwise trace into ``forward``); else None. Where a call of the
    module runs more than this ``forward`` (a subclass's ``forward`` calling it, hooks),
    which the trace has recorded already, one ``call_function`` node of
    :func:`dropin_forward` on the module instead."""
    hx_parts = hx if isinstance(hx, tuple | list) else (hx,)
    proxy = next((a for a in (input, *hx_parts) if isinstance(a, torch.fx.Proxy)), None)
    if proxy is None:
        return None
    tracer = proxy.tracer
    args = (input,) if hx is None else (input, hx)
    if module is getattr(tracer, "root", None):
        raise torch.fx.proxy.TraceError(  # torch's type: its layers fail to trace alone too
            f"torch.fx.symbolic_trace: rnnkit.nn.{type(module).__name__} is recorded as one "
            f"node of the module holding it, and cannot be the traced module itself; trace "
            f"a module that holds it"
        )
    path = tracer.path_of_module(module)  # type: ignore[attr-defined]  # torch.fx.Tracer's
    if not _runs_more_than_forward(module):
        return tracer.create_proxy("call_module", path, args, {})
    # calling the module at each run of the graph would run again what the trace has
    # recorded already (a subclass's forward before this one, hooks): the node runs
    # the drop-in's own forward alone
    held = tracer.create_proxy("get_attr", path, (), {})
    return tracer.create_proxy("call_function", dropin_forward, (held, *args), {})


def _runs_more_than_forward(module: nn.Module) -> bool:
    """Whether a call of ``module`` runs more than its drop-in class's ``forward``: a
    subclass's or an instance's ``forward``, or hooks (its own or global ones)."""
    if overriding_forward(module) is not None or "forward" in module.__dict__:
        return True
    hooks = [
        getattr(module, name, None)
        for name in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        )
    ]
    hooks += [
        getattr(torch.nn.modules.module, f"_global_{kind}", None)
        for kind in ("forward_hooks", "forward_pre_hooks", "backward_hooks", "backward_pre_hooks")
    ]
    return any(hooks)


def dropin_forward(module: nn.Module, input: Any, hx: Any = None) -> Any:
    """A drop-in's own ``forward`` on ``(input, hx)``: its rnnkit class's (not a
    subclass's nor an instance's), without the module's hooks. What an FX graph calls
    where its trace has recorded the rest of the module's call already."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("rnnkit.") and "forward" in vars(cls):
            return vars(cls)["forward"](module, input, hx)
    raise TypeError(f"{type(module).__qualname__} is not an rnnkit.nn drop-in")


class _DropIn:
    """What the three classes add to torch's: rnnkit computes ``forward``.

    Mixed in before torch's class (``class LSTM(_DropIn, torch.nn.LSTM)``), so ``super()``
    is torch's class: its constructor, parameters and small API stay torch's."""

    _torch_class: type[nn.RNNBase]
    # torch's attributes (set by torch's constructor), as this mixin reads them:
    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    batch_first: bool
    dropout: float
    bidirectional: bool
    proj_size: int
    mode: str
    _flat_weights_names: list[str]
    _flat_weights: list[Tensor | None]
    _parameters: dict[str, Any]
    _update_flat_weights: Callable[[], None]
    nonlinearity: str
    training: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # torch's class, next in the MRO
        self._build_inner()

    def _build_inner(self) -> None:
        """Room for the rnnkit stacks that compute (:meth:`_stack`), one per thread."""
        self.__dict__["_inner"] = _Stacks()

    def _config(self) -> tuple[Any, ...]:
        """What the inner stack is built from, read at each call as torch's ``forward``
        reads it (``lstm.dropout = 0.0`` after construction counts; a switch by its
        truth, as torch reads ``bidirectional="yes"``)."""
        return (
            self.mode,
            self.input_size,
            self.hidden_size,
            self.num_layers,
            bool(self.bidirectional),
            float(self.dropout),
            bool(self.batch_first),
        )

    def _stack(self) -> tuple[StackedRecurrent, list[nn.Module]]:
        """This thread's rnnkit stack for the current configuration, in the drop-in's
        training mode, and its cells (layers, then directions, as torch orders them).

        Its own parameters are placeholders on the meta device (no memory), replaced for
        each call by the ones derived from torch's (:func:`_swapped`, which puts them
        into the cells for the call's duration: hence one stack per thread, so that
        threads may call one layer at once, as they may torch's). Held outside the
        module tree: it adds nothing to ``state_dict()`` or ``parameters()``, and a
        pickle leaves it out (``__getstate__``)."""
        local: _Stacks = self.__dict__["_inner"]
        config = self._config()
        if local.stack is None or local.config != config:
            options: dict[str, Any] = {}
            if self.mode.startswith("RNN"):  # torch's forward reads the mode
                options["nonlinearity"] = "relu" if self.mode == "RNN_RELU" else "tanh"
            elif self.mode == "GRU":
                options = {"update": "keep", "reset": "after"}
            kind = {"LSTM": cell_stacks.LSTM, "GRU": cell_stacks.GRU}.get(
                self.mode, cell_stacks.RNN
            )
            _, I, H, L, bidirectional, dropout, batch_first = config
            # torch has warned already where this dropout does nothing
            args = (I, H, L, bidirectional, between_layers(dropout, L), batch_first)
            with _outside_transforms(), torch.device("meta"):
                stack = kind(*args, **options)
                stack.drop = _RowsDropout(stack.dropout)
            local.cells = list(stack.cells())
            local.stack, local.config, local.training = stack, config, None
        if local.training is not self.training:  # train() walks every submodule: once
            local.stack.train(self.training)
            local.training = self.training
        return local.stack, local.cells

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[misc]  # torch's: no weak references
        state.pop("_inner", None)  # rebuilt on load: a pickle names only public classes
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]  # torch's RNNBase.__setstate__
        self._build_inner()

    def __prepare_scriptable__(self) -> nn.Module:
        """``torch.jit.script`` compiles torch's class with these parameters (the same
        function; TorchScript cannot compile rnnkit's time loop)."""
        return scriptable_copy(self, self._torch_class)  # type: ignore[arg-type]

    # ---- computation -----------------------------------------------------------------

    def _weights(self) -> dict[str, Tensor]:
        """The weights by name, read as torch's ``forward`` reads them: refreshed
        (``_update_flat_weights``) and then taken from ``_flat_weights``. A
        parametrization (``weight_norm``, ``spectral_norm``, a weight-dropping one)
        thus runs as many times per call as with torch's layer, which evaluates it once
        to see whether the weights changed and again to take them, and the values used
        are the last ones: the same random draws, the same power iteration."""
        self._update_flat_weights()
        pairs = zip(self._flat_weights_names, self._flat_weights, strict=True)
        return {name: w for name, w in pairs if w is not None}

    def _cell_tensors(self, cells: int, weights: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """Each inner cell's parameters from torch's (``weights``, :meth:`_weights`), by
        name: one bias per gate."""
        H = self.hidden_size
        D = 2 if self.bidirectional else 1
        out: list[dict[str, Tensor]] = []
        for index in range(cells):
            layer, direction = divmod(index, D)
            sfx = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih = weights["weight_ih" + sfx]
            cell = {"weight_ih": w_ih, "weight_hh": weights["weight_hh" + sfx]}
            if self.bias:
                b_ih, b_hh = weights["bias_ih" + sfx], weights["bias_hh" + sfx]
            else:
                b_ih = b_hh = w_ih.new_zeros(w_ih.shape[0])
            if self.mode == "GRU":
                cell["bias"] = torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
                cell["bias_hn"] = b_hh[2 * H :]
            else:
                cell["bias"] = b_ih + b_hh
            out.append(cell)
        return out

    def _check_hx(self, hx: Tensor, B: int, batched: bool, what: str, weight: Tensor) -> Tensor:
        name = f"rnnkit.nn.{type(self).__name__}"
        D = 2 if self.bidirectional else 1
        expected = (self.num_layers * D, B, self.hidden_size)
        if not isinstance(hx, Tensor):
            raise TypeError(f"{name}: {what} must be a torch.Tensor, got {type(hx).__name__}")
        if not batched:
            if hx.dim() != 2:
                raise RuntimeError(
                    f"{name}: For unbatched 2-D input, {what} should also be 2-D but got "
                    f"{hx.dim()}-D tensor"
                )
            hx = hx.unsqueeze(1)
        if tuple(hx.shape) != expected:
            raise RuntimeError(
                f"{name}: Expected {what} size {expected} (num_layers·num_directions, batch, "
                f"hidden_size), got {list(hx.shape)}"
            )
        if hx.device != weight.device:
            raise RuntimeError(  # torch's type and words (its kernels' device check)
                f"{name}: Input and hidden tensors are not at the same device, found input "
                f"tensor at {weight.device} and hidden tensor at {hx.device}; move {what} "
                f"({what}.to({str(weight.device)!r}))"
            )
        if not _dtype_accepted(hx, weight):
            raise RuntimeError(  # torch's type: its product of hx and weight_hh fails
                f"{name}: {what} is {hx.dtype} but the weights are "
                f"{weight.dtype}; convert {what} ({what}.to({weight.dtype}))"
            )
        return hx

    def _check_input(self, x: Tensor, weight: Tensor) -> None:
        """torch's checks of the input, with torch's exception types: its feature size
        (``RuntimeError``) and its dtype (``ValueError``; under autocast the dtypes that
        autocast casts are accepted, ``rnnkit.cells.amp.autocast_reconciles``, and the
        others are the ``RuntimeError`` of torch's product)."""
        name = f"rnnkit.nn.{type(self).__name__}"
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"{name}: input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {x.shape[-1]}"
            )
        if not _dtype_accepted(x, weight):
            error = RuntimeError if torch.is_autocast_enabled(x.device.type) else ValueError
            raise error(
                f"{name}: input dtype ({x.dtype}) does not match weight dtype "
                f"({weight.dtype}). Convert input: input.to({weight.dtype}), or convert "
                f"model: model.to({x.dtype})"
            )
        # after torch's dtype check (its Python check_input), before its kernels'
        if x.device != weight.device:
            raise RuntimeError(  # torch's type and words (its kernels' device check)
                f"{name}: Input and parameter tensors are not at the same device, found input "
                f"tensor at {x.device} and parameter tensor at {weight.device}; move the input "
                f"(input.to({str(weight.device)!r})) or the model (model.to({str(x.device)!r}))"
            )

    def forward(self, input: Tensor | PackedSequence, hx: Any = None) -> tuple[Any, Any]:
        """torch's forward: ``(output, h_n)``, or ``(output, (h_n, c_n))`` for the LSTM.

        Args:
            input: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), ``(T, I)``
                unbatched, or a ``PackedSequence``.
            hx: ``h_0 (L·D, B, H)`` (LSTM: the pair ``(h_0, c_0)``); None = zeros.

        Returns:
            ``output`` of the input's kind (``(T, B, D·H)``, ``(T, D·H)`` or packed) and
            the final states ``(L·D, B, H)``, each sequence's after its last real step.
        """
        if _plain_cpu_step(input) and (plain := self._plain_step(input, hx)) is not None:
            return plain
        traced = fx_leaf_call(self, input, hx)  # type: ignore[arg-type]
        if traced is not None:
            return traced
        name = f"rnnkit.nn.{type(self).__name__}"
        if self._torch_computes(input):
            return self._torch_class.forward(self, input, hx)
        if self._handed_over(input, hx):
            try:
                return self._torch_class.forward(self, input, hx)
            except _DEVICE_FAILURES:
                raise  # the device's failure (out of memory, a CUDA error), not the input's
            except (RuntimeError, ValueError, TypeError):
                pass  # bad input: rnnkit's checks below say what, naming the layer
        packed_input = input if isinstance(input, PackedSequence) else None
        lengths = None
        if packed_input is not None:
            x, lengths = unpack(packed_input, batch_first=self.batch_first)
            batched = True
        else:
            if not isinstance(input, Tensor):
                raise TypeError(f"{name}: input must be a Tensor or a PackedSequence")
            if input.dim() not in (2, 3):
                raise ValueError(
                    f"{name}: Expected input to be 2D or 3D, got {input.dim()}D instead"
                )
            batched = input.dim() == 3
            x = input if batched else input.unsqueeze(1 if not self.batch_first else 0)
        weights = self._weights()
        w_ih = weights["weight_ih_l0"]  # what torch's checks compare with
        self._check_input(x, w_ih)
        B = x.shape[0] if self.batch_first else x.shape[1]
        h0: tuple[Tensor, ...] | None = None  # (L·D, B, H) each
        if hx is not None:
            if self.mode == "LSTM":
                if not isinstance(hx, tuple | list) or len(hx) != 2:
                    raise TypeError(f"{name}: hx must be the pair (h_0, c_0), as for torch")
                h0 = (
                    self._check_hx(hx[0], B, batched, "hx[0]", w_ih),
                    self._check_hx(hx[1], B, batched, "hx[1]", w_ih),
                )
            else:
                if isinstance(hx, tuple | list):
                    raise TypeError(f"{name}: hx must be one tensor (L·D, B, H), as for torch")
                h0 = (self._check_hx(hx, B, batched, "hx", w_ih),)
        cells = None
        if packed_input is None and self._one_step_in_cells(x):
            cells = self._by_cell(weights)
        if cells is not None:
            outputs, final = self._cell_steps(x, h0, cells)
        else:
            outputs, final = self._through_stack(x, lengths, h0, weights, packed_input)
        if packed_input is not None:
            return pack_like(outputs, packed_input, self.batch_first), final
        if outputs.requires_grad and outputs._is_view():
            # a view of the autograd node's state buffer, which its backward reads: a copy,
            # so that the output can be changed in place (``out += skip``) as torch's can
            outputs = outputs.clone()
        if not batched:
            outputs = outputs.squeeze(0 if self.batch_first else 1)
            final = tuple(f.squeeze(1) for f in final) if isinstance(final, tuple) else final
            if not isinstance(final, tuple):
                final = final.squeeze(1)
        return outputs, final

    def _through_stack(
        self,
        x: Tensor,
        lengths: Tensor | None,
        h0: tuple[Tensor, ...] | None,
        weights: dict[str, Tensor],
        packed_input: PackedSequence | None,
    ) -> tuple[Tensor, Any]:
        """The call on rnnkit's stack: ``x (B, T, I)`` (``(T, B, I)``) → ``(output, h_n)``
        in torch's layout, ``h_n (L·D, B, H)`` (the LSTM's pair)."""
        state: Any = None
        if h0 is not None:
            parts = [self._split(h) for h in h0]
            state = LSTMState(*parts) if self.mode == "LSTM" else parts[0]
        inner, cells = self._stack()
        if lengths is not None:
            lengths = lengths.to(x.device)
        drop: _RowsDropout = inner.drop  # type: ignore[assignment]  # set in _stack
        drop.packed = packed_input
        try:
            with _swapped(cells, self._cell_tensors(len(cells), weights)):
                out = inner(x, lengths=lengths, state=state)
        finally:
            drop.packed = None
        if isinstance(out.state, LSTMState):
            return out.outputs, (self._join(out.state.h), self._join(out.state.c))
        return out.outputs, self._join(out.state)

    def _one_step_in_cells(self, x: Tensor) -> bool:
        """Whether this call of one time step (``x`` 3-D) runs as torch's fused cell
        operators on torch's weights (:meth:`_cell_steps`): on the CPU under the default
        path (:func:`_one_step`), not under a ``torch.func`` transform."""
        time_axis = 1 if self.batch_first else 0
        return x.shape[time_axis] == 1 and _one_step(x) and not transforming()

    def _plain_step(self, input: Tensor, hx: Any) -> tuple[Tensor, Any] | None:
        """The common single step (``forward``'s first look, after ``_plain_cpu_step``):
        ``input (B, 1, I)`` (``(1, B, I)``), ``hx`` None or of the right shape and
        dtype, torch's own class (no parametrization, :meth:`_parameters_by_cell`),
        ``B > 0``, no projection → :meth:`_cell_steps` on the weights in
        ``_parameters``, the same operators on the same tensors as the checked path,
        with none of its looks. None for anything else: the checked path decides (and
        says what is wrong)."""
        if input.dim() != 3 or self.proj_size > 0 or self.dropout >= 1:
            return None
        time_axis, batch_axis = (1, 0) if self.batch_first else (0, 1)
        B = input.shape[batch_axis]
        if input.shape[time_axis] != 1 or B == 0 or input.shape[2] != self.input_size:
            return None
        weights = self._parameters_by_cell()
        if weights is None or weights[0][0].dtype != input.dtype:
            return None
        h0: tuple[Tensor, ...] | None = None
        if hx is not None:
            h0 = tuple(hx) if self.mode == "LSTM" and type(hx) in (tuple, list) else (hx,)
            shape = (len(weights), B, self.hidden_size)
            if len(h0) != (2 if self.mode == "LSTM" else 1) or not all(
                type(h) is Tensor and h.shape == shape and h.dtype == input.dtype for h in h0
            ):
                return None
        outputs, final = self._cell_steps(input, h0, weights)
        if outputs.requires_grad and outputs._is_view():
            outputs = outputs.clone()  # as forward's: the output may be changed in place
        return outputs, final

    def _parameters_by_cell(self) -> list[tuple[Tensor, Tensor, Any, Any]] | None:
        """:meth:`_by_cell` straight from ``_parameters``: what torch's ``forward``
        reads after refreshing ``_flat_weights`` (which looks at every weight through
        ``nn.Module.__getattr__``, ~1 µs each). None where attributes could find
        something else: a subclass (a parametrization makes one, whose properties
        compute the weights) or a weight missing there (moved out by
        ``torch.nn.utils.weight_norm``'s hook or a weight-dropping wrapper)."""
        if type(self) not in _DROPIN_CLASSES:
            return None
        return self._by_cell(self._parameters)

    def _by_cell(self, weights: Mapping[str, Any]) -> list[tuple[Tensor, Tensor, Any, Any]] | None:
        """Each cell's ``(w_ih, w_hh, b_ih, b_hh)`` (layers, then directions; biases
        None without ``bias``), as :meth:`_cell_steps` takes them, from ``weights`` by
        torch's names; None where a name is missing or a cell has not two or four (a
        projection)."""
        names = self._flat_weights_names
        per = len(names) // (self.num_layers * (2 if self.bidirectional else 1))
        if per not in (2, 4):
            return None
        try:
            w = [weights[n] for n in names]
        except KeyError:
            return None
        return [
            (w[i], w[i + 1], w[i + 2], w[i + 3]) if per == 4 else (w[i], w[i + 1], None, None)
            for i in range(0, len(w), per)
        ]

    def _cell_steps(
        self,
        x: Tensor,
        h0: tuple[Tensor, ...] | None,
        weights: list[tuple[Tensor, Tensor, Any, Any]],
    ) -> tuple[Tensor, Any]:
        """One time step of every layer and direction, each torch's fused cell operator
        (``torch.lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``, ``rnn_relu_cell``) on
        torch's own weights (``weights``: each cell's, layers then directions): ``x (B,
        1, I)`` (``(1, B, I)``), ``h0`` each ``(L·D, B, H)`` or None (zeros) →
        ``(output, h_n)`` as torch's ``forward`` returns them. The same
        function as torch's layer (a reverse direction over one step is a step), with its
        dropout between layers drawn as torch draws it (``B·D·H`` values in the order of
        the layer's output). Why not torch's ``forward``: on the CPU an LSTM's runs
        oneDNN, which prepares its weights at every call, many times a step's cost (1 ms
        against 40 µs for one step of a 256-unit layer); a GRU's or a simple cell's
        ``forward`` costs more around the same step than these operators."""
        D = 2 if self.bidirectional else 1
        step = x.select(1 if self.batch_first else 0, 0)  # (B, I)
        lstm = self.mode == "LSTM"
        # each cell's initial state(s) (B, H), by one unbind each (indexing costs ~1 µs)
        starts: list[tuple[Tensor, ...]]
        if h0 is None:
            zeros = step.new_zeros(step.shape[0], self.hidden_size)
            starts = [(zeros, zeros) if lstm else (zeros,)] * len(weights)
        else:
            starts = list(zip(*(h.unbind(0) for h in h0), strict=True))
        op = _CELL_OPS[self.mode]
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        h = step
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0 and self.training:
                h = nn.functional.dropout(h, self.dropout, True)
            outs = []
            for d in range(D):
                k = layer * D + d
                if lstm:
                    h_k, c_k = op(h, starts[k], *weights[k])
                    cs.append(c_k)
                else:
                    h_k = op(h, starts[k][0], *weights[k])
                hs.append(h_k)
                outs.append(h_k)
            h = outs[0] if D == 1 else torch.cat(outs, dim=-1)
        output = h.unsqueeze(1 if self.batch_first else 0)
        h_n = torch.stack(hs)
        return output, ((h_n, torch.stack(cs)) if lstm else h_n)

    def _torch_computes(self, input: Tensor | PackedSequence) -> bool:
        """Whether torch's own ``forward`` computes this call (module docstring)."""
        if torch.jit.is_scripting() or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return True
        if transforming():
            # torch.func / forward AD: torch's operators have the rules, except vmap's
            # (no batching rule for aten::lstm) and, for a PackedSequence, grad's (its
            # packed operator reads the data's memory: "Cannot access data pointer of
            # Tensor that doesn't have storage"): there rnnkit's plain steps run
            packed = isinstance(input, PackedSequence)
            if packed and input.data.shape[0] == 0:
                return True
            if self.proj_size > 0 and (packed or vmapping()):
                where, instead = (
                    ("vmap", "call the layer on the whole batch instead")
                    if vmapping()
                    else ("a torch.func transform on a PackedSequence", "pass the padded tensor")
                )
                raise TracingError(
                    f"rnnkit.nn.{type(self).__name__}: a projected LSTM (proj_size="
                    f"{self.proj_size}) cannot run under {where}: torch's kernel has no rule "
                    f"there and rnnkit has no projected layer; {instead}"
                )
            return not packed and not vmapping()
        if self.proj_size > 0 or self.dropout >= 1:  # no such rnnkit layer
            return True
        if isinstance(input, PackedSequence):
            return input.data.shape[0] == 0
        batch_axis = 0 if self.batch_first else 1
        return isinstance(input, Tensor) and input.dim() == 3 and input.shape[batch_axis] == 0

    def _handed_over(self, input: Tensor | PackedSequence, hx: Any = None) -> bool:
        """Whether this call, which rnnkit could compute, is torch's ``forward`` for speed:
        where rnnkit would run PyTorch's fused kernels (:func:`_fused_computes`). The
        same function either way; an error of torch's there is left to rnnkit's checks
        to say. (A call of one time step on the CPU runs torch's cell operators instead,
        :meth:`_cell_steps`.) Not under a
        ``torch.func`` transform (:meth:`_torch_computes` decides there: under ``vmap``
        torch's operators have no batching rule)."""
        if transforming():
            return False
        if isinstance(input, PackedSequence):
            return _fused_computes(input.data)
        if not isinstance(input, Tensor) or input.dim() not in (2, 3):
            return False
        time_axis = 1 if self.batch_first and input.dim() == 3 else 0
        steps = input.shape[time_axis]
        if steps == 0:
            return False
        if _fused_computes(input):
            return True
        # the parameters, not _weights(): that would run a parametrization (a weight
        # drop's draw) once more than torch's forward does
        return steps <= SHORT_STEPS and _short_inference(
            input, hx, cast(nn.Module, self).parameters(), pair=self.mode == "LSTM"
        )

    def _split(self, h: Tensor) -> Tensor:
        """``(L·D, B, H)`` → ``(L, D, B, H)`` (torch orders layers, then directions)."""
        D = 2 if self.bidirectional else 1
        return h.reshape(self.num_layers, D, *h.shape[1:])

    def _join(self, h: Tensor) -> Tensor:
        """``(L, D, B, H)`` → torch's ``(L·D, B, H)``, a tensor of its own as torch's is
        (not a view: ``h_n.detach_()`` between truncated segments works)."""
        joined = h.reshape(-1, *h.shape[2:])
        return joined.clone() if joined._is_view() else joined


class _RowsDropout(nn.Dropout):
    """The dropout between a drop-in's layers, drawing torch's masks.

    torch drops out what one layer hands the next: for a ``PackedSequence`` its rows
    ``(N, D·H)``, for a padded input the whole ``(T, B, D·H)``. The same draws from
    torch's generator in the same order give the same masks, and leave the generator
    where torch's layer leaves it, so a seeded program's later random numbers (other
    dropouts, a sampler's shuffle) stay torch's too. ``packed`` is the call's packed
    input (set for the call's duration; the inner stacks are one per thread)."""

    packed: PackedSequence | None = None

    def forward(self, h: Tensor) -> Tensor:
        """``h (T, B, D·H)``, time-major in the original batch order → the same, dropped out."""
        like = self.packed
        if like is None or not self.training or self.p == 0:
            return super().forward(h)
        rows = super().forward(pack_like(h, like).data)  # (N, D·H), torch's packed order
        dropped = PackedSequence(rows, like.batch_sizes, like.sorted_indices, like.unsorted_indices)
        return unpack(dropped)[0]


@contextlib.contextmanager
def _swapped(cells: list[nn.Module], tensors: list[dict[str, Tensor]]) -> Iterator[None]:
    """The cells hold ``tensors`` as their parameters inside the block, their own
    placeholders again after it (an error included). What ``torch.func.functional_call``
    does for a whole module, for the few names known here: a parameter slot takes any
    tensor, so autograd reaches the drop-in's own parameters through the call."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for cell, named in zip(cells, tensors, strict=True):
            slots: dict[str, Any] = cell._parameters  # a slot takes a plain tensor too
            for name, tensor in named.items():
                saved.append((slots, name, slots[name]))
                slots[name] = tensor
        yield
    finally:
        for slots, name, placeholder in reversed(saved):
            slots[name] = placeholder


#: What a call handed to torch's ``forward`` raises that says nothing of its input, so
#: that rnnkit must not compute the call again: the device ran out of memory, or a CUDA
#: error (often an earlier kernel's, reported asynchronously). Both subclass RuntimeError.
_DEVICE_FAILURES: tuple[type[BaseException], ...] = tuple(
    e
    for e in (getattr(torch, "OutOfMemoryError", None), getattr(torch, "AcceleratorError", None))
    if e is not None
)


def _fused_computes(x: Tensor) -> bool:
    """Whether torch's own ``forward`` computes a drop-in's call on ``x`` because rnnkit
    would run it on PyTorch's fused kernels anyway (cuDNN on a GPU: the path in force,
    :func:`rnnkit.bptt.fused.fused_path_on`). They compute every drop-in's function (an
    LSTM, a GRU in torch's form, a ``tanh`` or ``relu`` cell; the lengths of a packed
    sequence), and torch's ``forward`` is that computation whole: one call for the
    stack, on torch's flat weights, with torch's dropout between layers, and nothing of
    rnnkit's around it. Not where rnnkit computes otherwise than torch: under autocast
    (rnnkit in the weights' dtype, torch in the low precision) and for float16 or
    bfloat16 on the CPU (rnnkit in float32, rounded once); an empty time axis is the
    caller's to exclude (torch's kernels refuse it, rnnkit returns the initial state)."""
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        return False
    return fused_path_on(x.device) and not autocast_devices_on()


#: The longest call without gradients that the CPU hands to torch's kernel under the
#: default path: rnnkit's fixed cost per call is larger than torch's, and a short call has
#: too few steps for its faster loop to make up for it (inference, 10 steps, H 32–128,
#: B 1–16, one and two threads: rnnkit's loop took 0.45–0.81× torch's speed for the LSTM,
#: 1.0–3.0× torch's time for the simple RNN and 0.91–1.84× for the GRU;
#: ``benchmarks/README.md``). torch's kernel computes the same function.
SHORT_STEPS = 16


def _short_inference(x: Tensor, hx: Any, weights: Iterable[Tensor], *, pair: bool) -> bool:
    """Whether a drop-in's call on ``x`` (initial state ``hx``) is inference on the CPU
    under the default path, in float32 or float64, not under autocast: no gradient is
    asked of it (grad mode off, or neither ``x``, the state nor a weight requires one);
    ``hx`` None, or the tensor (``pair``: the LSTM's pair of tensors) torch's ``forward``
    takes without an error of its own (a malformed state goes to rnnkit's checks, which
    name the layer)."""
    if not _one_step(x):  # the CPU's default path, float32/64, no autocast: its test
        return False
    states: tuple[Any, ...] = ()
    if hx is not None:
        if pair:
            if type(hx) not in (tuple, list) or len(hx) != 2:
                return False
            states = tuple(hx)
        else:
            states = (hx,)
        if not all(isinstance(t, Tensor) and t.dim() == x.dim() for t in states):
            return False
    if not torch.is_grad_enabled():
        return True
    return not any(t.requires_grad for t in (x, *states, *weights))


def _one_step(x: Tensor) -> bool:
    """Whether a drop-in's call of one time step on the CPU (a decoder calling its layer
    step by step) runs torch's fused step operators (a layer's
    :meth:`_DropIn._cell_steps`, a cell's torch ``forward``): there is no time loop for
    rnnkit to run, only its fixed cost per call, several times the step's own at small
    sizes (``benchmarks/README.md``); torch's operators compute the same function. Under
    the default path only (``"loop"`` and ``"triton"`` force rnnkit's), in float32 or
    float64, not under autocast (see :func:`_fused_computes`)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and path_in_force() == "auto"
        and not autocast_devices_on()
    )


def _plain_cpu_step(x: Any) -> TypeGuard[Tensor]:
    """The common case of :func:`_one_step`, in as few looks as possible (a decoder asks
    at every step, and each look costs ~0.1 µs against a ~30 µs step): ``x`` a plain
    CPU tensor (not a subclass, not an FX proxy) in float32 or float64, no
    ``torch.func`` transform or forward-AD level (``rnnkit.bptt.tracing.transforming``'s
    two looks), no autocast, the default path, no graph being traced (``torch.compile``,
    ``torch.jit.trace``: there the drop-ins' checked path decides, as it always has).
    Where it says True, torch's fused step computes the call; where it says False, the
    drop-in's full checks decide. (The library stacks' look, on the CPU only.)"""
    return type(x) is Tensor and x.is_cpu and plain_step_call(x)


#: torch's fused operator of one step of each drop-in's cell (torch's ``mode``)
_CELL_OPS: dict[str, Callable[..., Any]] = {
    "LSTM": torch.lstm_cell,
    "GRU": torch.gru_cell,
    "RNN_TANH": torch.rnn_tanh_cell,
    "RNN_RELU": torch.rnn_relu_cell,
}


def _dtype_accepted(t: Tensor, weight: Tensor) -> bool:
    """Whether ``t`` may meet ``weight`` in a drop-in: the same dtype, or under autocast
    one that autocast casts (``rnnkit.cells.amp.autocast_reconciles``)."""
    if t.dtype == weight.dtype:
        return True
    return torch.is_autocast_enabled(t.device.type) and autocast_reconciles(t.dtype, weight.dtype)


def _outside_transforms() -> contextlib.AbstractContextManager[Any]:
    """Leave the ``torch.func`` transforms for a while: the inner stack's placeholders are
    initialised at random (on the meta device, at no cost), which ``vmap`` refuses
    inside it ("called random operation while in randomness error mode")."""
    if not transforming():
        return contextlib.nullcontext()
    from torch._functorch import pyfunctorch  # torch's own way out (its autograd.Function)

    clear = getattr(pyfunctorch, "temporarily_clear_interpreter_stack", None)
    return clear() if clear is not None else contextlib.nullcontext()


class RNN(_DropIn, nn.RNN):
    """``torch.nn.RNN``: ``RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh",
    bias=True, batch_first=False, dropout=0.0, bidirectional=False, device=None,
    dtype=None)``, computed by rnnkit.

    >>> rnn = RNN(3, 4, 2)
    >>> out, h_n = rnn(torch.zeros(5, 2, 3))  # (T, B, I)
    >>> out.shape, h_n.shape, isinstance(rnn, torch.nn.RNN)
    (torch.Size([5, 2, 4]), torch.Size([2, 2, 4]), True)
    """

    _torch_class = nn.RNN


class LSTM(_DropIn, nn.LSTM):
    """``torch.nn.LSTM``: ``LSTM(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None,
    dtype=None)``, computed by rnnkit (``proj_size > 0``: by torch's kernels).

    >>> lstm = LSTM(3, 4, batch_first=True)
    >>> out, (h_n, c_n) = lstm(torch.zeros(2, 5, 3))  # (B, T, I)
    >>> out.shape, h_n.shape, c_n.shape
    (torch.Size([2, 5, 4]), torch.Size([1, 2, 4]), torch.Size([1, 2, 4]))
    """

    _torch_class = nn.LSTM


class GRU(_DropIn, nn.GRU):
    """``torch.nn.GRU``: ``GRU(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None)``,
    computed by rnnkit (``update="keep", reset="after"``).

    >>> out, h_n = GRU(3, 4, bidirectional=True)(torch.zeros(5, 3))  # unbatched (T, I)
    >>> out.shape, h_n.shape
    (torch.Size([5, 8]), torch.Size([2, 4]))
    """

    _torch_class = nn.GRU


#: the drop-in layers themselves (not a subclass: :meth:`_DropIn._parameters_by_cell`)
_DROPIN_CLASSES = frozenset((RNN, LSTM, GRU))

# Pickles (torch.save of a whole model) name the public classes, which is what a user
# allow-lists for torch.load(..., weights_only=True).
for _cls in (RNN, LSTM, GRU):
    _cls.__module__ = "rnnkit.nn"
