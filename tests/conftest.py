"""Shared fixtures of the recurrent-core contract (CONTRIBUTING.md, "Tests").

``cell_spec`` runs a test once per cell variant (RNN tanh/relu/sigmoid, LSTM, and the GRU with all
four ``update`` × ``reset`` combinations); ``torch_spec`` only over the forms ``torch.nn``
can express. Each ``CellSpec`` knows how to build the cell and the layer and how to run the
plain differentiable oracle (``rnn_step`` / ``lstm_step`` / ``gru_step`` in a Python loop
with ``torch.where`` hold-state at masked steps), which every explicit-BPTT result is
compared with. ``task_data`` writes small files of every task for the tests that train
each task once (tests/app/tasks/test_run_outputs.py, tests/app/cli/test_tasks_on_cuda.py).
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from rnnkit.cells.gru import gru_step
from rnnkit.cells.lstm import lstm_step
from rnnkit.cells.rnn import rnn_step
from rnnkit.data.events import write_sessions
from rnnkit.data.generated import (
    letter_order_examples,
    previous_word_sentences,
    write_labelled,
    write_token_tags,
)
from rnnkit.data.generated_pairs import generate_pairs, write_pairs
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.types import LSTMState

DTYPE = torch.float64

# `make test-fast` leaves these out (`-m "not slow"`); `make test` and CI run them: the
# command line end to end, the documentation and report pages, packaging, compilation,
# distributed training, crash and fuzz tests (paths relative to the repository).
SLOW = (
    "tests/app/cli/",
    "tests/app/report/",
    "tests/app/tasks/test_default_options.py",
    "tests/docs_exec/",
    "tests/fuzz/",
    "tests/recipes/",
    "tests/training/test_crash_safety.py",
    "tests/training/test_distributed.py",
    "tests/layers/test_dropin_distributed.py",
    "tests/bptt/test_tracing.py",
    "tests/test_docs.py",
    "tests/test_packaging.py",
    "tests/test_tuning.py",
    "tests/test_heap.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        try:
            where = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if where.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


# One intra-op thread for the whole suite: the tests use tiny tensors, where a second
# OpenMP thread only adds synchronisation (20-40x slower on a loaded 2-core machine).
# Speed is measured in benchmarks/, never here.
torch.set_num_threads(1)
# ... and for the training runs of the suite, whose thread choice (rnnkit.threads) would
# otherwise follow the load; tests/test_threads.py tests that choice with fake inputs.
os.environ.setdefault("RNNKIT_THREADS", "1")
# `rnnkit train` writes its HTML report by default; the report has tests of its own, so the
# many tiny training runs of the suite skip it (RNNKIT_REPORT=0 is the documented switch).
os.environ.setdefault("RNNKIT_REPORT", "0")


@dataclass(frozen=True)
class CellSpec:
    """One cell variant: its kind, options, and how to build and step it."""

    name: str
    kind: str  # "rnn", "lstm", "gru"
    options: dict[str, Any] = field(default_factory=dict)

    # ---- construction -------------------------------------------------------------
    @property
    def num_states(self) -> int:
        return 2 if self.kind == "lstm" else 1

    @property
    def is_lstm(self) -> bool:
        return self.kind == "lstm"

    @property
    def torch_expressible(self) -> bool:
        if self.kind == "rnn":  # torch.nn.RNN has tanh and relu, not the logistic
            return self.options.get("nonlinearity", "tanh") in ("tanh", "relu")
        if self.kind != "gru":
            return True
        return self.options == {"update": "keep", "reset": "after"}

    def cell(self, I: int, H: int, seed: int = 0, dtype: torch.dtype = DTYPE, **extra):
        from rnnkit import GRUCell, LSTMCell, RNNCell

        cls = {"rnn": RNNCell, "lstm": LSTMCell, "gru": GRUCell}[self.kind]
        torch.manual_seed(seed)
        return cls(I, H, **self.options, **extra).to(dtype)

    def layer(
        self,
        I: int,
        H: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        seed: int = 0,
        dtype: torch.dtype = DTYPE,
        **extra,
    ):
        cls = {"rnn": RNN, "lstm": LSTM, "gru": GRU}[self.kind]
        torch.manual_seed(seed)
        layer = cls(I, H, num_layers, bidirectional, **extra, **self.options)
        return layer.to(dtype)

    def torch_layer(self, I, H, num_layers=1, bidirectional=False, dtype=DTYPE, seed=0):
        assert self.torch_expressible
        torch.manual_seed(seed)
        kw: dict[str, Any] = {"batch_first": True}
        if self.kind == "rnn":
            kw["nonlinearity"] = self.options.get("nonlinearity", "tanh")
        cls = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[self.kind]
        return cls(I, H, num_layers, bidirectional=bidirectional, **kw).to(dtype)

    def torch_cell(self, I, H, dtype=DTYPE, seed=0):
        assert self.torch_expressible
        torch.manual_seed(seed)
        if self.kind == "rnn":
            return nn.RNNCell(I, H, nonlinearity=self.options.get("nonlinearity", "tanh")).to(dtype)
        return {"lstm": nn.LSTMCell, "gru": nn.GRUCell}[self.kind](I, H).to(dtype)

    def grad_pairs(self, cell, tmod, sfx: str = "") -> list[tuple[str, Tensor, Tensor]]:
        """``(name, rnnkit grad, torch grad)`` for every parameter, after ``backward``.

        rnnkit's one bias is torch's ``b_ih + b_hh``, so its gradient equals both of
        torch's; the GRU's ``bias_hn`` is torch's ``bias_hh`` n block.
        """
        H = cell.hidden_size

        def tg(name: str) -> Tensor:
            return getattr(tmod, name + sfx).grad

        pairs = [
            ("weight_ih", cell.weight_ih.grad, tg("weight_ih")),
            ("weight_hh", cell.weight_hh.grad, tg("weight_hh")),
            ("bias~bias_ih", cell.bias.grad, tg("bias_ih")),
        ]
        if self.kind == "gru":
            pairs.append(
                ("bias[r,z]~bias_hh[r,z]", cell.bias.grad[: 2 * H], tg("bias_hh")[: 2 * H])
            )
            pairs.append(("bias_hn~bias_hh[n]", cell.bias_hn.grad, tg("bias_hh")[2 * H :]))
        else:
            pairs.append(("bias~bias_hh", cell.bias.grad, tg("bias_hh")))
        for name, a, b in pairs:
            assert a is not None and b is not None, f"no gradient for {name}{sfx}"
        return pairs

    # ---- states --------------------------------------------------------------------
    def pack(self, states: tuple[Tensor, ...]):
        """A tuple of state tensors → what the cell/layer API takes (LSTMState or tensor)."""
        return LSTMState(*states) if self.is_lstm else states[0]

    def unpack(self, state) -> tuple[Tensor, ...]:
        return tuple(state) if self.is_lstm else (state,)

    # ---- the oracle ----------------------------------------------------------------
    def step(self, cell, x: Tensor, states: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """One step in plain differentiable ops (the cells' oracle step functions)."""
        w = cell.weights()
        if self.kind == "rnn":
            return (rnn_step(x, states[0], w, cell.nonlinearity),)
        if self.kind == "lstm":
            return tuple(lstm_step(x, LSTMState(*states), w))
        return (gru_step(x, states[0], w, cell.update, cell.reset),)

    def run(self, cell, x: Tensor, states0: tuple[Tensor, ...], mask: Tensor | None = None):
        """Oracle time loop over ``x (T, B, I)`` with ``mask (T, B)``: hold at masked steps.

        Returns ``(outputs (T, B, H), final states tuple)``; outputs are the h states.
        """
        prev = states0
        outs = []
        for t in range(x.shape[0]):
            new = self.step(cell, x[t], prev)
            if mask is not None:
                m = mask[t][:, None]
                new = tuple(torch.where(m, a, b) for a, b in zip(new, prev, strict=True))
            prev = new
            outs.append(prev[0])
        return torch.stack(outs), prev

    def run_layer(self, layer, x: Tensor, mask: Tensor | None = None, state=None):
        """Oracle of a whole ``StackedRecurrent`` on batch-first ``x (B, T, I)``.

        The reverse direction is built row by row with Python index lists: each row's span
        ``[0, last real step]`` is reversed, the padding after it stays where it is.
        Returns ``(outputs (B, T, Σ H_d), final states tuple of (L, D, B, max H_d))``.
        """
        B, T, _ = x.shape
        L, D = layer.num_layers, layer.num_directions
        m = torch.ones(B, T, dtype=torch.bool) if mask is None else mask
        cells = layer.cells()
        h = x.transpose(0, 1)  # (T, B, ·)
        mt = m.T  # (T, B)
        idx = torch.empty(T, B, dtype=torch.long)
        for b in range(B):
            real = [t for t in range(T) if bool(m[b, t])]
            extent = real[-1] + 1 if real else 0
            idx[:, b] = torch.tensor([extent - 1 - t if t < extent else t for t in range(T)])
        finals: list[list[tuple[Tensor, ...]]] = []
        for l in range(L):
            outs, fins = [], []
            for d in range(D):
                cell = cells[l * D + d]
                H = cell.hidden_size  # directions may differ in width: each its own
                if state is None:
                    s0 = tuple(h.new_zeros(B, H) for _ in range(self.num_states))
                else:
                    s0 = tuple(s[l, d, :, :H] for s in self.unpack(state))
                if d == 0:
                    o, f = self.run(cell, h, s0, mt)
                else:
                    hr = torch.stack([h[idx[:, b], b] for b in range(B)], dim=1)
                    mr = torch.stack([mt[idx[:, b], b] for b in range(B)], dim=1)
                    o_r, f = self.run(cell, hr, s0, mr)
                    o = torch.empty_like(o_r)
                    for b in range(B):
                        o[idx[:, b], b] = o_r[:, b]
                outs.append(o)
                fins.append(f)
            h = torch.cat(outs, dim=-1)
            finals.append(fins)
        # (L, D, B, max H_d): a narrower direction's units first, zeros after them
        width = max(c.hidden_size for c in cells)

        def padded(t: Tensor) -> Tensor:
            return torch.cat([t, t.new_zeros(B, width - t.shape[-1])], dim=-1)

        stacked = tuple(
            torch.stack(
                [torch.stack([padded(finals[l][d][k]) for d in range(D)]) for l in range(L)]
            )
            for k in range(self.num_states)
        )
        return h.transpose(0, 1), stacked


ALL_SPECS = [
    CellSpec("rnn_tanh", "rnn", {"nonlinearity": "tanh"}),
    CellSpec("rnn_relu", "rnn", {"nonlinearity": "relu"}),
    CellSpec("rnn_sigmoid", "rnn", {"nonlinearity": "sigmoid"}),
    CellSpec("lstm", "lstm"),
    CellSpec("gru_candidate_before", "gru", {"update": "candidate", "reset": "before"}),
    CellSpec("gru_candidate_after", "gru", {"update": "candidate", "reset": "after"}),
    CellSpec("gru_keep_before", "gru", {"update": "keep", "reset": "before"}),
    CellSpec("gru_keep_after", "gru", {"update": "keep", "reset": "after"}),
]
TORCH_SPECS = [s for s in ALL_SPECS if s.torch_expressible]
GRU_SPECS = [s for s in ALL_SPECS if s.kind == "gru"]


@pytest.fixture(params=ALL_SPECS, ids=lambda s: s.name)
def cell_spec(request) -> CellSpec:
    """Every cell variant of the library."""
    return request.param


@pytest.fixture(params=TORCH_SPECS, ids=lambda s: s.name)
def torch_spec(request) -> CellSpec:
    """The cell variants that ``torch.nn`` can express (RNN, LSTM, GRU keep/after)."""
    return request.param


@pytest.fixture(params=GRU_SPECS, ids=lambda s: s.name)
def gru_spec(request) -> CellSpec:
    """The four GRU variants (update × reset)."""
    return request.param


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny-tensor tests on one intra-op thread, then restore the setting.

    On a loaded 2-core machine OpenMP spin-waiting makes small backward passes ~40×
    slower; nothing these tests compute is large enough to gain from a second thread.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["compiled", "pytorch"])
def time_loop(request):
    """Run a test once on each time loop: the compiled one (``rnnkit.bptt.native``) and the
    PyTorch loop (the fallback and oracle). Both must pass the same contract."""
    from rnnkit.bptt import native

    compiled = request.param == "compiled"
    if compiled and not native.available():
        pytest.skip("the compiled time loop is unavailable on this machine")
    with native.use_native(compiled):
        yield request.param


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator for test data."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def holey_mask() -> Tensor:
    """``(B=4, T=6)`` bool: a full row, a prefix, a zero-length row, and a row with holes."""
    return torch.tensor(
        [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [1, 0, 1, 1, 0, 1],
        ],
        dtype=torch.bool,
    )


@pytest.fixture
def run_cli(capsys):
    """``run_cli(*argv) -> (exit status, stdout, stderr)``: the ``rnnkit`` command run in
    this process, its output captured (argparse's ``SystemExit`` gives the status)."""
    from rnnkit.app.cli.main import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="module")
def triton_interpreter():
    """Triton's interpreter for one test module's kernels (``rnnkit.bptt.gpu_steps`` on
    the CPU); nothing of it stays afterwards (triton reads the variable when the kernels
    are decorated, at their import)."""
    kernels = (
        "rnnkit.bptt.triton_kernels",
        "rnnkit.bptt.triton_ln_kernels",
        "rnnkit.bptt.triton_step_kernels",
    )
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    for name in kernels:
        sys.modules.pop(name, None)
    yield
    for name in kernels:
        sys.modules.pop(name, None)
    if before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = before


# Compiles Triton kernels for an H200 (sm_90) in float32 and float64, as a GPU would at
# first use: Triton's own compiler and the ptxas it ships, no GPU needed. The interpreter
# checks what the kernels compute; this, that a GPU's compiler takes them (types, casts).
# Every switch a kernel has for the regularizers is on, so that their branches compile.
_COMPILE = """
import json, sys
import importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

K = importlib.import_module(sys.argv[1])
block = int(sys.argv[2])
INTS = set(sys.argv[4].split(","))
ON = {"RMASK": True, "ZH": True, "ZC": True, "CN": True}
done = []
for dtype in ("fp32", "fp64"):
    for fn, consts in eval(sys.argv[3]):
        given = {**ON, "BLOCK": block, **consts}
        consts = {k: v for k, v in given.items() if k in fn.arg_names}
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name in INTS:
                sig[name] = "i32"
            else:
                sig[name] = "*i8" if name in ("mask", "reset") else "*" + dtype
        where = {(fn.arg_names.index(k),): v for k, v in consts.items()}
        try:
            source = ASTSource(fn=fn, signature=sig, constexprs=where)
        except TypeError:  # triton before 3.3: the constants by name
            source = ASTSource(fn=fn, signature=sig, constants=consts)
        compiled = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": True}
        )
        done.append([fn.__name__, dtype, "cubin" in compiled.asm])
print(json.dumps(done))
"""


@pytest.fixture
def compile_for_sm90(tmp_path):
    """``compile(module, cases, block, ints)``: compile each ``(K.kernel, constexprs)`` of
    the Python list ``cases`` (``K`` the module) for sm_90 in a fresh process, the
    arguments named in ``ints`` as 32-bit integers and the others pointers, and return
    ``[name, dtype, cubin made]`` per compilation; skipped without triton's NVIDIA backend
    or its ptxas."""
    import json
    import subprocess

    pytest.importorskip("triton.backends.nvidia")

    def compile_cases(
        module: str, cases: str, block: int = 1024, ints: str = "t,tc,B,H,kt,kb"
    ) -> list[list[Any]]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not found in a cache
        argv = [sys.executable, "-c", _COMPILE, module, str(block), cases, ints]
        run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if "ptxas" in run.stderr and run.returncode != 0:
            pytest.skip("no ptxas with this triton")
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout)

    return compile_cases


@pytest.fixture
def count_calls(monkeypatch):
    """``count(owner, name)``: ``owner.name`` replaced, for this test, by a wrapper that
    counts its calls; returns the count as ``{"n": calls}``."""

    def count(owner: Any, name: str) -> dict[str, int]:
        calls = {"n": 0}
        real = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
        return calls

    return count


# ---- files for a tiny run of every task (the run-outputs and CUDA task tests) ----


def _task_sequences(path: Path, n: int, seed: int, labelled: bool = False) -> None:
    """Two-value sequences of 8 frames (a sine and a cosine from a random phase); with
    ``labelled``, ``up`` or ``down`` by the first value's first move."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        t = float(torch.rand(1, generator=gen)) * 6 + 0.4 * torch.arange(8)
        seq = torch.stack([t.sin(), t.cos()], 1).tolist()
        label = {"label": "up" if seq[1][0] > seq[0][0] else "down"} if labelled else {}
        rows.append(json.dumps({"seq": seq, **label}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _task_params_sessions(path: Path, n: int, seed: int) -> None:
    """Sessions ``open (size) → reads (latency) → close`` with their parameter values."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        reads = rng.randint(2, 4)
        events = ["open", *["read"] * reads, "close"]
        params = [[rng.gauss(1000, 100)], *[[rng.gauss(10, 1)] for _ in range(reads)], []]
        rows.append(json.dumps({"session": f"s{seed}-{i}", "events": events, "params": params}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def task_data(tmp_path_factory) -> Path:
    """A directory with small training (and validation) files of every task: text,
    tagged tokens, labelled lines, pairs, event sessions, sessions with parameters,
    real-valued sequences (unlabelled and labelled)."""
    d = tmp_path_factory.mktemp("task_data")
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 40, encoding="utf-8")
    write_token_tags(previous_word_sentences(60, seed=0, noise=0.1), d / "tags.tsv")
    write_labelled(letter_order_examples(80, seed=0, noise=0.1), d / "labels.tsv")
    write_pairs(d / "pairs.tsv", generate_pairs("reverse", 48, seed=0, max_len=5))
    write_sessions(d / "sessions.jsonl", generate_sessions(60, anomalies=0, seed=1))
    write_sessions(d / "valid.jsonl", generate_sessions(30, anomalies=3, seed=2))
    _task_params_sessions(d / "params.jsonl", 40, 0)
    _task_params_sessions(d / "params-valid.jsonl", 20, 1)
    _task_sequences(d / "seq.jsonl", 40, 0)
    _task_sequences(d / "seq-valid.jsonl", 10, 1)
    _task_sequences(d / "labelled.jsonl", 40, 2, labelled=True)
    return d
