"""CUDA graphs over the step loops of the Triton steps (:mod:`rnnkit.bptt.gpu_steps`):
opt-in, off by default.

For small layers the Triton steps' time is set by launch overhead, not by the work: a
call of T steps makes 2T launches forward (one recurrent product and one Triton launch
per step) and 2T backward, each costing some microseconds of Python and driver time. A
``torch.cuda.CUDAGraph`` captures one call's step loop once and replays it as a whole,
and the gaps between the launches shrink to the GPU's own.

Switch: ``RNNKIT_CUDA_GRAPHS=1`` in the environment (read at import; ``0``, empty or
unset: off), or :func:`use_cuda_graphs` around a block. Off, nothing here runs and
nothing is captured. On, for CUDA tensors only:

* a **cache** of graphs keyed by everything that fixes the captured work
  (:func:`signature`: the loop's kind and cell form, whether the forward keeps what the
  backward reads, and each input's shape, strides, dtype and device — so T, B, H, the
  dtype, the device, a mask, resets and the regularizers' tensors present or not). The
  input size ``I`` is not part of it: the input product ``x W_ihᵀ + b`` (one matrix
  product over all steps) runs outside the graph, whose input are the pre-activations
  ``(T, B, G·H)``. At most :data:`CACHE_SIZE` graphs per device, the least recently used
  dropped first, so that varying shapes cannot grow memory without bound;
* per call: the inputs are copied into the graph's **static** buffers (allocated once
  per key, with the inputs' strides; a stride 0 of an expanded tensor is kept, only the
  stored values are copied), the graph is replayed, and every output is **cloned**: what
  the caller and autograd keep is never overwritten by a later replay;
* the first call of a key runs the loop once eagerly on a side stream (Triton compiles
  its kernels at their first launch, which cannot happen inside a capture), then
  captures it (``torch.cuda.graph``, one memory pool per device shared by the graphs:
  each replay's outputs are cloned before any other replay, and every buffer allocated
  inside a capture is written before it is read within the same replay);
* a capture that fails (any exception) makes that key run the eager loop from then on,
  with one ``RuntimeWarning`` per process: a user's training never stops for a graph.

A new key costs a capture (a device synchronisation, PyTorch's cached memory emptied,
the loop recorded) and the key's buffers, kept while it is cached: graphs pay where the
shapes repeat (a fixed T and B, as the segments of truncated BPTT have); with many
distinct lengths, bucket them or leave the graphs off.

Threads: several may run one layer (a threaded server). Each device's graphs are used
under one lock, held from the cache's lookup (and a capture, an eviction) through the
copy-in, the replay and the outputs' clones; on CUDA, each use also waits on the
device's previous use, which may have been enqueued on another thread's stream.

Not captured: the layer-normalised steps (:mod:`rnnkit.bptt.gpu_steps_ln`), and a call
made while some caller is itself capturing a graph (its capture takes the eager loop).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel
from rnnkit.errors import ConfigError

__all__ = ["clear_cuda_graphs", "cuda_graph_stats", "cuda_graphs_enabled", "use_cuda_graphs"]

#: Graphs kept per device (least recently used dropped first).
CACHE_SIZE = 16

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def _from_environment() -> str:
    # A wrong value must not make `import rnnkit` fail: it is refused where it is used.
    return os.environ.get("RNNKIT_CUDA_GRAPHS", "0").strip().lower()


_choice: dict[str, str | bool] = {"on": _from_environment()}
# The device types whose tensors the graphs run for: CUDA; the tests add "cpu" with a
# stand-in graph class (_GRAPH) to run the copy-in, replay and copy-out logic anywhere.
_DEVICES: tuple[str, ...] = ("cuda",)
_stats = {"captures": 0, "replays": 0, "failures": 0}
_warned: set[str] = set()
_FAILED = object()  # a key whose capture failed: the eager loop from then on
_cache: dict[str, OrderedDict[tuple[Any, ...], object]] = {}


class _Device:
    """What orders the uses of one device's graphs (see :func:`replayed`).

    One lock per device, not one per graph: the graphs of a device share one memory pool
    (:class:`_CudaGraph`), so a graph's replay may write where another graph's outputs
    lie until they are cloned, and where another graph keeps the buffers that one of its
    replays writes before reading; two replays of different graphs must not overlap
    either. Not one cache per thread: each thread would capture (and hold the memory of)
    its own copy of every graph, and the graphs would still share the pool.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: torch.cuda.Event | None = None  # the previous use's end (CUDA)

    def after_the_last_use(self, device: torch.device) -> None:
        """The current stream waits for the previous use, on whatever stream it ran."""
        if device.type == "cuda" and self.last is not None:
            torch.cuda.current_stream(device).wait_event(self.last)

    def used(self, device: torch.device) -> None:
        if device.type == "cuda":
            self.last = torch.cuda.Event()
            self.last.record(torch.cuda.current_stream(device))

    def idle(self) -> None:
        """The host waits for the previous use to end: a graph dropped now cannot free
        buffers that a replay on another thread's stream is still using."""
        if self.last is not None:
            self.last.synchronize()


_devices: dict[str, _Device] = {}
_devices_lock = threading.Lock()  # makes the _Device of a device, and guards _stats


def _device(name: str) -> _Device:
    with _devices_lock:
        return _devices.setdefault(name, _Device())


def _count(name: str) -> None:
    with _devices_lock:
        _stats[name] += 1


@contextlib.contextmanager
def use_cuda_graphs(on: bool) -> Iterator[None]:
    """Capture and replay the Triton steps' loops in CUDA graphs inside the block
    (``on=True``) or not (``on=False``), whatever ``RNNKIT_CUDA_GRAPHS`` says.

    >>> with use_cuda_graphs(False):
    ...     cuda_graphs_enabled()
    False
    """
    if not isinstance(on, bool):
        raise TypeError(f"on={on!r}: True or False")
    before = _choice["on"]
    _choice["on"] = on
    try:
        yield
    finally:
        _choice["on"] = before


def cuda_graphs_enabled() -> bool:
    """Whether the switch is on (``RNNKIT_CUDA_GRAPHS`` or :func:`use_cuda_graphs`)."""
    on = _choice["on"]
    if isinstance(on, bool):
        return on
    if on in _ON or on in _OFF:
        return on in _ON
    raise ConfigError(f"RNNKIT_CUDA_GRAPHS={on!r} in the environment: choose 1 (on) or 0 (off)")


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is capturing a CUDA graph (asked of that
    device, not the current one; False where CUDA cannot answer: a CPU build, no
    driver)."""
    try:
        with torch.cuda.device(device):
            return torch.cuda.is_current_stream_capturing()
    except (AssertionError, RuntimeError):
        return False


def wanted(t: Tensor) -> bool:
    """Whether a call on ``t``'s device runs through a graph: the switch on, a CUDA
    tensor, and no capture of the caller's own in progress on that device. Off, the first
    test returns."""
    if t.device.type not in _DEVICES or not cuda_graphs_enabled():
        return False
    return not (t.is_cuda and capturing(t.device))


def cuda_graph_stats() -> dict[str, int]:
    """Counts since the process started (or :func:`clear_cuda_graphs`): ``captures``,
    ``replays``, ``failures`` (captures that failed)."""
    with _devices_lock:
        return dict(_stats)


def cached_keys(device: torch.device | str) -> list[tuple[Any, ...]]:
    """The keys cached for ``device``, least recently used first (``"cuda"``: the current
    CUDA device, as the cache names devices by their tensors' ``cuda:N``)."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    with _device(str(d)).lock:
        return list(_cache.get(str(d), {}))


def clear_cuda_graphs() -> None:
    """Drop every graph (their memory returns to PyTorch's allocator) and the counts;
    a use in progress in another thread ends first."""
    with _devices_lock:
        devices = list(_devices.values())
    with contextlib.ExitStack() as held:
        for d in devices:
            held.enter_context(d.lock)
            d.idle()
        _cache.clear()
        _warned.clear()
        with _devices_lock:
            _stats.update(captures=0, replays=0, failures=0)


def signature(tensors: Sequence[Tensor | None]) -> tuple[Any, ...]:
    """What fixes the captured work of the inputs: each one's shape, strides, dtype and
    device (None where absent)."""
    return tuple(
        None if t is None else (tuple(t.shape), t.stride(), t.dtype, str(t.device)) for t in tensors
    )


def form(kernel: object) -> str:
    """The cell form that fixes a loop's kernels (part of a key): ``lstm``,
    ``gru_<update>_<reset>``, ``rnn_<nonlinearity>``."""
    if isinstance(kernel, GRUKernel):
        return f"gru_{kernel.update}_{kernel.reset}"
    if isinstance(kernel, RNNKernel):
        return f"rnn_{kernel.nonlinearity}"
    if isinstance(kernel, LSTMKernel):
        return "lstm"
    raise TypeError(f"no Triton steps' loop for {type(kernel).__name__}")


def _stored(t: Tensor) -> Tensor:
    """The values ``t`` stores: an axis of stride 0 (an expanded tensor) cut to size 1."""
    return t[tuple(slice(0, 1) if s == 0 else slice(None) for s in t.stride())]


class _Static(NamedTuple):
    """One input's static buffer: ``base`` holds the stored values, ``view`` is what the
    loop reads (``base`` expanded back where the input had stride 0)."""

    base: Tensor
    view: Tensor

    @staticmethod
    def like(t: Tensor) -> _Static:
        s = _stored(t)
        base = torch.empty_strided(s.shape, s.stride(), dtype=s.dtype, device=s.device)
        return _Static(base, base.expand(t.shape))


class _CudaGraph:
    """A ``torch.cuda.CUDAGraph`` of one function (the seam the tests replace):
    :meth:`capture` records ``fn()`` and returns its outputs, which each :meth:`replay`
    rewrites in place."""

    # per device: one memory pool shared by the graphs, and the stream they capture on
    # (torch.cuda.graph's default capture stream belongs to the first device it met)
    _pools: ClassVar[dict[str, Any]] = {}
    _streams: ClassVar[dict[str, torch.cuda.Stream]] = {}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph = torch.cuda.CUDAGraph()

    def warm_up(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once eagerly on a side stream (Triton compiles at its first launch)."""
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.device(self.device), torch.cuda.stream(side):
            fn()
        main.wait_stream(side)

    def capture(self, fn: Callable[[], tuple[Tensor | None, ...]]) -> tuple[Tensor | None, ...]:
        key = str(self.device)
        with torch.cuda.device(self.device):
            if key not in self._pools:
                self._pools[key] = torch.cuda.graph_pool_handle()
                self._streams[key] = torch.cuda.Stream(self.device)
            # thread_local: another thread's CUDA calls (a DataLoader's pinned memory, say)
            # do not break this capture
            with torch.cuda.graph(
                self.graph,
                pool=self._pools[key],
                stream=self._streams[key],
                capture_error_mode="thread_local",
            ):
                return fn()

    def replay(self) -> None:
        self.graph.replay()


_GRAPH: Callable[[torch.device], Any] = _CudaGraph


class _Entry(NamedTuple):
    """A captured loop: its static inputs and the outputs its replays write."""

    graph: Any
    statics: tuple[_Static | None, ...]
    outputs: tuple[Tensor | None, ...]

    def copy_in(self, inputs: Sequence[Tensor | None]) -> None:
        for s, t in zip(self.statics, inputs, strict=True):
            if s is not None and t is not None:
                s.base.copy_(_stored(t))


def _capture(
    fn: Callable[..., tuple[Tensor | None, ...]], inputs: Sequence[Tensor | None]
) -> _Entry:
    statics = tuple(None if t is None else _Static.like(t) for t in inputs)
    views = tuple(None if s is None else s.view for s in statics)
    device = next(t.device for t in inputs if t is not None)
    graph = _GRAPH(device)
    entry = _Entry(graph, statics, ())
    entry.copy_in(inputs)  # the warm-up reads real values (no NaN, no garbage index)
    graph.warm_up(lambda: fn(*views))
    outputs = graph.capture(lambda: fn(*views))
    _count("captures")
    return entry._replace(outputs=tuple(outputs))


def _warn_failure(form: object, error: BaseException) -> None:
    if "capture" not in _warned:
        _warned.add("capture")
        lines = str(error).strip().splitlines() or [""]
        warnings.warn(
            f"rnnkit: a CUDA graph of the Triton steps could not be captured ({form}: "
            f"{type(error).__name__}: {lines[0]}); such calls run the eager loop instead. "
            "RNNKIT_CUDA_GRAPHS=0 silences this",
            RuntimeWarning,
            stacklevel=6,  # the caller of the layer: _warn_failure, _entry, replayed, ...
        )


def replayed(
    key: tuple[Any, ...],
    fn: Callable[..., tuple[Tensor | None, ...]],
    inputs: Sequence[Tensor | None],
) -> tuple[Tensor | None, ...] | None:
    """``fn(*inputs)`` through the graph cached under ``key`` + :func:`signature` of the
    inputs (captured at the first call): the outputs, cloned; None where the capture of
    this key failed (the caller runs ``fn`` eagerly).

    ``fn`` takes the inputs (tensors or None) and returns tensors (or None); it must
    allocate what it returns and read nothing but its arguments: a replay reruns its
    recorded kernels on the static buffers.

    Thread-safe: the device's lock (:class:`_Device`) is held from the lookup to the
    clones, so another thread's call can neither capture the same key twice, nor evict
    or refill the static buffers of this one, nor replay in between.
    """
    # under torch.inference_mode the static buffers are inference tensors, which no later
    # call outside it may refill: each mode its own graph
    full = (*key, torch.is_inference_mode_enabled(), signature(inputs))
    where = next(t.device for t in inputs if t is not None)
    device = _device(str(where))
    with device.lock:
        entry = _entry(key, full, str(where), fn, inputs)
        if entry is None:
            return None
        device.after_the_last_use(where)
        entry.copy_in(inputs)
        entry.graph.replay()
        outputs = tuple(None if t is None else t.clone() for t in entry.outputs)
        device.used(where)
    _count("replays")
    return outputs


def _entry(
    key: tuple[Any, ...],
    full: tuple[Any, ...],
    device: str,
    fn: Callable[..., tuple[Tensor | None, ...]],
    inputs: Sequence[Tensor | None],
) -> _Entry | None:
    """The graph cached under ``full`` (captured now at its first call; the least
    recently used dropped past :data:`CACHE_SIZE`), or None where its capture failed.
    The device's lock is held."""
    cache = _cache.setdefault(device, OrderedDict())
    entry = cache.get(full)
    if entry is not None:
        cache.move_to_end(full)
        return entry if isinstance(entry, _Entry) else None
    try:
        entry = _capture(fn, inputs)
    except Exception as e:  # never stop a training for a graph: the eager loop
        _count("failures")
        _warn_failure(key, e)
        entry = _FAILED
    cache[full] = entry
    while len(cache) > CACHE_SIZE:
        _device(device).idle()  # (rare: a 17th shape) no replay still reads what goes
        cache.popitem(last=False)
    return entry if isinstance(entry, _Entry) else None
