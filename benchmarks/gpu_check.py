"""The prepared GPU check: CUDA results against the CPU reference, and speed vs cuDNN.

Run it where a GPU is lent (``benchmarks/gpu_suite.sh`` runs it with shorter timed blocks,
``--rounds 3 --block 0.1``, inside its share of one device call):

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json

The result file is rewritten after the correctness rows and after every speed row, so a
run stopped at a time limit keeps what it measured (each row is also printed to stderr as
one JSON line).

1. **Correctness.** For every cell form (RNN tanh/relu, LSTM, the four GRU forms), a
   2-layer bidirectional stack with a mask that has holes, an empty row and NaN in the
   padding, and with a mask of lengths 0 … T (PyTorch's fused kernels, cuDNN on a GPU,
   where the function is theirs; ``fused_calls`` counts them): outputs, final states and
   every gradient (input, parameters, initial state) on the device in float64 against
   the CPU float64 result of the PyTorch loop (the oracle), and in float32 against the
   same reference (relative to the largest value). On a GPU with triton installed the
   same rows run again with every layer forced onto the Triton steps
   (``rnnkit.bptt.gpu_steps``, ``path: triton``; ``steps_calls`` counts their layers);
   on the default path they run the masks with holes and the forms cuDNN has not.
2. **Speed.** Training (forward + backward) and inference of rnnkit on the device vs
   ``torch.nn`` (cuDNN) with the same weights (``from_torch``): LSTM and GRU,
   H ∈ {128, 256, 512}, B ∈ {16, 64}, T = 100, medians of rounds, device synchronised
   around every timed block; the default path, the library's own loop forced
   (``train_loop``, ``infer_loop``), and a mask with holes (``train_holes``, which no
   fused kernel computes: the Triton steps where triton is installed) against cuDNN's
   time without one. With triton: the Triton steps forced on the same function as
   cuDNN's (``train_triton``), and the forms only they compute, at the same sizes
   against cuDNN's nearest (``train_variant``: a GRU with ``reset="before"`` against
   cuDNN's GRU; the simple cell with ``sigmoid``, cell ``rnn``, against cuDNN's
   ``tanh``, B = 64 only). A layer with ``recurrent_dropout=0.25`` and ``zoneout=0.1``
   in training (``train_regularized``, fresh masks every call), against cuDNN's time
   without them: on a GPU it runs where triton is installed (on the Triton steps, which
   alone compute it there), on the CPU always (the compiled loop). The windowed BPTT(τ)
   (``train_window``, ``window=20``: the forward on the Triton steps where triton is
   installed, the backward lag by lag), LSTM and GRU at the largest batch, against
   cuDNN's full BPTT. At the largest batch, with triton, the Triton steps again with each
   call's step loops replayed from CUDA graphs (``RNNKIT_CUDA_GRAPHS=1``,
   :mod:`rnnkit.bptt.gpu_graphs`), training and inference (``train_graphs``,
   ``infer_graphs``, against ``train_triton``, ``infer_triton`` without them and cuDNN).
3. **Single steps.** A 2-layer LSTM and GRU (H 256, B 1 and 16) called on one time step
   at a time, the state carried, no gradient (a decoder, ``rnnkit generate``): rnnkit's
   stack on its default path (one fused cell operator per layer), forced onto the fused
   kernels (one cuDNN call per step), and the drop-in ``rnnkit.nn`` layer, each against
   ``torch.nn``'s layer (``steps``).
4. **Stacks.** A 2-layer LSTM and GRU, one-way and bidirectional, without and with
   dropout 0.3 between the layers (H 256, B 64, T 100), in training: rnnkit's library
   stack on its default path against ``torch.nn``'s with the same weights, and how many
   fused calls rnnkit's forward makes (``stacks``).

Exit status 1 if any correctness check fails. ``--device cpu`` runs the same checks on
the CPU (the compiled loop against the PyTorch loop) — the test suite does that in
``--quick`` form so that this script cannot rot while no GPU is at hand, once on the
default path and once with ``--path fused`` (PyTorch's CPU kernels in cuDNN's place).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import rnnkit
from rnnkit import GRU, LSTM, RNN
from rnnkit.bptt import fused, gpu_graphs, gpu_route, native, recurrence
from rnnkit.types import LSTMState

WINDOW = 20  # τ of the speed rows' windowed BPTT(τ)

FORMS = [
    ("rnn_tanh", RNN, {"nonlinearity": "tanh"}),
    ("rnn_relu", RNN, {"nonlinearity": "relu"}),
    ("rnn_sigmoid", RNN, {"nonlinearity": "sigmoid"}),
    ("lstm", LSTM, {}),
    ("gru_candidate_before", GRU, {"update": "candidate", "reset": "before"}),
    ("gru_candidate_after", GRU, {"update": "candidate", "reset": "after"}),
    ("gru_keep_before", GRU, {"update": "keep", "reset": "before"}),
    ("gru_keep_after", GRU, {"update": "keep", "reset": "after"}),
]


def _mask(B: int, T: int, kind: str = "holes") -> torch.Tensor:
    """``holes``: holes everywhere (the library's loop on every device); ``lengths``: each
    row's real steps a prefix, lengths 0 … T (PyTorch's fused kernels where the function
    is theirs)."""
    g = torch.Generator().manual_seed(7)
    if kind == "lengths":
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        lengths[0], lengths[1] = T, 0
        return torch.arange(T)[None, :] < lengths[:, None]
    mask = torch.rand(B, T, generator=g) < 0.8  # holes everywhere
    mask[0] = True
    mask[1] = False  # an empty row
    return mask


def _run(layer, x, mask, state, device, dtype):
    """Outputs, final states and the gradients of a fixed scalar, as float64 CPU tensors."""
    layer = layer.to(device=device, dtype=dtype)
    x = x.to(device=device, dtype=dtype).requires_grad_(True)
    state = tuple(s.to(device=device, dtype=dtype).requires_grad_(True) for s in state)
    packed = LSTMState(*state) if len(state) == 2 else state[0]
    out = layer(x, mask=mask.to(device), state=packed)
    finals = tuple(out.state) if isinstance(out.state, LSTMState) else (out.state,)
    w = torch.linspace(-1, 1, out.outputs.shape[-1], device=device, dtype=dtype)
    loss = (out.outputs * w).sum() + sum((f * f).sum() for f in finals)
    grads = torch.autograd.grad(loss, [x, *layer.parameters(), *state])
    return [t.detach().double().cpu() for t in (out.outputs, *finals, *grads)]


class _FusedCalls:
    """Counts the calls of PyTorch's fused kernels (``n``) and of the Triton steps
    (``steps``) inside the block."""

    def __enter__(self) -> _FusedCalls:
        self.n, self.steps = 0, 0
        self._real, self._real_steps = fused._call, recurrence.run_steps

        def counted(*args, **kwargs):
            self.n += 1
            return self._real(*args, **kwargs)

        def counted_steps(*args, **kwargs):
            self.steps += 1
            return self._real_steps(*args, **kwargs)

        fused._call = counted
        recurrence.run_steps = counted_steps
        return self

    def __exit__(self, *exc: object) -> None:
        fused._call = self._real
        recurrence.run_steps = self._real_steps


def correctness(
    device: str, sizes: tuple[int, int, int, int], path: str = "auto", forms: list | None = None
) -> list[dict]:
    """Every form (or those of ``forms``), with a mask of holes and a mask of lengths, on
    ``path`` (which says whether PyTorch's fused kernels may run) against the CPU float64
    PyTorch loop."""
    B, T, I, H = sizes
    rows = []
    for (name, cls, options), kind in itertools.product(forms or FORMS, ("holes", "lengths")):
        torch.manual_seed(0)
        layer = cls(I, H, num_layers=2, bidirectional=True, **options)
        mask = _mask(B, T, kind)
        x = torch.randn(B, T, I, dtype=torch.float64)
        x[~mask] = float("nan")  # padding may hold anything
        n = 2 if cls is LSTM else 1
        state = tuple(torch.randn(2, 2, B, H, dtype=torch.float64) for _ in range(n))
        with native.use_native(False), fused.use_fused("loop"):  # the oracle
            ref = _run(layer, x, mask, state, "cpu", torch.float64)
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
            # TF32 off, so that float32 is float32: cuDNN's recurrent kernels use TF32 by
            # default (torch.backends.cudnn.allow_tf32), far outside 2e-5
            no_tf32 = torch.backends.cudnn.flags(enabled=True, allow_tf32=False)
            with fused.use_fused(path), _FusedCalls() as calls, no_tf32:
                got = _run(layer, x, mask, state, device, dtype)
            err = 0.0
            for a, b in zip(got, ref, strict=True):
                scale = float(b.nan_to_num().abs().max()) or 1.0
                bad = bool(a.isnan().ne(b.isnan()).any())
                diff = float((a - b).nan_to_num(0.0).abs().max()) / scale
                err = max(err, math.inf if bad else diff)
            rows.append(
                {
                    "form": name,
                    "mask": kind,
                    "dtype": str(dtype)[6:],
                    "path": path,
                    "fused_calls": calls.n,
                    "steps_calls": calls.steps,
                    "max_rel_err": err,
                    "ok": err <= tol,
                }
            )
    return rows


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


#: Seconds of each timed block (``--block``): the suite's call shortens it.
BLOCK_S = 0.2

#: Called after each row and section with the result so far (main's ``--out`` writer):
#: a run stopped at its time limit keeps what it measured.
Saver = Callable[[], None]


def _timed(fn, device: str, rounds: int, block_s: float | None = None) -> list[float]:
    block_s = BLOCK_S if block_s is None else block_s
    fn()
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    reps = max(1, round(block_s / max(time.perf_counter() - t0, 1e-6)))
    out = []
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        out.append((time.perf_counter() - t0) / reps)
    return out


def _with_steps(device: str) -> bool:
    """Whether the Triton steps can run here: a GPU, triton, and triton's first-use probe
    passing on it (where it fails, forcing the steps would raise, ending the check)."""
    if device != "cuda" or not gpu_route.triton_available():
        return False
    why = gpu_route._runs_on(torch.device("cuda", torch.cuda.current_device()))
    if why is not None:
        print(
            f"gpu_check: the Triton steps cannot run here ({why}): rows without them",
            file=sys.stderr,
        )
    return why is None


def _variant(cell: str, H: int, device: str):
    """The form only the Triton steps compute, nearest to cuDNN's ``cell``, or None."""
    if cell == "gru":
        return GRU(H, H, update="keep", reset="before").to(device)
    if cell == "rnn":
        return RNN(H, H, nonlinearity="sigmoid").to(device)
    return None


def _regularized(cell: str, H: int, device: str):
    """A layer of ``cell`` with recurrent dropout and zoneout, in training: on a GPU the
    Triton steps run it (no fused kernel computes it)."""
    cls = {"lstm": LSTM, "gru": GRU, "rnn": RNN}[cell]
    return cls(H, H, recurrent_dropout=0.25, zoneout=0.1).to(device).train()


def _speed_row(
    cell: str,
    H: int,
    B: int,
    T: int,
    device: str,
    rounds: int,
    window: int | None = None,
    graphs: bool = False,
    dropin: bool = False,
) -> dict:
    """One row of times (``window``: also the windowed BPTT(τ) of the same layer;
    ``graphs``: also the Triton steps in CUDA graphs, where they run; ``dropin``: also
    the drop-in ``rnnkit.nn`` layer with torch's weights)."""
    torch.manual_seed(0)
    torch_cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[cell]
    ref = torch_cls(H, H, batch_first=True).to(device)
    ours = rnnkit.from_torch(ref).to(device)
    x = torch.randn(B, T, H, device=device, requires_grad=True)
    d = torch.randn(B, T, H, device=device)
    params_t, params_r = list(ref.parameters()), list(ours.parameters())

    def train_t():
        torch.autograd.grad(ref(x)[0], [x, *params_t], d)

    def train_r():
        torch.autograd.grad(ours(x).outputs, [x, *params_r], d)

    holes = _mask(B, T, "holes").to(device)

    def train_holes():
        torch.autograd.grad(ours(x, mask=holes).outputs, [x, *params_r], d)

    def infer_t():
        with torch.no_grad():
            ref(x)

    def infer_r():
        with torch.no_grad():
            ours(x)

    def on_loop(fn):
        def run():
            with fused.use_fused("loop"):
                fn()

        return run

    def without_second_order_node():
        # the default path without the node that makes cuDNN's gradient differentiable
        # again (rnnkit.bptt.fused._TwiceDifferentiable): what that node costs a call
        saved = fused._ONCE_DIFFERENTIABLE_ON
        fused._ONCE_DIFFERENTIABLE_ON = frozenset()
        try:
            train_r()
        finally:
            fused._ONCE_DIFFERENTIABLE_ON = saved

    fns = {"train_torch": train_t, "train_rnnkit": train_r, "train_loop": on_loop(train_r)}
    fns["train_no_node"] = without_second_order_node
    fns |= {"infer_torch": infer_t, "infer_rnnkit": infer_r, "infer_loop": on_loop(infer_r)}
    fns |= {"train_holes": train_holes}
    if dropin:  # rnnkit.nn: on a GPU its call is torch's own forward (cuDNN, whole)
        mine = getattr(rnnkit.nn, torch_cls.__name__)(H, H, batch_first=True).to(device)
        mine.load_state_dict(ref.state_dict())
        params_d = list(mine.parameters())

        def train_dropin():
            torch.autograd.grad(mine(x)[0], [x, *params_d], d)

        def infer_dropin():
            with torch.no_grad():
                mine(x)

        fns |= {"train_dropin": train_dropin, "infer_dropin": infer_dropin}
    if _with_steps(device):

        def train_triton():
            with fused.use_fused("triton"):
                train_r()

        fns["train_triton"] = train_triton
        if graphs:  # the same steps, each call's loops replayed from CUDA graphs

            def train_graphs():
                with gpu_graphs.use_cuda_graphs(True):
                    train_triton()

            def infer_triton():
                with fused.use_fused("triton"):
                    infer_r()

            def infer_graphs():
                with gpu_graphs.use_cuda_graphs(True):
                    infer_triton()

            fns |= {"train_graphs": train_graphs, "infer_triton": infer_triton}
            fns["infer_graphs"] = infer_graphs
        variant = _variant(cell, H, device)
        if variant is not None:
            params_v = list(variant.parameters())

            def train_variant():
                torch.autograd.grad(variant(x).outputs, [x, *params_v], d)

            fns["train_variant"] = train_variant
    if device != "cuda" or _with_steps(device):  # not the PyTorch loop's time on a GPU
        regularized = _regularized(cell, H, device)
        params_g = list(regularized.parameters())

        def train_regularized():
            torch.autograd.grad(regularized(x).outputs, [x, *params_g], d)

        fns["train_regularized"] = train_regularized
    if window is not None:

        def train_window():
            torch.autograd.grad(ours(x, window=window).outputs, [x, *params_r], d)

        fns["train_window"] = train_window
    med = {k: statistics.median(_timed(f, device, rounds)) for k, f in fns.items()}
    gpu_graphs.clear_cuda_graphs()  # the row's graphs: their memory back
    extra = {}
    # > 1: the second-derivative node's share of a training call (1.03: 3 %)
    extra["train_node_cost"] = med["train_rnnkit"] / med["train_no_node"]
    if "train_triton" in med:  # the Triton steps on cuDNN's own function
        extra["train_torch_over_triton"] = med["train_torch"] / med["train_triton"]
    if "train_graphs" in med:  # the same in CUDA graphs; and what the graphs gain
        extra["train_torch_over_graphs"] = med["train_torch"] / med["train_graphs"]
        extra["train_triton_over_graphs"] = med["train_triton"] / med["train_graphs"]
        extra["infer_torch_over_graphs"] = med["infer_torch"] / med["infer_graphs"]
        extra["infer_triton_over_graphs"] = med["infer_triton"] / med["infer_graphs"]
    if "train_dropin" in med:  # the drop-in against torch's own layer
        extra["train_torch_over_dropin"] = med["train_torch"] / med["train_dropin"]
        extra["infer_torch_over_dropin"] = med["infer_torch"] / med["infer_dropin"]
    if "train_variant" in med:  # a form cuDNN has not, against cuDNN's nearest
        extra["train_torch_over_variant"] = med["train_torch"] / med["train_variant"]
    if "train_regularized" in med:  # recurrent dropout and zoneout, against cuDNN without
        extra["train_torch_over_regularized"] = med["train_torch"] / med["train_regularized"]
    if window is not None:  # BPTT(τ) on the default path, against cuDNN's full BPTT
        extra["window"] = window
        extra["train_torch_over_window"] = med["train_torch"] / med["train_window"]
    return {
        "cell": cell,
        "H": H,
        "B": B,
        "T": T,
        **{f"{k}_ms": v * 1e3 for k, v in med.items()},
        # >= 1.0: rnnkit as fast as torch.nn (cuDNN on a GPU); the default path
        "train_torch_over_rnnkit": med["train_torch"] / med["train_rnnkit"],
        "infer_torch_over_rnnkit": med["infer_torch"] / med["infer_rnnkit"],
        # the library's own loop on the same function (what ran before the fused path)
        "train_torch_over_loop": med["train_torch"] / med["train_loop"],
        "infer_torch_over_loop": med["infer_torch"] / med["infer_loop"],
        # a mask with holes (no fused equivalent) against cuDNN's time without one
        "train_torch_over_holes": med["train_torch"] / med["train_holes"],
        **extra,
    }


def speed(
    device: str,
    hidden: list[int],
    batch: list[int],
    T: int,
    rounds: int,
    rows: list[dict] | None = None,
    saved: Saver | None = None,
) -> list[dict]:
    """The speed rows, appended to ``rows`` one by one (``saved`` after each)."""
    rows = [] if rows is None else rows
    for cell in ("lstm", "gru", "rnn"):
        for H in hidden:
            largest = batch[-1]
            # the simple cell at the largest batch only: the run's time is bounded
            for B in batch if cell != "rnn" else [largest]:
                # the window at the largest batch only, LSTM and GRU: the time is bounded
                window = WINDOW if cell != "rnn" and largest == B else None
                # CUDA graphs of the Triton steps: the largest batch only, likewise
                # graphs and the drop-in: the largest batch only, likewise
                row = _speed_row(
                    cell, H, B, T, device, rounds, window, graphs=largest == B, dropin=largest == B
                )
                rows.append(row)
                print(json.dumps(rows[-1]), file=sys.stderr)
                if saved is not None:
                    saved()
    return rows


#: Steps of one decoding-like call sequence in the single-step rows.
STEPS = 20


def _step_row(cell: str, L: int, H: int, B: int, device: str, rounds: int) -> dict:
    """A layer called on one time step at a time, the state carried (a decoder or a
    generator, no gradient), ``STEPS`` calls: ``torch.nn``'s layer (cuDNN) against
    rnnkit's stack on its default path (one fused cell operator per layer), the same
    stack forced onto the fused kernels (one cuDNN call per step for the whole stack) and
    the drop-in ``rnnkit.nn`` layer. Ratios: torch.nn's time over each."""
    torch.manual_seed(0)
    torch_cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell]
    ref = torch_cls(H, H, num_layers=L, batch_first=True).to(device)
    ours = rnnkit.from_torch(ref).to(device)
    mine = getattr(rnnkit.nn, torch_cls.__name__)(H, H, num_layers=L, batch_first=True)
    mine = mine.to(device)
    mine.load_state_dict(ref.state_dict())
    xs = torch.randn(STEPS, B, 1, H, device=device)

    def torch_steps():
        with torch.no_grad():
            state = None
            for x in xs:
                state = ref(x, state)[1]

    def rnnkit_steps():
        with torch.no_grad():
            state = None
            for x in xs:
                state = ours(x, state=state).state

    def fused_steps():
        with fused.use_fused("fused"):
            rnnkit_steps()

    def dropin_steps():
        with torch.no_grad():
            state = None
            for x in xs:
                state = mine(x, state)[1]

    fns = {"torch": torch_steps, "rnnkit": rnnkit_steps, "fused": fused_steps}
    fns["dropin"] = dropin_steps
    med = {k: statistics.median(_timed(fn, device, rounds)) for k, fn in fns.items()}
    return {
        "cell": cell,
        "L": L,
        "H": H,
        "B": B,
        "step_torch_us": med["torch"] / STEPS * 1e6,
        **{f"step_torch_over_{k}": med["torch"] / med[k] for k in ("rnnkit", "fused", "dropin")},
    }


def step_speed(
    device: str,
    sizes: list[tuple[int, int, int]],
    rounds: int,
    rows: list[dict] | None = None,
    saved: Saver | None = None,
) -> list[dict]:
    """:func:`_step_row` for the LSTM and the GRU at each ``(L, H, B)``, appended to
    ``rows`` (``saved`` after each)."""
    rows = [] if rows is None else rows
    for cell in ("lstm", "gru"):
        for L, H, B in sizes:
            rows.append(_step_row(cell, L, H, B, device, rounds))
            if saved is not None:
                saved()
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def _stack_row(
    cell: str, bidirectional: bool, dropout: float, H: int, B: int, T: int, device: str, rounds: int
) -> dict:
    """A 2-layer stack in training (forward and backward), as a task's model trains it:
    ``torch.nn``'s layer (cuDNN: one call, its own dropout between the layers) against
    rnnkit's library stack with the same weights on its default path (one fused call for
    the stack without dropout; with it, one call per layer, both directions in it,
    rnnkit's dropout between them). ``calls``: the fused calls of rnnkit's forward.
    Ratio: torch.nn's time over rnnkit's."""
    torch.manual_seed(0)
    torch_cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell]
    ref = torch_cls(
        H, H, num_layers=2, bidirectional=bidirectional, dropout=dropout, batch_first=True
    )
    ref = ref.to(device).train()
    ours = rnnkit.from_torch(ref).to(device).train()
    x = torch.randn(B, T, H, device=device, requires_grad=True)

    def torch_train():
        ref(x)[0].sum().backward()

    def rnnkit_train():
        ours(x).outputs.sum().backward()

    calls = 0
    call = fused._call

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return call(*args, **kwargs)

    fused._call = counted
    try:
        with torch.no_grad():
            ours(x)
    finally:
        fused._call = call
    med = {
        k: statistics.median(_timed(fn, device, rounds))
        for k, fn in {"torch": torch_train, "rnnkit": rnnkit_train}.items()
    }
    return {
        "cell": cell,
        "bidirectional": bidirectional,
        "dropout": dropout,
        "H": H,
        "B": B,
        "T": T,
        "calls": calls,
        "stack_torch_ms": med["torch"] * 1e3,
        "stack_torch_over_rnnkit": med["torch"] / med["rnnkit"],
    }


def stack_speed(
    device: str,
    H: int,
    B: int,
    T: int,
    rounds: int,
    rows: list[dict] | None = None,
    saved: Saver | None = None,
) -> list[dict]:
    """:func:`_stack_row` for the LSTM and the GRU, one-way and bidirectional, without
    and with dropout between the layers, appended to ``rows`` (``saved`` after each)."""
    rows = [] if rows is None else rows
    for cell, bi, p in itertools.product(("lstm", "gru"), (False, True), (0.0, 0.3)):
        rows.append(_stack_row(cell, bi, p, H, B, T, device, rounds))
        if saved is not None:
            saved()
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    global BLOCK_S
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one speed row")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--block", type=float, default=BLOCK_S, help="seconds of each timed block (default 0.2)"
    )
    p.add_argument(
        "--path",
        choices=fused.PATHS,
        default="auto",
        help="which path the correctness check runs (fused: PyTorch's kernels wherever the "
        "function is theirs, also on the CPU)",
    )
    p.add_argument(
        "--forms",
        help="the correctness check's forms, comma-separated (default: all of "
        + ", ".join(name for name, _, _ in FORMS)
        + ")",
    )
    p.add_argument("--out", type=Path, help="write the JSON result here (else stdout)")
    args = p.parse_args(argv)
    forms = FORMS
    if args.forms:
        names = args.forms.split(",")
        known = {name for name, _, _ in FORMS}
        if unknown := [n for n in names if n not in known]:
            p.error(f"--forms: no form {', '.join(unknown)} (the forms: {', '.join(known)})")
        forms = [f for f in FORMS if f[0] in names]
    BLOCK_S = args.block
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (use --device cpu for the CPU check)", file=sys.stderr
        )
        return 2
    sizes = (4, 5, 3, 4) if args.quick else (6, 13, 5, 8)
    checks = correctness(args.device, sizes, args.path, forms)
    if args.path == "auto" and _with_steps(args.device):  # every layer on the Triton steps
        checks += correctness(args.device, sizes, "triton", forms)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if args.device == "cuda" else None,
        "correctness": checks,
    }

    def saved() -> None:
        """The result so far into ``--out`` (whole: written aside, then renamed), so that
        a run stopped at its time limit keeps every row it finished."""
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            part = args.out.with_name(args.out.name + ".part")
            part.write_text(json.dumps(result, indent=1))
            part.replace(args.out)

    saved()
    if not args.no_speed:
        # the short sections first: a run stopped in the long speed grid keeps them
        steps: list[dict] = []
        stacks: list[dict] = []
        rows: list[dict] = []
        result.update(steps=steps, stacks=stacks, speed=rows)
        step_sizes = [(2, 16, 1)] if args.quick else [(2, 256, 1), (2, 256, 16)]
        # three rounds: ~10 s in all, inside the check's share of the suite's time
        step_speed(args.device, step_sizes, 2 if args.quick else 3, steps, saved)
        stack_size = (16, 4, 5) if args.quick else (256, 64, 100)
        stack_speed(args.device, *stack_size, 2 if args.quick else 3, stacks, saved)
        hidden, batch = ([16], [4]) if args.quick else ([128, 256, 512], [16, 64])
        T = 10 if args.quick else 100
        rounds = 2 if args.quick else args.rounds
        speed(args.device, hidden, batch, T, rounds, rows, saved)
    if not args.out:
        print(json.dumps(result, indent=1))
    failed = [c for c in checks if not c["ok"]]
    for c in failed:
        print(
            f"gpu_check: {c['form']} {c['mask']} {c['dtype']} ({c['path']}) "
            f"off by {c['max_rel_err']:.2e}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
