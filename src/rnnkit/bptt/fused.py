"""PyTorch's fused recurrent kernels (cuDNN on a GPU) where they compute rnnkit's function.

``torch.nn.LSTM``'s kernels (``torch._VF.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``)
run a whole layer in one call, on a GPU through cuDNN. They compute the same function as
rnnkit's time loop for one direction of one layer when:

* the cell is an LSTM, a simple cell with ``tanh`` or ``relu``, or a GRU with
  ``reset="after"`` (cuDNN's form). A GRU with ``update="candidate"`` is run with its z
  rows negated: since 1 − σ(a) = σ(−a), that is the ``"keep"`` convention of the same
  function, and autograd carries the gradients back through the negation;
* every sequence's real steps are a prefix of the time axis (a mask that is lengths, as
  packed sequences are): rnnkit's held state after a sequence's last step is its final
  state, so the outputs there are filled with it. A sequence of length 0 keeps its
  initial state. A mask with holes inside a sequence has no fused equivalent;
* the backward is full BPTT (a segment of truncated BPTT is one call of full BPTT, its
  state carried by the caller): the windowed BPTT(τ) is not cuDNN's;
* the input is not a precomputed input product, and no graph is being traced.

rnnkit keeps one bias per gate, PyTorch two: the fused call gets the bias as its input
bias and zeros as its recurrent one (the GRU's ``b_hn`` as the recurrent bias of the n
rows), the same sums. The gradients are the fused kernel's own (cuDNN's backward); the
explicit BPTT stays the definition, and the tests hold the two equal in float64. Where
that backward cannot itself be differentiated (cuDNN's), a gradient taken with a graph
runs the call again in PyTorch's decomposition (:class:`_TwiceDifferentiable`).

Which path runs (:func:`use_fused`, or ``RNNKIT_GPU_PATH`` in the environment):

* ``"auto"`` (default): the fused kernels for CUDA tensors where the function is theirs;
  the library's time loop everywhere else (on the CPU the compiled loop is faster than
  PyTorch's kernels);
* ``"fused"``: the fused kernels wherever the function is theirs, on any device (for
  tests and comparisons on a machine without a GPU);
* ``"loop"``: never — the library's time loop with its explicit BPTT everywhere;
* ``"triton"``: the Triton steps (:mod:`rnnkit.bptt.gpu_steps`) wherever they compute the
  function, on any device (the CPU in Triton's interpreter, ``TRITON_INTERPRET=1``); the
  library's time loop elsewhere. Under ``"auto"`` they run for CUDA tensors where the
  fused kernels do not compute the function and triton is installed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.utils.weak import WeakIdKeyDictionary

from rnnkit.bptt.mask_facts import prefix_lengths
from rnnkit.bptt.tracing import exporting, tracing, transforming
from rnnkit.bptt.unrolled import replayed_gradients
from rnnkit.cells.amp import autocast_devices_on, without_autocast
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.cells.lstm import LSTMKernel, fused_lstm_cell
from rnnkit.cells.rnn import RNNKernel
from rnnkit.messages import quiet_in_module

__all__ = [
    "PATHS",
    "cell_step",
    "fused_form",
    "fused_path_on",
    "path_in_force",
    "plain_step_call",
    "run_fused",
    "run_fused_stack",
    "step_in_one_call",
    "traced_fused_form",
    "use_fused",
    "wants_fused",
]

#: The choices of :func:`use_fused` (and of ``RNNKIT_GPU_PATH``).
PATHS = ("auto", "fused", "loop", "triton")


def _from_environment() -> str:
    value = os.environ.get("RNNKIT_GPU_PATH", "auto").strip().lower() or "auto"
    # A wrong value must not make `import rnnkit` fail: it is refused where it is used.
    return value


_choice = {"path": _from_environment()}


@contextlib.contextmanager
def use_fused(path: str) -> Iterator[None]:
    """Run layers on ``path`` (``"auto"``, ``"fused"``, ``"loop"`` or ``"triton"``; the
    module docstring says what each means) inside the block.

    >>> with use_fused("loop"):
    ...     pass
    """
    if path not in PATHS:
        raise ValueError(f"path={path!r}: choose one of {', '.join(PATHS)}")
    before = _choice["path"]
    _choice["path"] = path
    try:
        yield
    finally:
        _choice["path"] = before


def _path() -> str:
    path = _choice["path"]
    if path not in PATHS:
        raise ValueError(
            f"RNNKIT_GPU_PATH={path!r} in the environment: choose one of {', '.join(PATHS)}"
        )
    return path


def path_in_force() -> str:
    """The path chosen now: :func:`use_fused`'s, else ``RNNKIT_GPU_PATH``'s, else
    ``"auto"``.

    >>> with use_fused("loop"):
    ...     path_in_force()
    'loop'
    """
    return _path()


def fused_path_on(device: torch.device) -> bool:
    """Whether the path in force runs PyTorch's fused kernels on ``device`` where they
    compute the function: ``"fused"`` anywhere, ``"auto"`` on a GPU.

    >>> fused_path_on(torch.device("cpu"))
    False
    """
    path = _path()
    return path == "fused" or (path == "auto" and device.type == "cuda")


def fused_form(kernel: Kernel) -> str | None:
    """The fused kernel that computes ``kernel``'s step (``"lstm"``, ``"gru"``,
    ``"rnn_tanh"``, ``"rnn_relu"``), or None where PyTorch has none (a GRU with
    ``reset="before"``, a simple cell with ``sigmoid``).

    >>> fused_form(GRUKernel("keep", "after")), fused_form(GRUKernel("keep", "before"))
    ('gru', None)
    """
    if isinstance(kernel, LSTMKernel):
        return "lstm"
    if isinstance(kernel, GRUKernel):
        return "gru" if kernel.reset == "after" else None
    if isinstance(kernel, RNNKernel) and kernel.nonlinearity in ("tanh", "relu"):
        return "rnn_" + kernel.nonlinearity
    return None


def wants_fused(
    kernel: Kernel, x: Tensor, mask: Tensor | None, window: int | None, projected: bool
) -> tuple[str, Tensor | None] | None:
    """``(form, lengths)`` when the fused kernels should run this layer (the path in
    force, the device, the function), else None. ``lengths`` is None when every step is
    real, else each row's length on the host. ``mask (T, B)`` bool, or None when every
    step is real. The first test costs nothing on the CPU's hot path: it returns before
    looking at the mask; the mask is read on the host once per mask
    (:mod:`rnnkit.bptt.mask_facts`: the layers of a call share the reading), not once per
    question."""
    if not fused_path_on(x.device) or window is not None or projected:
        return None
    form = fused_form(kernel)
    if form is None:
        return None
    if mask is None:
        return form, None
    lengths = prefix_lengths(mask)
    if lengths is None:
        return None
    if bool((lengths == mask.shape[0]).all()):  # on the host: no wait for the device
        return form, None
    return form, lengths


def step_in_one_call(x: Tensor) -> bool:
    """Whether a call of one time step on ``x`` runs as PyTorch's fused cell operators
    (:func:`cell_step`) where they compute the function: under the default path
    (``"auto"``; ``"fused"``, ``"loop"`` and ``"triton"`` keep their own), in float32 or
    float64 on the CPU or any floating dtype on a GPU, eager (not traced, not under a
    ``torch.func`` transform) and not under autocast. A decoder calls its layer one token
    at a time: there is no time loop to run, only the loop's fixed cost per call, several
    times the step's own at small sizes; and the whole-layer kernels are slower still for
    one step (on the CPU oneDNN's LSTM prepares its weights at every call: 1 ms for one
    step of a 256-unit LSTM, against 40 µs for the cell operator).

    >>> step_in_one_call(torch.zeros(1, 2, 3)), step_in_one_call(torch.zeros(1, 2, 3).half())
    (True, False)
    """
    if _path() != "auto" or tracing() or transforming() or autocast_devices_on():
        return False
    return x.device.type == "cuda" or x.dtype in (torch.float32, torch.float64)


_CPU_STEP_DTYPES = (torch.float32, torch.float64)
_interpreter = torch._C._functorch.peek_interpreter_stack


def plain_step_call(x: Tensor) -> bool:
    """The common case of :func:`step_in_one_call` in as few looks as possible (a
    generator asks at every token, each look ~0.1 µs): ``x`` a plain tensor (not a
    subclass, not a graph's proxy) on a GPU or in float32/float64, the default path, no
    graph being traced (``torch.compile``, ``torch.export``, ``torch.jit.trace``), no
    ``torch.func`` transform or forward-AD level, no autocast. True implies
    :func:`step_in_one_call`'s True; where it says False, the full checks decide.

    >>> plain_step_call(torch.zeros(1, 2, 3)), plain_step_call(torch.zeros(1, 2, 3).half())
    (True, False)
    """
    return (
        not torch.compiler.is_compiling()  # first: a traced graph reads nothing else here
        and type(x) is Tensor
        and (x.dtype in _CPU_STEP_DTYPES or x.is_cuda)
        and _choice["path"] == "auto"
        and _interpreter() is None
        and forward_ad._current_level < 0
        and not torch._C._is_tracing()
        and not autocast_devices_on()
    )


def cell_step(
    kernel: Kernel, form: str, x: Tensor, weights: Weights, states0: tuple[Tensor, ...]
) -> tuple[Tensor, ...]:
    """One step of ``kernel`` (whose :func:`fused_form` is ``form``) through PyTorch's
    fused cell operator (``torch.lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``,
    ``rnn_relu_cell``): ``x (B, I)``, ``states0`` each ``(B, H)`` → the new states, each
    ``(B, H)`` (``(h', c')`` or ``(h',)``). The conversions are :func:`run_fused`'s (one
    bias per gate, the GRU's update convention); gradients by autograd.

    >>> from rnnkit.cells.lstm import LSTMCell
    >>> cell = LSTMCell(3, 2)
    >>> h, c = cell_step(cell.kernel, "lstm", torch.ones(1, 3), cell.weights(),
    ...                  (torch.zeros(1, 2), torch.zeros(1, 2)))
    >>> torch.allclose(h, cell(torch.ones(1, 3)).h)
    True
    """
    if form == "lstm":
        w = weights
        h0, c0 = states0
        h, c = fused_lstm_cell(x, (h0, c0), w.weight_ih, w.weight_hh, w.bias)
        return h, c
    if form == "gru":
        w_ih, w_hh, b_ih, b_hh = _gru_parameters(kernel, weights)
        return (torch.gru_cell(x, states0[0], w_ih, w_hh, b_ih, b_hh),)
    w = weights
    op = torch.rnn_tanh_cell if form == "rnn_tanh" else torch.rnn_relu_cell
    return (op(x, states0[0], w.weight_ih, w.weight_hh, w.bias, None),)


# A GRU's weights in torch's form for its steps and fused calls, by its recurrent weight:
# what they were made from (identity, version counter, storage of each tensor) and those
# of them that are new tensors (None where one is the cell's own weight: a value must not
# hold its key, or the dictionary would keep the cell's weights alive after the cell).
_gru_kept: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _gru_parameters(kernel: Kernel, w: Weights) -> list[Tensor]:
    """``[w_ih, w_hh, b_ih, b_hh]`` of a GRU with ``reset="after"`` in torch's form
    (:func:`_fused_parameters` of :func:`_keep_form`). Made afresh where gradients flow
    (autograd must see the conversion) or a graph is traced; else kept between calls
    while the weights are the same tensors, unchanged, under the same update convention:
    a generator's step would otherwise make them again at every token, and an evaluation
    at every batch (the z rows negated for ``update="candidate"``, the recurrent bias
    assembled: on a GPU some seven kernels a cell)."""
    parts = (w.weight_ih, w.weight_hh, w.bias, w.bias_hn)
    # (an inference-mode tensor has no version counter: nothing to key on; inside a CUDA
    # graph's capture the conversion's kernels are recorded, not run: what it made holds
    # values only once the graph replays, so it is neither kept nor taken from the keep)
    if (
        torch.is_grad_enabled()
        or tracing()
        or any(t.is_inference() for t in parts if t is not None)
        or (w.weight_hh.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        return _fused_parameters("gru", _keep_form(kernel, w))
    # (a cell's `update` is a plain attribute, and it decides the z rows' sign)
    update = kernel.update if isinstance(kernel, GRUKernel) else None
    key = (update, *(None if t is None else (id(t), t._version, t.data_ptr()) for t in parts))
    own = (w.weight_ih, w.weight_hh, w.bias)  # torch's w_ih, w_hh, b_ih in "keep"
    kept = _gru_kept.get(w.weight_hh)
    if kept is None or kept[0] != key:
        params = _fused_parameters("gru", _keep_form(kernel, w))
        made = [None if i < len(own) and p is own[i] else p for i, p in enumerate(params)]
        kept = (key, made)
        _gru_kept[w.weight_hh] = kept
    return [own[i] if p is None else p for i, p in enumerate(kept[1])]


def traced_fused_form(
    kernel: Kernel,
    mask: Tensor | None,
    window: int | None,
    projected: bool,
    tensors: tuple[Tensor | None, ...] = (),
) -> str | None:
    """The fused kernel a traced graph (``torch.compile``, ``torch.export``, ONNX) holds
    for this layer as one operator, or None (the graph then holds the unrolled steps):
    no mask (a graph cannot branch on a mask's values), full BPTT, the path not forced
    to ``"loop"``, and either an export or a graph that computes no gradient of
    ``tensors``. Why not a compiled training step: AOTAutograd's backward of the CPU's
    fused LSTM (oneDNN's ``mkldnn_rnn_layer``) fails in torch 2.13 (the inductor and
    aot_eager backends alike), so a compiled training step keeps the unrolled steps."""
    if _path() == "loop" or mask is not None or window is not None or projected:
        return None
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if grads and not exporting():
        return None
    return fused_form(kernel)


def _fused_parameters(form: str, w: Weights, zero: Tensor | None = None) -> list[Tensor]:
    """``[w_ih, w_hh, b_ih, b_hh]`` in PyTorch's form for rnnkit's weights (gate orders are
    the same: LSTM i, f, g, o; GRU r, z, n). ``zero``: zeros as wide as the bias, read
    only (the cells of a stack share them), else new ones."""
    w_ih, w_hh, bias = w.weight_ih, w.weight_hh, w.bias
    b_hh = torch.zeros_like(bias) if zero is None else zero
    if form == "gru":
        H = w_hh.shape[1]
        assert w.bias_hn is not None  # a GRU with reset="after" always has it
        b_hh = torch.cat([b_hh[: 2 * H], w.bias_hn])
    return [w_ih, w_hh, bias, b_hh]


def _keep_form(kernel: Kernel, w: Weights, sign: Tensor | None = None) -> Weights:
    """A GRU with ``update="candidate"`` as the same function in the ``"keep"``
    convention: its z rows negated (1 − σ(a) = σ(−a)). ``sign``: :func:`_z_sign` for
    these weights (the cells of a stack share it), else made here."""
    if not isinstance(kernel, GRUKernel) or kernel.update == "keep":
        return w
    if sign is None:
        sign = _z_sign(w.bias)
    return Weights(
        w.weight_ih * sign[:, None], w.weight_hh * sign[:, None], w.bias * sign, w.bias_hn
    )


def _z_sign(bias: Tensor) -> Tensor:
    """``(3H,)``: −1 on a GRU's z rows, 1 elsewhere, like ``bias``."""
    H = bias.shape[0] // 3
    sign = bias.new_ones(3 * H)
    sign[H : 2 * H] = -1
    return sign


def _call(
    form: str,
    x: Tensor,
    hx: tuple[Tensor, ...],
    params: list[Tensor],
    batch_sizes: Tensor | None,
    train: bool,
    num_layers: int = 1,
    bidirectional: bool = False,
) -> tuple[Tensor, ...]:
    """One fused call, no dropout; ``hx`` each ``(L·D, B, H)``; ``params`` four a layer
    and direction, layer-major."""
    # cuDNN refuses an initial state that is not contiguous ("rnn: hx is not contiguous");
    # the CPU kernels take any, so a state a caller sliced or permuted failed on a GPU only
    hx = tuple(t.contiguous() for t in hx)
    call = _Call(form, batch_sizes, num_layers, train, bidirectional, len(hx))
    tensors = (x, *hx, *params)
    outputs = call.fused(tensors)
    if x.device.type in _ONCE_DIFFERENTIABLE_ON and outputs[0].requires_grad and not tracing():
        return _TwiceDifferentiable.apply(call, len(outputs), *outputs, *tensors)
    return outputs


#: Devices whose fused kernel's backward cannot itself be differentiated: cuDNN's
#: ("Double backwards is not supported for CuDNN RNNs"; MIOpen's the same).
_ONCE_DIFFERENTIABLE_ON = frozenset({"cuda"})


# cuDNN's note that a call's weights are not one buffer (``TORCH_WARN``, reported as a
# UserWarning from the Python line that made the call: this module's), ignored for this
# module's calls only (:func:`rnnkit.messages.quiet_in_module`).
_WEIGHT_COPY_MESSAGE = ".*contiguous chunk of memory"


class _Call:
    """The arguments of one fused call besides its tensors ``(x, *hx, *params)``."""

    def __init__(
        self,
        form: str,
        batch_sizes: Tensor | None,
        num_layers: int,
        train: bool,
        bidirectional: bool,
        n_states: int,
    ) -> None:
        self.form, self.batch_sizes, self.num_layers = form, batch_sizes, num_layers
        self.train, self.bidirectional, self.n_states = train, bidirectional, n_states

    def _args(self, tensors: tuple[Tensor, ...]) -> tuple[Any, ...]:
        x, hx, params = tensors[0], tensors[1 : 1 + self.n_states], tensors[1 + self.n_states :]
        h = hx if self.form == "lstm" else hx[0]
        L, two, train = self.num_layers, self.bidirectional, self.train
        if self.batch_sizes is None:
            return (x, h, list(params), True, L, 0.0, train, two, False)
        return (x, self.batch_sizes, h, list(params), True, L, 0.0, train, two)

    def fused(self, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The call through PyTorch's fused kernel (cuDNN on a GPU)."""
        op = getattr(torch._VF, self.form)
        args = self._args(tensors)
        # rnnkit's parameters are separate tensors, not one cuDNN buffer: cuDNN copies them
        # into one per call (a few MB at most) and warns that it does; that copy is the
        # price of keeping the cells' parameters as they are. (A graph being traced cannot
        # hold the warning filter; there the warning, if any, is the compiler's to show.)
        if not tracing() and tensors[0].device.type != "cpu":  # the warning is cuDNN's only
            quiet_in_module(_WEIGHT_COPY_MESSAGE, __name__)
        return tuple(op(*args))

    def decomposed(self, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The same call in PyTorch's own decomposition of it: the cell's operations step
        by step (``torch._decomp``, what ``torch.export`` lowers these kernels to), whose
        backward autograd can differentiate again. Slower than the fused kernel."""
        from torch._decomp import decomposition_table

        overload = "input" if self.batch_sizes is None else "data"
        decomposition = decomposition_table[getattr(getattr(torch.ops.aten, self.form), overload)]
        return tuple(decomposition(*self._args(tensors)))


class _TwiceDifferentiable(torch.autograd.Function):
    """The fused call's outputs, passed through, with a gradient that can be
    differentiated again.

    cuDNN's backward cannot be ("Double backwards is not supported for CuDNN RNNs", as
    for ``torch.nn.LSTM``), so a gradient penalty or a Hessian-vector product through a
    GPU layer would fail. This node takes the fused call's outputs and its inputs. A
    backward without a graph hands the incoming gradients to the fused kernel's own node
    (cuDNN's backward: a training step pays one Python call here); a backward with a
    graph (``create_graph=True``) instead runs the call again in PyTorch's decomposition
    from the saved inputs and differentiates that: the same function, its gradients
    functions of the inputs."""

    @staticmethod
    def forward(ctx: Any, call: _Call, n_outputs: int, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.call, ctx.n_outputs = call, n_outputs
        ctx.save_for_backward(*tensors[n_outputs:])
        ctx.set_materialize_grads(False)
        return tuple(o.detach() for o in tensors[:n_outputs])

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        n = ctx.n_outputs
        if not torch.is_grad_enabled():  # no graph: the fused kernel's own backward
            return (None, None, *grads, *(None for _ in ctx.needs_input_grad[2 + n :]))
        inputs = ctx.saved_tensors
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[2 + n :]) if need]
        result: list[Tensor | None] = [None] * (2 + n + len(inputs))
        if not wanted or all(g is None for g in grads):
            return tuple(result)
        got = replayed_gradients(ctx.call.decomposed, inputs, wanted, grads)
        for i, g in zip(wanted, got, strict=True):
            result[2 + n + i] = torch.zeros_like(inputs[i]) if g is None else g
        return tuple(result)


def _no_step(x: Tensor, params: list[Tensor]) -> Tensor:
    """An exact ``0`` that depends on ``x`` and every parameter without reading a value
    (a sum over none of their elements): where no step runs, the loop's gradients are
    zeros, not missing, so an optimizer or a gradient-norm clip sees every parameter."""
    return sum((t.reshape(-1)[:0].sum() for t in (x, *params)), x.new_zeros(()))


@without_autocast
def run_fused_stack(
    kernels: list[Kernel],
    form: str,
    x: Tensor,
    weights: list[Weights],
    hx: tuple[Tensor, ...],
    lengths: Tensor | None,
    bidirectional: bool,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """A whole stack, its layers and directions, in ONE call of PyTorch's fused kernel
    (cuDNN on a GPU runs the layers of one call as a wavefront; the host makes one call,
    not one per layer and direction with the reversals and concatenations between them).

    ``kernels`` and ``weights`` are the cells' in torch's order (layer-major, forward
    then reverse), every kernel one whose :func:`fused_form` is ``form``; ``hx`` the
    initial states in that order, each ``(L·D, B, H)`` (``(h, c)`` or ``(h,)``);
    ``x (T, B, I)``, ``T ≥ 1``;
    ``lengths (B,)`` on the host or None (every step real), not all 0. No dropout between
    the layers (the caller's condition: cuDNN's dropout draws its own masks, whose state
    a checkpoint cannot hold). Returns ``(outputs (T, B, D·H), finals)``, the outputs
    held after each sequence's last step as :func:`run_fused`'s (each direction's final
    state), ``finals`` the final states ``(L·D, B, H)`` (``(h, c)`` or ``(h,)``).
    """
    T, B = x.shape[0], x.shape[1]
    D = 2 if bidirectional else 1
    L = len(kernels) // D
    # made once for the stack's cells, all of one width: two kernels fewer a cell on a GPU
    if form == "gru" and not torch.is_grad_enabled():  # kept between calls
        params = [p for k, w in zip(kernels, weights, strict=True) for p in _gru_parameters(k, w)]
    else:
        zero = torch.zeros_like(weights[0].bias)
        sign = _z_sign(zero) if form == "gru" else None
        params = [
            p
            for kernel, w in zip(kernels, weights, strict=True)
            for p in _fused_parameters(form, _keep_form(kernel, w, sign), zero)
        ]
    train = torch.is_grad_enabled()
    if lengths is None:
        out, *ends = _call(form, x, hx, params, None, train, L, bidirectional)
        return out, tuple(ends)
    lengths = lengths.cpu()
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_lengths = lengths.index_select(0, order)
    real = int((sorted_lengths > 0).sum())
    rows = order[:real].to(x.device, non_blocking=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x.index_select(1, rows), sorted_lengths[:real], enforce_sorted=True
    )
    hx_rows = tuple(h.index_select(1, rows) for h in hx)
    sizes = packed.batch_sizes
    data, *ends = _call(form, packed.data, hx_rows, params, sizes, train, L, bidirectional)
    out_rows, _ = torch.nn.utils.rnn.pad_packed_sequence(
        torch.nn.utils.rnn.PackedSequence(data, packed.batch_sizes), total_length=T
    )
    # Back to the batch's order; rows of length 0 keep their initial states.
    finals = tuple(h.index_copy(1, rows, e) for h, e in zip(hx, ends, strict=True))
    outputs = x.new_zeros(T, B, out_rows.shape[-1]).index_copy(1, rows, out_rows)
    steps = torch.arange(T, device=x.device)
    real_step = (steps[:, None] < lengths.to(x.device, non_blocking=True))[..., None]
    # each direction of the top layer holds its final state after a sequence's last step
    held = torch.cat(finals[0][(L - 1) * D :].unbind(0), dim=-1)  # (B, D·H)
    return torch.where(real_step, outputs, held[None]), finals


@without_autocast
def run_fused(
    kernel: Kernel,
    form: str,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    lengths: Tensor | None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One direction of one layer through PyTorch's fused kernel: the same contract as
    ``run_recurrence`` (``x (T, B, I)`` with its padding already zeroed, ``states0`` each
    ``(B, H)``; returns outputs ``(T, B, H)``, held after each sequence's last step, and
    the final states ``(B, H)``; ``lengths (B,)`` int64 on the host, or None: every step
    real). Gradients by autograd through the fused kernel. ``T = 0`` returns empty
    outputs and the initial states without a call (with zero gradients, as the loop gives).

    Under ``torch.autocast`` the call runs with autocast off, in the weights' dtype, as the
    library's loop does (:mod:`rnnkit.cells.amp`): autocast would otherwise cast the fused
    kernel itself (cuDNN's ``_cudnn_rnn`` on a GPU, oneDNN's ``mkldnn_rnn_layer`` on the
    CPU) to float16/bfloat16, so that the state's rounding compounded over the steps and
    the outputs came back in the low precision."""
    T, B = x.shape[0], x.shape[1]
    if form == "gru":
        params = _gru_parameters(kernel, weights)
    else:
        params = _fused_parameters(form, _keep_form(kernel, weights))
    if T == 0:  # PyTorch's kernels refuse it ("Expected sequence length to be larger
        # than 0"): no step runs, the initial states come back, as from the library's loop
        H = weights.weight_hh.shape[1]
        none = _no_step(x, params)
        return x.new_zeros(0, B, H) + none, tuple(s + none for s in states0)
    train = torch.is_grad_enabled()
    if lengths is None:
        out, *ends = _call(form, x, tuple(s[None] for s in states0), params, None, train)
        return out, tuple(e[0] for e in ends)
    # Packed sequences: rows sorted by length, longest first; rows of length 0 never run.
    # The lengths are on the host (packing wants them there): sorting them waits for nothing.
    lengths = lengths.cpu()
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_lengths = lengths.index_select(0, order)
    real = int((sorted_lengths > 0).sum())
    if real == 0:
        none = _no_step(x, params)
        finals = tuple(s + none for s in states0)
        return finals[0][None].expand(T, B, -1).clone(), finals
    # (non_blocking: a blocking copy to the GPU would wait for the stream; from pageable
    # memory the copy is staged at once, so the host tensors may go)
    rows = order[:real].to(x.device, non_blocking=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x.index_select(1, rows), sorted_lengths[:real], enforce_sorted=True
    )
    hx = tuple(s.index_select(0, rows)[None] for s in states0)
    data, *ends = _call(form, packed.data, hx, params, packed.batch_sizes, train)
    out_rows, _ = torch.nn.utils.rnn.pad_packed_sequence(
        torch.nn.utils.rnn.PackedSequence(data, packed.batch_sizes), total_length=T
    )
    # Back to the batch's order; rows of length 0 keep their initial states.
    finals = tuple(s.index_copy(0, rows, e[0]) for s, e in zip(states0, ends, strict=True))
    outputs = x.new_zeros(T, B, out_rows.shape[-1]).index_copy(1, rows, out_rows)
    steps = torch.arange(T, device=x.device)
    on_device = lengths.to(x.device, non_blocking=True)
    real_step = (steps[:, None] < on_device)[..., None]  # (T, B, 1)
    # rnnkit holds the state after a sequence's last step: its outputs there are h_final.
    return torch.where(real_step, outputs, finals[0][None]), finals
