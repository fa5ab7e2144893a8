"""The compiled time loop (``rnnkit.bptt.native``): agreement with the PyTorch loop, fallback.

The contract tests of the core (tests/bptt/test_recurrence.py, tests/layers, tests/cells,
tests/layers/test_interop.py) run on BOTH loops through the ``time_loop`` fixture. This module
adds what those cannot show: float32 agreement of the two loops at sizes where the
compiled loop splits rows into thread blocks and packs finished rows away, and what a user
sees when no compiler is present (one warning line, correct results on the PyTorch loop,
and no retry by later processes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rnnkit import GRU, LSTM, RNN
from rnnkit.bptt import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled loop here")


def _run(layer, x, lengths, compiled: bool):
    with native.use_native(compiled):
        out = layer(x, lengths=lengths)
        h = out.outputs
        loss = (h * torch.linspace(-1, 1, h.shape[-1], dtype=h.dtype)).sum()
        params = [p for p in layer.parameters()]
        grads = torch.autograd.grad(loss, [x, *params])
    return h.detach(), grads


@pytest.mark.parametrize(
    ("cls", "options"),
    [
        (RNN, {}),
        (RNN, {"nonlinearity": "sigmoid"}),
        (RNN, {"nonlinearity": ("relu", "sigmoid")}),
        (LSTM, {}),
        (GRU, {}),
        (GRU, {"update": "keep", "reset": "after"}),
    ],
    ids=["rnn", "rnn_sigmoid", "rnn_relu_sigmoid", "lstm", "gru", "gru_keep_after"],
)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("B", "T"), [(37, 19), (3, 5)], ids=["packed_weights", "blas"])
def test_float32_compiled_equals_pytorch_loop(cls, options, threads, B, T) -> None:
    """Outputs and gradients agree to 1e-6 of the largest value in float32 (the bar set for the
    compiled loop; measured: at most 4.7e-7 here, 6.2e-7 at B 64, T 100), with lengths
    that make the compiled loop sort, pack and shrink the active rows, at B = 37 (thread
    blocks of uneven size; enough rows to pack W_hh for the AVX2 kernel) and at B = 3,
    T = 5 (too few rows: the BLAS product), in bidirectional stacks."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        layer = cls(24, 32, num_layers=2, bidirectional=True, **options)
        x = torch.randn(B, T, 24, requires_grad=True)
        lengths = torch.randint(0, T + 1, (B,))
        lengths[0] = T
        h_c, g_c = _run(layer, x, lengths, compiled=True)
        h_p, g_p = _run(layer, x, lengths, compiled=False)
    finally:
        torch.set_num_threads(before)
    scale = h_p.abs().max()
    assert (h_c - h_p).abs().max() <= 1e-6 * scale
    for a, b in zip(g_c, g_p, strict=True):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max().clamp_min(1e-6)


def _lstm_run(dtype, mask, need_x: bool, threads: int, I: int = 24, H: int = 32):
    """Outputs, final states and every gradient of one LSTM direction on the compiled loop."""
    from rnnkit.bptt.recurrence import run_recurrence
    from rnnkit.cells.lstm import LSTMCell

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(3)
        T, B = mask.shape
        torch.manual_seed(0)
        cell = LSTMCell(I, H).to(dtype)
        x = torch.randn(T, B, I, generator=g, dtype=dtype).requires_grad_(need_x)
        s0 = tuple(torch.randn(B, H, generator=g, dtype=dtype).requires_grad_() for _ in "hc")
        out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
        d_out = torch.randn(T, B, H, generator=g, dtype=dtype)
        loss = (out * d_out).sum() + sum((f * f).sum() for f in finals)
        inputs = [*([x] if need_x else []), *cell.parameters(), *s0]
        grads = torch.autograd.grad(loss, inputs)
        with torch.no_grad():
            out_ng, _ = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    finally:
        torch.set_num_threads(before)
    return [out.detach(), *(f.detach() for f in finals), *grads, out_ng]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("need_x", [True, False])
def test_lstm_input_product_in_the_loop_equals_the_product_before_it(
    monkeypatch, threads, dtype, need_x
) -> None:
    """Where I + H is small the compiled LSTM loop multiplies each step's inputs itself
    (and the backward gives ∂L/∂x step by step); everywhere else one product over all
    steps comes first. Both give the same outputs, final states and gradients — with rows
    sorted and packed by their lengths, a hole inside a row, a carried initial state, an
    input without gradient, and under no_grad — to float64 rounding and float32's 1e-6."""
    from rnnkit.cells import lstm

    n = torch.get_num_threads()
    assert lstm.input_in_loop(24, 32, 4 * n) and not lstm.input_in_loop(256, 512, 64)
    assert not lstm.input_in_loop(24, 32, 4 * n - 1)  # a thread without its 4 rows
    T, B = 9, 37
    lengths = torch.randint(0, T + 1, (B,), generator=torch.Generator().manual_seed(5))
    mask = torch.arange(T)[:, None] < lengths[None, :]
    mask[2, 0] = mask[5, 3] = False  # holes
    in_loop = _lstm_run(dtype, mask, need_x, threads)
    monkeypatch.setattr(lstm, "INPUT_IN_LOOP_MAX", 0)
    before = _lstm_run(dtype, mask, need_x, threads)
    for a, b in zip(in_loop, before, strict=True):
        scale = b.abs().max().clamp_min(1e-6)
        tol = 1e-12 if dtype == torch.float64 else 1e-6
        assert (a - b).abs().max() <= tol * scale


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("I", "H"), [(300, 100), (100, 300), (260, 252)])
def test_lstm_input_product_in_the_loop_at_widths_that_split_k(monkeypatch, threads, I, H):
    """In the loop, the step's products ``x_t W_ihᵀ`` and ``h_{t−1} W_hhᵀ`` run over K in
    blocks of 256: inputs and states wider than one block, one of each, and both just
    over one, give what the product before the loop gives, to float32's 1e-6."""
    from rnnkit.cells import lstm

    assert lstm.input_in_loop(I, H, 4 * threads)
    T, B = 5, 29
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(7))
    mask = torch.arange(T)[:, None] < lengths[None, :]
    in_loop = _lstm_run(torch.float32, mask, True, threads, I, H)
    monkeypatch.setattr(lstm, "INPUT_IN_LOOP_MAX", 0)
    before = _lstm_run(torch.float32, mask, True, threads, I, H)
    for a, b in zip(in_loop, before, strict=True):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max().clamp_min(1e-6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hole", [False, True])
def test_lstm_reads_a_batch_first_input_where_it_lies(threads, dtype, hole) -> None:
    """A batch-first LSTM stack whose loop multiplies the inputs step by step reads
    ``x (B, T, I)`` in place and writes its outputs batch-first (no transposing copy on
    either side, nor of the outputs' gradient), with the same outputs, final state and
    gradients as the PyTorch loop (the oracle): 1e-12 in float64, 1e-5 in float32 — two
    layers (the second reads the first's batch-first outputs), a hole in one row, the
    batch split between threads."""
    g = torch.Generator().manual_seed(3)
    B, T, I, H = 9, 7, 6, 5
    layer = LSTM(I, H, num_layers=2, batch_first=True).to(dtype)
    x = torch.randn(B, T, I, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(B, T, H, generator=g, dtype=dtype)  # every row of d_out differs
    mask = None
    if hole:  # (padding is replaced by zeros first: the loop reads that copy in place)
        mask = torch.ones(B, T, dtype=torch.bool)
        mask[4, 2] = False
    saved: list[int] = []

    def run(compiled: bool):
        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t.untyped_storage().data_ptr())
            return t

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with native.use_native(compiled):  # the backward too: it may run on either
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = layer(x, mask=mask)
                h = out.outputs
                loss = (h * weight).sum() + out.state.c.sum()
                grads = torch.autograd.grad(loss, [x, *layer.parameters()])
        finally:
            torch.set_num_threads(before)
        return h, [h.detach(), out.state.h.detach(), out.state.c.detach(), *grads]

    h, got = run(True)
    assert h.is_contiguous() and h.shape == (B, T, H)
    if not hole:  # the input itself is what the first layer keeps for its weight gradient
        assert x.untyped_storage().data_ptr() in saved
    _, want = run(False)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= tol * b.abs().max().clamp_min(1.0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("in_loop", [True, False])
def test_lstm_backward_sums_the_bias_gradient_in_the_loop(threads, in_loop) -> None:
    """The compiled LSTM backward sums ∂L/∂bias while it writes each row of d_gates (its
    fifth result): equal to d_gates summed afterwards, with finished rows, holes, and the
    batch split into one block of rows per thread."""
    lib = native.library()
    g = torch.Generator().manual_seed(11)
    T, B, I, H = 7, 19, 6, 5
    f64 = {"dtype": torch.float64}
    mask = torch.arange(T)[:, None] < torch.randint(1, T + 1, (B,), generator=g)[None, :]
    mask[3, 2] = mask[1, 7] = False  # holes
    w_ih, w_hh = (
        torch.randn(4 * H, I, generator=g, **f64),
        torch.randn(4 * H, H, generator=g, **f64),
    )
    bias = torch.randn(4 * H, generator=g, **f64)
    h0, c0 = torch.randn(B, H, generator=g, **f64), torch.randn(B, H, generator=g, **f64)
    x = torch.randn(T, B, I, generator=g, **f64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if in_loop:
            _, cs, tc, gates, _ = lib.lstm_forward(x, w_hh, bias, h0, c0, mask, True, None, w_ih)
        else:
            gates = (x @ w_ih.T).contiguous()
            _, cs, tc, _, _ = lib.lstm_forward(gates, w_hh, bias, h0, c0, mask, True, None, None)
        d_out = torch.randn(T, B, H, generator=g, **f64)
        d_xp, _, _, _, d_bias = lib.lstm_backward(
            gates, tc, cs, w_hh, mask, d_out, torch.zeros(B, H, **f64), torch.zeros(B, H, **f64),
            None, w_ih if in_loop else None,
        )  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert d_bias.shape == (4 * H,)
    assert float(d_xp.abs().sum()) > 0
    torch.testing.assert_close(d_bias, d_xp.reshape(-1, 4 * H).sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("save", [True, False])
def test_lstm_forward_keeps_the_callers_projections(threads, save) -> None:
    """``keep_input``: the projections are read, not overwritten, and the gates go to a
    buffer of their own — the same states and gates as the in-place loop to float64
    rounding (the projection meets h W_hhᵀ before the bias instead of after), with rows
    finishing early, a hole, the batch split between threads."""
    lib = native.library()
    g = torch.Generator().manual_seed(13)
    T, B, H = 6, 21, 5
    f64 = {"dtype": torch.float64}
    mask = torch.arange(T)[:, None] < torch.randint(1, T + 1, (B,), generator=g)[None, :]
    mask[2, 4] = False  # a hole
    xp = torch.randn(T, B, 4 * H, generator=g, **f64)
    w_hh, bias = torch.randn(4 * H, H, generator=g, **f64), torch.randn(4 * H, generator=g, **f64)
    h0, c0 = torch.randn(B, H, generator=g, **f64), torch.randn(B, H, generator=g, **f64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kept = xp.clone()
        hs_k, cs_k, tc_k, gates_k, _ = lib.lstm_forward(
            kept, w_hh, bias, h0, c0, mask, save, None, None, True
        )
        in_place = xp.clone()
        hs_i, cs_i, tc_i, empty, _ = lib.lstm_forward(
            in_place, w_hh, bias, h0, c0, mask, save, None
        )
    finally:
        torch.set_num_threads(before)
    assert torch.equal(kept, xp)  # not written
    tol = {"rtol": 1e-13, "atol": 1e-14}
    assert empty.numel() == 0 and gates_k.numel() == (xp.numel() if save else 0)
    torch.testing.assert_close(hs_k, hs_i, **tol)
    torch.testing.assert_close(
        cs_k[-1] if not save else cs_k, cs_i[-1] if not save else cs_i, **tol
    )
    if save:  # the in-place loop left its gates in its input buffer
        torch.testing.assert_close(gates_k, in_place, **tol)
        torch.testing.assert_close(tc_k, tc_i, **tol)


@pytest.mark.parametrize(
    ("cls", "options", "I"),
    [
        (LSTM, {}, 24),
        (LSTM, {}, 600),
        (GRU, {}, 24),
        (GRU, {"reset": "after"}, 24),
        (GRU, {"update": "keep", "reset": "after"}, 24),
        (RNN, {}, 24),
        (RNN, {"nonlinearity": "sigmoid"}, 24),
    ],
    ids=[
        "lstm_input_product_in_the_loop",
        "lstm_projections_before",
        "gru",
        "gru_after",
        "gru_keep_after",
        "rnn",
        "rnn_sigmoid",
    ],
)
@pytest.mark.parametrize("H", [13, 16])
@pytest.mark.parametrize("grad", [True, False], ids=["train", "no_grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gates_saturate_and_carry_nan_like_the_pytorch_loop(
    cls, options, I, H, grad, dtype
) -> None:
    """The gate loops (float32: 8 units at a time where the build has AVX2, the scalar
    loop for the rest of a row: H = 13 is 8 + 5; float64: the library's own exp and tanh,
    vectorised) at their edges: pre-activations of ±1e4 and ±inf (one infinite input a
    step) saturate the gates to the values torch's sigmoid and tanh give, and a NaN input
    poisons its own sequence from its step on and no other — as on the PyTorch loop."""
    torch.manual_seed(5)
    layer = cls(I, H, **options).to(dtype)
    T, B = 6, 3
    x = torch.randn(B, T, I, dtype=dtype)
    x[0, 1:] *= 1e4
    x[0, 3, 0], x[0, 4, 1] = float("inf"), -float("inf")  # one a step: ±inf, no inf - inf
    x[1, 2, 7] = float("nan")
    x.requires_grad_(grad)
    outs = {}
    for compiled in (True, False):
        with native.use_native(compiled), torch.set_grad_enabled(grad):
            outs[compiled] = layer(x).outputs.detach()
    ours, ref = outs[True], outs[False]
    nan = torch.zeros(B, T, H, dtype=torch.bool)
    nan[1, 2:] = True
    assert torch.equal(ours.isnan(), nan) and torch.equal(ref.isnan(), nan)
    atol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(ours[~nan], ref[~nan], rtol=0, atol=atol)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


_USER = """
    import logging, torch
    logging.basicConfig(format="%(message)s")
    from rnnkit import LSTM
    from rnnkit.bptt import native
    torch.manual_seed(0)
    layer = LSTM(3, 4).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    out = layer(x, lengths=torch.tensor([5, 2]))
    import rnnkit
    ref = rnnkit.to_torch(layer)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, [5, 2], batch_first=True)
    o, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True)
    print("available", native.available())
    real = torch.arange(5)[None, :] < torch.tensor([[5], [2]])  # compare real steps only
    print("max_diff", float((out.outputs - o)[real].abs().max().detach()))
"""


def test_without_a_compiler_one_warning_and_the_pytorch_loop(tmp_path: Path) -> None:
    env = {"CXX": "/nonexistent/c++", "RNNKIT_CACHE": str(tmp_path), "RNNKIT_NATIVE": "1"}
    first = _python(_USER, env)
    assert first.returncode == 0, first.stderr
    assert "available False" in first.stdout
    diff = float(first.stdout.split("max_diff")[1])
    assert diff < 1e-12  # the PyTorch loop computes the same function
    warnings = [line for line in first.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1, first.stderr
    assert "compiled time loop unavailable" in warnings[0]
    assert "using the PyTorch loop" in warnings[0]
    assert list(tmp_path.glob("*.failed")), "the failed build is not remembered"
    # A later process with the same compiler does not try again: it names the marker.
    second = _python(_USER, env)
    assert second.returncode == 0, second.stderr
    assert "available False" in second.stdout
    assert ".failed to retry" in second.stderr


def test_rnnkit_native_0_selects_the_pytorch_loop(tmp_path: Path) -> None:
    env = {"RNNKIT_NATIVE": "0", "RNNKIT_CACHE": str(tmp_path)}
    proc = _python(_USER, env)
    assert proc.returncode == 0, proc.stderr
    assert "available False" in proc.stdout
    assert proc.stderr.strip() == ""  # chosen, not failed: nothing to warn about
    assert not list(tmp_path.iterdir())  # nothing built


def test_the_build_of_these_sources_gave_no_warning() -> None:
    """The cached library's build log (written by every build, beside it): the sources
    compile without a warning under -Wall -Wextra (torch's own headers are system headers
    there, whose warnings are not reported)."""
    log = native._paths()[0].with_suffix(".log").read_text()
    command = log.splitlines()[0]
    assert " -Wall -Wextra " in command
    # A package's own loop.cpp, compiled in place; not necessarily this checkout's: the
    # library is named by a hash of the sources, so another checkout (or an installed
    # wheel) with the same sources may have built the cached one.
    assert re.search(r" \S+/rnnkit/csrc/loop\.cpp ", command), command
    assert "warning:" not in log, log


def test_compiler_errors_name_the_real_file_and_line(tmp_path: Path) -> None:
    """The compiler reads the sources where they are (never a copy), and the one line a
    failed build gives is the compiler's first error, ``file:line:column: error: …``;
    warnings are on (-Wall -Wextra) and land in the log. A small loop.cpp keeps it fast."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "loop.cpp").write_text(
        "int f(int unused_parameter) {\n"
        "  int unused_variable = 0;\n"
        "  return 1;\n"
        "}\n"
        "int g() { return undeclared_name; }\n"
    )
    log = tmp_path / "build.log"
    with pytest.raises(RuntimeError) as info:
        native._compile(csrc, tmp_path / "x.so", log)
    message = str(info.value)
    assert message.startswith(f"{csrc / 'loop.cpp'}:5:"), message
    assert "error:" in message and "undeclared_name" in message
    assert message.endswith(f"(the compiler's output: {log})")
    text = log.read_text()
    assert f"{csrc / 'loop.cpp'}:1:" in text and "unused_parameter" in text  # -Wextra
    assert f"{csrc / 'loop.cpp'}:2:" in text and "unused_variable" in text  # -Wall
    assert not (tmp_path / "x.so").exists()


def test_first_error_picks_the_error_line() -> None:
    output = (
        "In file included from /pkg/csrc/loop.cpp:18:\n"
        "/pkg/csrc/gru.h: In function 'void f()':\n"
        "/pkg/csrc/gru.h:26:29: error: 'x' was not declared in this scope\n"
        "/pkg/csrc/gru.h:27:3: error: expected ';'\n"
    )
    assert (
        native._first_error(output)
        == "/pkg/csrc/gru.h:26:29: error: 'x' was not declared in this scope"
    )
    assert (
        native._first_error("a\nb\nc\nld: cannot find -lc10\n") == "b | c | ld: cannot find -lc10"
    )


def test_the_cache_key_follows_every_source_file(tmp_path: Path, monkeypatch) -> None:
    """A change to any header (not only loop.cpp) names a new library: a stale build is
    never loaded for edited sources."""
    before = native._paths()[0].name
    for source in native._sources():
        copy = tmp_path / source.parent.name
        shutil.copytree(native.CSRC, copy, dirs_exist_ok=True)
        (copy / source.name).write_text(source.read_text() + "\n// edited\n")
        monkeypatch.setattr(native, "CSRC", copy)
        assert native._paths()[0].name != before, source.name
        monkeypatch.undo()
    assert {p.name for p in native._sources()} >= {"loop.cpp", "gru.h", "lstm.h", "rnn.h"}


# ----------------------------------------------------------------- one-step operators
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstm_step_equals_autograd_of_the_cell_math(dtype) -> None:
    lib = native.library()
    B, H = 5, 7
    g = torch.Generator().manual_seed(0)
    xp, rec = (torch.randn(B, 4 * H, generator=g, dtype=dtype) for _ in range(2))
    bias = torch.randn(4 * H, generator=g, dtype=dtype)
    c_prev = torch.randn(B, H, generator=g, dtype=dtype)
    a = (xp + rec + bias).requires_grad_()
    cp = c_prev.clone().requires_grad_()
    i, f, gg, o = a.chunk(4, 1)
    i, f, gg, o = i.sigmoid(), f.sigmoid(), gg.tanh(), o.sigmoid()
    c = f * cp + i * gg
    h = o * c.tanh()
    gates = xp.clone()
    h_out, c_out, tanh_c = (torch.empty(B, H, dtype=dtype) for _ in range(3))
    lib.lstm_step(gates, rec, bias, c_prev, h_out, c_out, tanh_c)
    tol = {"atol": 1e-14, "rtol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(h_out, h, **tol)
    torch.testing.assert_close(c_out, c, **tol)
    torch.testing.assert_close(gates, torch.cat([i, f, gg, o], 1), **tol)
    d_h, d_c, d_out = (torch.randn(B, H, generator=g, dtype=dtype) for _ in range(3))
    want_a, want_c = torch.autograd.grad([h, c], [a, cp], [d_h + d_out, d_c])
    d_gates = torch.empty(B, 4 * H, dtype=dtype)
    lib.lstm_step_backward(gates, tanh_c, c_prev, d_h, d_c, d_gates, d_out)
    torch.testing.assert_close(d_gates, want_a, **tol)
    torch.testing.assert_close(d_c, want_c, **tol)  # now the gradient of c_{t−1}
    assert torch.equal(d_h, torch.zeros_like(d_h))  # its recurrent part is computed outside


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("keep", [True, False])
def test_sigmoid_scores_forward_and_backward(dtype, keep) -> None:
    lib = native.library()
    B, S, A = 3, 5, 19  # A not a multiple of the vector width
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(B, S, A, generator=g, dtype=dtype)
    query = torch.randn(B, A, generator=g, dtype=dtype)
    v = torch.randn(A, generator=g, dtype=dtype)
    sig_want = torch.sigmoid(keys + query.unsqueeze(1))
    scores = torch.empty(B, S, dtype=dtype)
    sig = torch.empty(B, S, A, dtype=dtype) if keep else None
    lib.sigmoid_scores(keys, query, v, scores, sig)
    tol = {"atol": 1e-14, "rtol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(scores, sig_want @ v, **tol)
    scaled = torch.empty(B, S, dtype=dtype)  # the keys' scale inside the pass
    lib.sigmoid_scores(keys / 2, query, v, scaled, None, key_scale=2.0)
    torch.testing.assert_close(scaled, sig_want @ v, **tol)
    if sig is None:
        return
    torch.testing.assert_close(sig, sig_want, **tol)
    d_s = torch.randn(B, S, generator=g, dtype=dtype)
    w = torch.randn(A, generator=g, dtype=dtype)
    acc0 = torch.randn(B, S, A, generator=g, dtype=dtype)
    acc = acc0.clone()
    s_sig, d_q = torch.empty(B, A, dtype=dtype), torch.empty(B, A, dtype=dtype)
    lib.sigmoid_scores_backward(d_s, sig, w, s_sig, d_q, acc)
    d_sig = d_s.unsqueeze(2) * sig * (1 - sig)
    torch.testing.assert_close(s_sig, (d_s.unsqueeze(2) * sig).sum(1), **tol)
    torch.testing.assert_close(d_q, w * d_sig.sum(1), **tol)
    torch.testing.assert_close(acc, acc0 + d_sig, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("keep", [True, False])
def test_sigmoid_scores_fill_padding_as_a_masked_fill(dtype, keep) -> None:
    """``padding`` (B, S) or (B, 1, S): −∞ there, the very scores of the pass elsewhere (a
    decoding step's masked fill, in the same pass); σ kept at every position."""
    lib = native.library()
    B, S, A = 3, 5, 19
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(B, S, A, generator=g, dtype=dtype)
    query = torch.randn(B, A, generator=g, dtype=dtype)
    v = torch.randn(A, generator=g, dtype=dtype)
    padding = torch.rand(B, S, generator=g) < 0.4
    plain = torch.empty(B, S, dtype=dtype)
    sig_plain = torch.empty(B, S, A, dtype=dtype)
    lib.sigmoid_scores(keys, query, v, plain, sig_plain, key_scale=2.0)
    for shape in ((B, S), (B, 1, S)):
        scores = torch.empty(B, S, dtype=dtype)
        sig = torch.empty(B, S, A, dtype=dtype) if keep else None
        lib.sigmoid_scores(keys, query, v, scores, sig, key_scale=2.0, padding=padding.view(shape))
        assert torch.equal(scores, plain.masked_fill(padding, float("-inf")))
        if sig is not None:
            assert torch.equal(sig, sig_plain)
    with pytest.raises(RuntimeError, match="padding must be"):
        lib.sigmoid_scores(keys, query, v, plain, None, padding=padding.float())


def test_one_step_operators_refuse_wrong_shapes() -> None:
    lib = native.library()
    with pytest.raises(RuntimeError, match="query must be"):
        lib.sigmoid_scores(
            torch.zeros(2, 3, 4), torch.zeros(2, 5), torch.zeros(4), torch.zeros(2, 3)
        )
    with pytest.raises(RuntimeError, match="must be contiguous"):
        lib.lstm_step(
            torch.zeros(8, 2).T, torch.zeros(2, 8), torch.zeros(8), *(torch.zeros(2, 2),) * 4
        )


def test_loop_operators_refuse_a_wrong_input_weight() -> None:
    """The input product in the loop checks ``w_ih`` against the state width and dtype,
    and the inputs against its width, before touching any buffer."""
    lib = native.library()
    T, B, I, H = 3, 2, 5, 4
    x, h0, c0 = torch.zeros(T, B, I), torch.zeros(B, H), torch.zeros(B, H)
    w_hh, bias = torch.zeros(4 * H, H), torch.zeros(4 * H)
    with pytest.raises(RuntimeError, match=r"w_ih must be \(4H, I\)"):
        lib.lstm_forward(x, w_hh, bias, h0, c0, None, True, None, torch.zeros(3 * H, I))
    with pytest.raises(RuntimeError, match=r"w_ih must be \(4H, I\)"):
        w64 = torch.zeros(4 * H, I, dtype=torch.float64)
        lib.lstm_forward(x, w_hh, bias, h0, c0, None, True, None, w64)
    with pytest.raises(RuntimeError, match=r"x must be \(T, B, 4\) = \(3, 2, 4\)"):
        lib.lstm_forward(x, w_hh, bias, h0, c0, None, True, None, torch.zeros(4 * H, 4))
    _, cs, tc, gates, _ = lib.lstm_forward(
        x, w_hh, bias, h0, c0, None, True, None, torch.zeros(4 * H, I)
    )
    assert gates.shape == (T, B, 4 * H)
    with pytest.raises(RuntimeError, match=r"w_ih must be \(4H, I\)"):
        lib.lstm_backward(
            gates, tc, cs, w_hh, None, None, h0.clone(), c0.clone(), None, torch.zeros(H, I)
        )
    # the outputs' gradient: (T, B, H) with contiguous rows (any other strides: read in
    # place) — else one error, not a read past its end
    for bad in (torch.zeros(T, B, H + 1), torch.zeros(T, B, 2 * H)[..., ::2], torch.zeros(B, H)):
        with pytest.raises(RuntimeError, match=r"d_out must be \(T, B, 4\) = \(3, 2, 4\)"):
            lib.lstm_backward(gates, tc, cs, w_hh, None, bad, h0.clone(), c0.clone(), None, None)
    hs = torch.zeros(T + 1, B, H)
    with pytest.raises(RuntimeError, match=r"d_out must be contiguous \(T, B, H\)"):
        lib.rnn_backward(hs, torch.zeros(H, H), None, torch.zeros(T - 1, B, H), h0.clone(), 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a_t", [False, True, "block"], ids=["a", "a_T", "a_T_block"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b", "b_T"])
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(512, 1600, 128), (203, 517, 45), (64, 3, 7), (70, 0, 33), (5, 9, 4)],
    ids=["weight_grad", "partial_tiles", "short_k", "empty_k", "blas"],
)
def test_matmul_equals_the_float64_product(threads, a_t, b_t, m, k, n) -> None:
    """The library's product (the weight gradients' ``d_gatesᵀ x``; its own kernel where
    the machine has AVX-512) agrees with the float64 product to 1e-6 of the largest value,
    for every layout the backward passes (``d_xp.T`` is a transposed view, a
    layer-normalised cell's ``∂L/∂q`` the transpose of a block of columns), rows and
    columns that fill no whole tile or panel, K over several blocks of 256, and on 2
    threads; float64 is torch's own product, to the bit."""
    lib = native.library()
    torch.manual_seed(0)
    if a_t == "block":  # rows of the transposed matrix 9 values apart beyond its width
        a = torch.randn(k, m + 9)[:, :m].T
    else:
        a = torch.randn(k, m).T if a_t else torch.randn(m, k)
    b = torch.randn(n, k).T if b_t else torch.randn(k, n)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = lib.matmul(a, b)
        got64 = lib.matmul(a.double(), b.double())
        # on as many threads: MKL's float64 product can differ in the last bits between
        # one thread and two (seen on a Sapphire Rapids machine)
        want = a.double() @ b.double()
    finally:
        torch.set_num_threads(before)
    # contiguous: callers view it as they please (one thread turns d_gatesᵀ x round)
    assert got.shape == (m, n) and got.dtype == torch.float32 and got.is_contiguous()
    scale = max(float(want.abs().max()), 1.0)
    assert float((got.double() - want).abs().max()) <= 1e-6 * scale
    assert torch.equal(got64, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["batch_first", "time_major", "strided_rows"])
@pytest.mark.parametrize("a_t", [False, True], ids=["a", "a_T"])
def test_matmul_takes_the_rows_of_a_three_dimensional_b(threads, layout, a_t) -> None:
    """``b (T, B, n)`` stands for its rows ``t·B + b`` wherever they lie (``d_gatesᵀ x``
    with a batch-first input read in place): the same product as on ``b.reshape(T·B, n)``
    to 1e-6 of the largest value; rows that are not contiguous are copied first."""
    lib = native.library()
    torch.manual_seed(1)
    T, B, n, m = 13, 11, 45, 203
    if layout == "batch_first":
        b = torch.randn(B, T, n).transpose(0, 1)
    elif layout == "time_major":
        b = torch.randn(T, B, n)
    else:
        b = torch.randn(T, B, 2 * n)[..., ::2]
    a = torch.randn(T * B, m).T if a_t else torch.randn(m, T * B)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = lib.matmul(a, b)
    finally:
        torch.set_num_threads(before)
    want = a.double() @ b.double().reshape(T * B, n)
    assert got.shape == (m, n)
    assert float((got.double() - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_matmul_refuses_shapes_that_do_not_chain() -> None:
    with pytest.raises(RuntimeError, match=r"matmul needs \(m, k\) and \(k, n\) matrices"):
        native.library().matmul(torch.zeros(3, 4), torch.zeros(5, 2))


@pytest.mark.parametrize(
    ("machine", "capability", "march"),
    [
        ("x86_64", "AVX512", "-march=x86-64-v4"),
        ("x86_64", "AVX2", "-march=x86-64-v3"),
        ("x86_64", "DEFAULT", None),
        ("aarch64", "DEFAULT", None),
    ],
)
def test_the_build_targets_the_widest_vectors_torch_found(
    monkeypatch, machine, capability, march
) -> None:
    """AVX-512 machines get the 16-float kernel (x86-64-v4), AVX2 ones the 8-float one;
    elsewhere no -march (the portable build, products on the BLAS). The flags are part
    of the cache key, so a library built for one never loads for the other."""
    monkeypatch.setattr(native.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    flags = native._flags()
    marches = [f for f in flags if f.startswith("-march")]
    assert marches == ([march] if march else [])


def test_own_matmul_says_whether_the_build_has_its_own_kernel() -> None:
    """The library's matmul is its own kernel exactly where the build targets AVX-512;
    without the library there is none."""
    assert native.own_matmul() == ("-march=x86-64-v4" in native._flags())
    with native.use_native(False):
        assert native.own_matmul() is False


@pytest.mark.parametrize("nonlinearity", ["tanh", "sigmoid"])
def test_float64_activations_are_within_two_ulp_of_torch(nonlinearity: str) -> None:
    """The compiled loop's own float64 tanh and sigmoid (vectorised, not the C library's):
    a cell whose step is the activation of its input alone (W_ih = I, W_hh = 0, no bias)
    over a dense grid of [-40, 40], against torch's functions."""
    H = 16
    layer = RNN(H, H, nonlinearity=nonlinearity).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
        layer.cells()[0].weight_ih.copy_(torch.eye(H, dtype=torch.float64))
    grid = torch.linspace(-40, 40, 64 * H + 1, dtype=torch.float64)[: 64 * H]
    x = grid.view(64, 1, H)  # (B, T = 1, I)
    with native.use_native(True):
        ours = layer(x).outputs.view(-1)
    ref = torch.tanh(grid) if nonlinearity == "tanh" else torch.sigmoid(grid)
    ulp = torch.finfo(torch.float64).eps * ref.abs().clamp_min(torch.finfo(torch.float64).tiny)
    assert bool(((ours - ref).abs() <= 2 * ulp).all()), float(((ours - ref).abs() / ulp).max())
