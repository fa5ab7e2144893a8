"""Whole models of every task on the GPU paths, forced on the CPU, against the CPU's path.

The layer-level tests (``tests/bptt/test_fused.py``, ``test_gpu_steps*.py``,
``test_gpu_step_lib.py``) hold each path to the explicit BPTT; here whole models (the
language models, the tagger, the classifier, the encoder–decoder with each attention kind
and wiring, the regressor) run one training step on each path and must give the CPU
default's loss and every parameter's gradient in float64 (to 1e-10), and decode the
same tokens. The paths:

* ``fused``: PyTorch's fused kernels (cuDNN's functions) wherever they compute the layer;
* ``triton``: the Triton steps everywhere, in Triton's interpreter;
* ``gpu``: what ``auto`` runs on a GPU — the fused kernels where they compute the layer,
  the Triton steps elsewhere, no compiled loop — emulated on CPU tensors (``_on_a_gpu``).

Each case also checks which path each layer took (docs/architecture.md, "Which path
runs a layer"), so that a model cannot pass by silently running the CPU's loop. Last,
``rnnkit train`` and a command that reads the run (generate, evaluate, score, predict)
run a few tasks end to end on the ``gpu`` emulation, to the CPU's training loss.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rnnkit.bptt import forward, fused, gpu_route, recurrence
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.native import use_native
from rnnkit.data.pairs import make_pair_batch
from rnnkit.generation.search import generate
from rnnkit.layers import fused_stack
from rnnkit.models import ModelSpec
from rnnkit.models.builders import build_encoder, build_lm
from rnnkit.models.classifier import build_classifier
from rnnkit.models.decoder_only import build_decoder_only
from rnnkit.models.regressor import Regressor
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.tagger import build_tagger

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_interpreter", "single_thread")  # tests/conftest.py

V = 9  # vocabulary: ids 0-3 special, 4-8 tokens
SMALL = {"hidden": 5, "embedding": 4}
PATHS = ("fused", "triton", "gpu")


@contextlib.contextmanager
def _on_a_gpu() -> Iterator[None]:
    """``auto`` as it runs CUDA tensors, on CPU tensors: the fused kernels where
    :func:`rnnkit.bptt.fused.wants_fused` says they compute the layer, the Triton steps
    where :func:`rnnkit.bptt.gpu_route.wants_steps` says they do, and no compiled loop
    (which takes CPU tensors only)."""
    before = fused._path, gpu_route._path
    fused._path = lambda: "fused"  # type: ignore[assignment]
    gpu_route._path = lambda: "triton"  # type: ignore[assignment]
    try:
        with use_native(False):
            yield
    finally:
        fused._path, gpu_route._path = before


def _path(name: str) -> contextlib.AbstractContextManager[None]:
    return _on_a_gpu() if name == "gpu" else use_fused(name)


@pytest.fixture
def routes(monkeypatch) -> Counter[tuple[str, str, bool]]:
    """``(kernel class, path, whether the fused kernels compute it)`` of every layer
    call's route; ``(kernel class, "record", False)`` where the Triton steps wrote a
    forward's record for the PyTorch loop's backward (windows, recompute)."""
    seen: Counter[tuple[str, str, bool]] = Counter()
    real_route, real_record = recurrence.route, forward.steps_record

    def route(kernel, *args, **kwargs):
        way = real_route(kernel, *args, **kwargs)
        seen[(type(kernel).__name__, way.path, fused.fused_form(kernel) is not None)] += 1
        return way

    def record(kernel, x):
        used = real_record(kernel, x)
        if used:
            seen[(type(kernel).__name__, "record", False)] += 1
        return used

    def whole_stack(kernels, *args, **kwargs):  # a stack in one fused call: each layer's
        for kernel in kernels:
            seen[(type(kernel).__name__, "fused", True)] += 1
        return real_stack(kernels, *args, **kwargs)

    real_stack = fused_stack.run_fused_stack
    monkeypatch.setattr(recurrence, "route", route)
    monkeypatch.setattr(forward, "steps_record", record)
    monkeypatch.setattr(fused_stack, "run_fused_stack", whole_stack)
    return seen


def _lengths(B: int, T: int, lengths: list[int]) -> torch.Tensor:
    return torch.arange(T)[None] < torch.tensor(lengths)[:, None]


def _ids(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    return torch.randint(4, V, (B, T), generator=g)


# ---------------------------------------------------------------- one training step
# Each case: (build the model, its loss on a fixed batch). Lengths leave padding (a
# prefix mask: the fused kernels take it as packed sequences).


def _lm(spec: ModelSpec, starts: bool = False, window: int | None = None):
    def loss(m, g):
        B, T = 3, 6
        x, y = _ids(g, B, T), _ids(g, B, T)
        if spec.condition != "none":
            return m.loss(torch.tensor([0, 1, 0]), x, y, mask=_lengths(B, T, [6, 4, 5])).loss
        if spec.length != "eos":  # whole sequences <s> y… and y… </s>
            for b, n in enumerate([5, 3, 4]):
                x[b, 0], y[b, n - 1], x[b, n:], y[b, n:] = 2, 3, 0, 0
        if starts:  # document starts: the layers' resets
            s = torch.zeros(B, T, dtype=torch.bool)
            s[0, 3] = s[2, 2] = True
            return m.loss(x, y, starts=s, window=window).loss
        return m.loss(x, y, mask=_lengths(B, T, [5, 3, 4] if spec.length != "eos" else [6, 4, 5]),
                      window=window).loss  # fmt: skip

    return lambda: build_lm(spec, V, 2), loss


def _tagger(spec: ModelSpec):
    def loss(m, g):
        B, T = 3, 5
        words, tags = _ids(g, B, T), torch.randint(0, 4, (B, T), generator=g)
        chars = torch.randint(1, 7, (B, T, 3), generator=g) if spec.char_rnn else None
        return m.loss(words, tags, _lengths(B, T, [5, 3, 4]), chars).loss

    return lambda: build_tagger(spec, V, 4, 7 if spec.char_rnn else None), loss


def _classifier(spec: ModelSpec):
    def loss(m, g):
        return m.loss(_ids(g, 3, 5), torch.tensor([0, 2, 1]), _lengths(3, 5, [5, 2, 4])).loss

    return lambda: build_classifier(spec, V, 3), loss


def _scheduled_lm(spec: ModelSpec):
    """Scheduled sampling: the steps one at a time through the stack."""

    def loss(m, g):
        x, y, coins = _ids(g, 3, 6), _ids(g, 3, 6), torch.Generator().manual_seed(2)
        return m.scheduled_loss(x, y, _lengths(3, 6, [6, 4, 5]), 0.5, coins).loss

    return lambda: build_lm(spec, V), loss


def _seq2seq(spec: ModelSpec, sampling_p: float | None = None, decoder_only: bool = False):
    sources = [np.array([4, 5, 6, 7]), np.array([5, 6]), np.array([8, 4, 5])]
    targets = [np.array([6, 5, 4]), np.array([7]), np.array([5, 8, 6, 4])]

    def loss(m, g):
        batch = make_pair_batch(sources, targets)
        if sampling_p is None:
            return m.loss(batch).loss
        return m.loss(batch, sampling_p, torch.Generator().manual_seed(2)).loss

    build = build_decoder_only if decoder_only else build_seq2seq
    return lambda: build(spec, V, V), loss


def _regressor(spec: ModelSpec, target: str = "next", kind: str = "mse"):
    def build():
        encoder = build_encoder(spec, 2, bidirectional=spec.bidirectional)
        return Regressor(encoder, 2, target, kind, dropout=spec.dropout)

    def loss(m, g):
        B, T = 3, 5
        x = torch.randn(B, T, 2, generator=g, dtype=torch.float64)
        shape = (B, T, 2) if target == "next" else (B, 2)
        y = torch.randn(*shape, generator=g, dtype=torch.float64)
        return m.loss(x, y, _lengths(B, T, [5, 3, 4])).loss

    return build, loss


def _spec(**fields: Any) -> ModelSpec:
    return ModelSpec(**{**SMALL, **fields})


GRU_BEFORE = {"cell": "gru", "reset": "before"}
GRU_AFTER = {"cell": "gru", "reset": "after", "update": "keep"}
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[..., torch.Tensor]]] = {
    # language models (lm, events): the task's own defaults, every cell form, the options
    # that change the route
    "lm-defaults": _lm(ModelSpec.for_task("lm", **SMALL)),
    "lm-gru-before": _lm(_spec(**GRU_BEFORE)),
    "lm-gru-after-candidate": _lm(_spec(cell="gru", reset="after", update="candidate")),
    "lm-rnn-relu-sigmoid": _lm(_spec(cell="rnn", nonlinearity="relu,sigmoid", layers=2)),
    "lm-recurrent-dropout-zoneout": _lm(_spec(recurrent_dropout=0.3, zoneout=0.2)),
    "lm-gru-zoneout": _lm(_spec(**GRU_BEFORE, recurrent_dropout=0.3, zoneout=0.2)),
    "lm-layer-norm": _lm(_spec(layer_norm=True, layers=2, recurrent_dropout=0.2)),
    "lm-gru-layer-norm": _lm(_spec(**GRU_AFTER, layer_norm=True, zoneout=0.2)),
    "lm-window": _lm(_spec(layers=2), window=2),
    "lm-starts": _lm(_spec(layers=2), starts=True),
    "lm-gru-starts-window": _lm(_spec(**GRU_BEFORE, layers=2), starts=True, window=2),
    "lm-recompute": _lm(_spec(**GRU_BEFORE, layers=2, recompute=2)),
    "lm-weight-drop": _lm(_spec(weight_drop=0.3, input_dropout=0.2, embedding_dropout=0.2)),
    "lm-length": _lm(_spec(length="predict", max_len=8)),
    "lm-conditional": _lm(_spec(condition="both")),
    "lm-scheduled-sampling": _scheduled_lm(_spec(layers=2, dropout=0.2)),
    # tag, classify, regress (and params, a regressor per key)
    "tag-char-rnn": _tagger(ModelSpec.for_task("tag", **SMALL)),
    "tag-gru": _tagger(_spec(**GRU_BEFORE, layers=2, dropout=0.3)),
    "classify-bidirectional": _classifier(_spec(bidirectional=True, pooling="max")),
    "classify-gru-after": _classifier(_spec(**GRU_AFTER, pooling="last")),
    "regress-next": _regressor(_spec()),
    "regress-value-gaussian": _regressor(
        _spec(**GRU_BEFORE, bidirectional=True, layers=2), "value", "gaussian"
    ),
    # seq2seq: no attention, each kind before and after the decoder step, both cells
    "seq2seq-none": _seq2seq(_spec(attention="none", bidirectional=True)),
    "seq2seq-rnn-additive": _seq2seq(_spec(cell="rnn", attention="additive")),
    "seq2seq-length": _seq2seq(_spec(attention="dot", length="predict", max_len=6)),
    "seq2seq-scheduled-sampling": _seq2seq(
        _spec(attention="additive", bidirectional=True), sampling_p=0.5
    ),
    "seq2seq-gru-scheduled-sampling": _seq2seq(
        _spec(**GRU_BEFORE, attention="dot", attention_wiring="after"), sampling_p=0.5
    ),
    "seq2seq-decoder-only": _seq2seq(_spec(**GRU_BEFORE, layers=2), decoder_only=True),
    "seq2seq-encoder-regularized": _seq2seq(
        _spec(attention="additive", recurrent_dropout=0.2, zoneout=0.2, input_dropout=0.2)
    ),
}
for _kind in ("dot", "bilinear", "additive"):
    for _cell, _form in (("lstm", {}), ("gru", GRU_BEFORE), ("gru-after", GRU_AFTER)):
        for _wiring in ("before", "after"):
            # dot attention needs the decoder's width: a unidirectional encoder
            _shape = {"bidirectional": _kind != "dot", "layers": 2 if _kind == "bilinear" else 1}
            CASES[f"seq2seq-{_kind}-{_cell}-{_wiring}"] = _seq2seq(
                _spec(**{"cell": "lstm", **_form}, attention=_kind, attention_wiring=_wiring,
                      context="both", **_shape)
            )  # fmt: skip
# the interpreter makes these the slow ones: left out of `make test-fast`
SLOW = {"lm-layer-norm", "lm-gru-layer-norm", "lm-recompute", "tag-char-rnn"}
SLOW |= {name for name in CASES if name.startswith("seq2seq-") and "-lstm-" not in name}


def _one_step(case, path: str | None, dtype=torch.float64, autocast: bool = False):
    """The loss and every parameter's gradient of one training step (dropout on, drawn
    from the same seed) on ``path`` (None: the CPU's default)."""
    build, loss_of = case
    torch.manual_seed(0)
    model = build().to(dtype).train()
    g = torch.Generator().manual_seed(1)
    where = contextlib.nullcontext() if path is None else _path(path)
    low = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with where:
        with low:
            torch.manual_seed(5)
            loss = loss_of(model, g)
        names = [n for n, p in model.named_parameters()]
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    return loss.detach(), dict(zip(names, grads, strict=True))


@functools.cache
def _cpu_step(name: str, dtype=torch.float64, autocast: bool = False):
    """:func:`_one_step` of ``CASES[name]`` on the CPU's default path: the reference each
    forced path is held to, computed once per case (the tests only read it)."""
    return _one_step(CASES[name], None, dtype, autocast)


def _expected_paths(seen: Counter[tuple[str, str, bool]], path: str) -> None:
    """Each layer on the path docs/architecture.md names for it (every mask here is
    lengths, which the fused kernels take): ``fused``, the fused kernels for their forms
    and the loop for the rest; ``triton``, the Triton steps for all; ``gpu``, the fused
    kernels for their forms and the Triton steps for the rest. A window or recompute's
    forward is the Triton steps' record on those two, the loop's on ``fused``."""
    for kernel, taken, fusable in seen:
        if taken == "record":
            assert path != "fused", seen
            continue
        want = {
            "fused": "fused" if fusable else "loop",
            "triton": "triton",
            "gpu": "fused" if fusable else "triton",
        }[path]
        assert taken == want, f"{kernel} ran on {taken}, not {want}: {dict(seen)}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES]
)
def test_one_training_step_equals_the_cpu_path(name, path, routes):
    want_loss, want = _cpu_step(name)
    routes.clear()
    got_loss, got = _one_step(CASES[name], path)
    assert routes or path == "fused", "no layer ran on the path"
    _expected_paths(routes, path)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-10, rtol=1e-10)
    for param, w in want.items():
        assert (got[param] is None) == (w is None), param
        if w is not None:
            torch.testing.assert_close(got[param], w, atol=1e-10, rtol=1e-10, msg=param)


def test_on_a_gpu_one_model_runs_both_kinds(routes):
    # the emulation of a GPU's auto: a stack of a relu layer (cuDNN's function) and a
    # sigmoid one (not), each on its own path; a window's forward on the Triton steps
    _one_step(_lm(_spec(cell="rnn", nonlinearity="relu,sigmoid", layers=2)), "gpu")
    assert set(routes) == {("RNNKernel", "fused", True), ("RNNKernel", "triton", False)}
    routes.clear()
    _one_step(CASES["lm-window"], "gpu")
    assert set(routes) == {("LSTMKernel", "record", False)}


# ------------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["lm-defaults", "tag-char-rnn", "seq2seq-additive-lstm-before"])
def test_under_autocast_the_recurrence_stays_float32_on_every_path(name, path):
    # --precision bf16|fp16: the fused kernels ran in bfloat16 under autocast (oneDNN's
    # layer on the CPU, cuDNN's on a GPU), the loss ~1e-4 off the CPU path's, and the
    # tagger's character encoder returned bfloat16 rows that its float32 buffer refused
    want_loss, want = _cpu_step(name, torch.float32, autocast=True)
    got_loss, got = _one_step(CASES[name], path, torch.float32, autocast=True)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-6, rtol=1e-6)
    # float32 rounding, relative to the model's largest gradient entry
    scale = max(float(w.abs().max()) for w in want.values() if w is not None)
    for param, w in want.items():
        if w is not None:
            assert float((got[param] - w).abs().max()) <= 1e-5 * scale, param


# ------------------------------------------------------------------------- decoding


def _decoded(model_case: str, spec: ModelSpec, path: str | None):
    torch.manual_seed(0)
    where = contextlib.nullcontext() if path is None else _path(path)
    results: list[Any] = []
    with where, torch.no_grad():
        if model_case == "seq2seq":
            m = build_seq2seq(spec, V, V).double().eval()
            b = make_pair_batch([np.array([4, 5, 6, 7]), np.array([5, 6])], None)
            results += m.decode(b.source, b.source_mask, beam=1, max_length=5)
            results += m.decode(b.source, b.source_mask, beam=3, max_length=5, num=2)
            g = torch.Generator().manual_seed(3)
            results += m.sample(b.source, b.source_mask, num=2, max_length=5, generator=g)
        else:
            m = build_lm(spec, V).double().eval()
            g = torch.Generator().manual_seed(3)
            results.append(generate(m, [2, 5, 6], max_length=5, eos_id=3, num=2, generator=g))
            results.append(generate(m, [2, 5], max_length=5, eos_id=3, strategy="beam",
                                    beam_size=3, num=2))  # fmt: skip
    return [(tuple(r.ids), r.logprob) for rows in results for r in rows]


DECODERS = {
    "lm-lstm": ("lm", _spec(layers=2)),
    "lm-gru-zoneout": ("lm", _spec(**GRU_BEFORE, zoneout=0.3)),
    "seq2seq-lstm-additive": ("seq2seq", _spec(attention="additive", bidirectional=True)),
    "seq2seq-gru-dot-after": ("seq2seq", _spec(**GRU_BEFORE, attention="dot", layers=2,
                                               attention_wiring="after", context="input")),
    "seq2seq-gru-after-bilinear": ("seq2seq", _spec(**GRU_AFTER, attention="bilinear")),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(DECODERS))
def test_greedy_beam_and_sampling_decode_as_on_the_cpu(name, path):
    kind, spec = DECODERS[name]
    want = _decoded(kind, spec, None)
    got = _decoded(kind, spec, path)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, abs=1e-10)


# ------------------------------------------------------------- the command end to end


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from rnnkit.data.events import write_sessions
    from rnnkit.data.generated import previous_word_sentences, write_token_tags
    from rnnkit.data.generated_pairs import generate_pairs, write_pairs
    from rnnkit.data.generated_sessions import generate_sessions

    d = tmp_path_factory.mktemp("forced_paths")
    (d / "text.txt").write_text("abc abd\nbca cab\n" * 20, encoding="utf-8")
    write_token_tags(previous_word_sentences(30, seed=0, noise=0.1), d / "tags.tsv")
    pairs = generate_pairs("reverse", 24, seed=0, max_len=4)
    write_pairs(d / "pairs.tsv", pairs)
    (d / "sources.txt").write_text("".join(f"{source}\n" for source, _ in pairs), encoding="utf-8")
    write_sessions(d / "sessions.jsonl", generate_sessions(30, anomalies=0, seed=1))
    write_sessions(d / "valid.jsonl", generate_sessions(12, anomalies=2, seed=2))
    return d


TINY = ["--hidden", "6", "--embedding", "4", "--batch-size", "4", "--steps", "2", "--seed", "0"]
TINY += ["--quiet", "--no-report", "--json"]
COMMANDS = {  # train's options, then a command on the run: (command, its options)
    "lm": (["--task", "lm", "--train", "text.txt"],
           ("generate", ["--prompt", "ab", "--beam", "2"])),
    # the character encoder under mixed precision: the fused kernels' bfloat16 outputs
    # failed in the tagger's float32 buffer
    "tag-bf16": (["--task", "tag", "--train", "tags.tsv", "--precision", "bf16"],
                 ("evaluate", ["--data", "tags.tsv"])),
    "events": (["--task", "events", "--train", "sessions.jsonl", "--valid", "valid.jsonl"],
               ("score", ["--data", "valid.jsonl"])),
    "seq2seq-additive": (["--task", "seq2seq", "--train", "pairs.tsv", "--attention", "additive",
                          "--bidirectional"], ("generate", ["--input", "abc", "--beam", "3"])),
    "seq2seq-gru-dot-after": (["--task", "seq2seq", "--train", "pairs.tsv", "--cell", "gru",
                               "--attention", "dot", "--attention-wiring", "after"],
                              ("predict", ["--input", "sources.txt", "--max-len", "5"])),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_command_trains_and_reads_its_run_on_a_gpu_emulation(name, data, run_cli, tmp_path):
    import json

    train, (command, options) = COMMANDS[name]
    train = [str(data / a) if (data / a).is_file() else a for a in train]
    options = [str(data / a) if (data / a).is_file() else a for a in options]
    losses = []
    for path in (None, "gpu"):
        run = tmp_path / str(path)
        with contextlib.nullcontext() if path is None else _path(path):
            code, out, err = run_cli("train", *train, "--out", str(run), *TINY)
            assert code == 0, err[-2000:]
            losses.append(json.loads(out.strip().splitlines()[-1])["train_loss_nats"])
            code, out, err = run_cli(command, "--checkpoint", str(run), *options)
            assert code == 0 and out.strip(), err[-2000:]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
