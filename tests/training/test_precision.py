"""Mixed precision (``--precision bf16|fp16``): autocast in training, the recurrence in its
weights' dtype under autocast, the GradScaler path (CPU here; CUDA where there is one),
exact resume, and clear errors."""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from rnnkit import GRU, LSTM, RNN
from rnnkit.app.cli.main import main
from rnnkit.app.config import TrainConfig
from rnnkit.cells.amp import autocast_devices_on
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.lstm import LSTMCell, LSTMKernel
from rnnkit.data.batching import StreamBatcher
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.models.language_model import LanguageModel
from rnnkit.training import precision as precision_module
from rnnkit.training.checkpoint import load_snapshot
from rnnkit.training.loop import Trainer, TrainOptions
from rnnkit.training.nonfinite import MAX_SCALER_SKIPS, TrainingDiverged
from rnnkit.training.precision import autocast_setup
from rnnkit.types import LSTMState

V, E, H = 40, 16, 32
# bfloat16 keeps 8 significant bits: one rounding is ≤ 2^-9 ≈ 0.2 % relative. Outputs of
# a layer fed a bfloat16-rounded input are off by a few such roundings.
BF16_REL = 2.0**-8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def stream_ids(n: int = 3000, seed: int = 0) -> np.ndarray:
    """A learnable stream: runs of a cyclic sequence starting at random places."""
    rng = np.random.default_rng(seed)
    base = np.arange(4, V)
    runs, total = [], 0
    while total < n:
        run = np.roll(base, int(rng.integers(0, V - 4)))[: int(rng.integers(5, 30))]
        runs.append(run)
        total += len(run)
    return np.concatenate(runs)[:n]


def stream_step(model, batch, carry):
    return model.loss(batch.inputs, batch.targets, state=carry, starts=batch.starts)


def make_trainer(
    out=None, precision="fp32", seed=0, step_fn=None, grad_hook=None, device="cpu", **options
):
    """A tiny 2-layer LSTM LM with dropout, Adam and stream batches (carried state)."""
    torch.manual_seed(seed)
    model = LanguageModel(
        nn.Embedding(V, E), LSTM(E, H, num_layers=2, dropout=0.2), nn.Linear(H, V)
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opts = TrainOptions(
        **{"quiet": True, "clip_norm": 1.0, "log_every": 10, "precision": precision, **options}
    )
    batches = StreamBatcher(stream_ids(), 8, 16)  # 23 batches per epoch
    return Trainer(
        model, opt, batches, step_fn or stream_step, opts, out_dir=out, grad_hook=grad_hook
    )


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {float((a[k] - b[k]).abs().max())}"


def train_losses(trainer):
    return [e["loss_nats"] for e in trainer.history if e["event"] == "train"]


# -- training under autocast ------------------------------------------------------------------
def test_bf16_training_runs_under_autocast_reduces_the_loss_and_ends_close_to_fp32():
    seen = []

    def step(model, batch, carry):
        seen.append((autocast_devices_on(), torch.get_autocast_dtype("cpu")))
        return stream_step(model, batch, carry)

    head_dtypes = []
    fp32, bf16 = make_trainer(steps=60), make_trainer(precision="bf16", steps=60, step_fn=step)
    bf16.model.head.register_forward_hook(lambda m, i, o: head_dtypes.append(o.dtype))
    fp32.fit()
    bf16.fit()
    assert seen and all(s == (["cpu"], torch.bfloat16) for s in seen)
    assert set(head_dtypes) == {torch.bfloat16}  # the output layer's product in bf16 ...
    assert autocast_devices_on() == []  # ... and autocast ends with the step
    a, b = train_losses(fp32), train_losses(bf16)
    assert b[-1] < 0.5 * b[0]  # it learns (3.4 → 0.5 nats here)
    # Only the products around the recurrence run in bf16, each rounded to ≤ 2^-9; over 60
    # Adam steps the two runs drift apart a little (4e-4 relative measured). 2 % is a
    # fiftyfold margin on that, and far below what a broken path costs (the loss of
    # bf16 recurrences and gradients: several percent; of no autocast: 0 — see below).
    assert b[-1] == pytest.approx(a[-1], rel=0.02)
    assert a != b  # bf16 really changed the arithmetic


@pytest.mark.parametrize("layer_cls", [LSTM, GRU, RNN])
def test_recurrence_under_autocast_runs_in_float32_and_grads_reach_every_parameter(layer_cls):
    torch.manual_seed(0)
    layer = layer_cls(8, 16, num_layers=2, bidirectional=True)
    x = torch.randn(4, 12, 8)  # batch-first (B, T, I)
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[1, 9:] = False
    mask[3, 5:] = False
    reference = layer(x, mask=mask)[0].detach()
    x_low = x.to(torch.bfloat16)  # as an autocast product upstream would hand it over
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, final = layer(x_low, mask=mask)
    assert out.dtype == torch.float32
    states = final if isinstance(final, LSTMState) else (final,)
    assert all(s.dtype == torch.float32 for s in states)
    # The recurrence computed in float32: exactly the float32 run on the rounded input ...
    exact, _ = layer(x_low.float(), mask=mask)
    assert torch.equal(out, exact)
    # ... so within bf16 tolerance of the float32 run on the original input.
    err = float((out.detach() - reference).abs().max())
    assert err < 4 * BF16_REL * float(reference.abs().max())
    out.float().pow(2).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().sum()) > 0, name


@pytest.mark.parametrize("how", ["full", "window", "recompute"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_layer_normalised_stack_under_autocast_is_its_float32_run(kind, how):
    """The input part ν(x W_xᵀ) ⊙ γ_x is part of the recurrence: under autocast it is
    computed in float32 too (a bfloat16 product, amplified by ν, left a 2-layer LSTM's
    gradients up to 87 % off), on the one layer's path, the windowed stack's and
    recompute's: outputs and every gradient exactly those of the float32 call."""
    torch.manual_seed(0)
    extra = {"reset": "after"} if kind == "gru" else {}
    layer = (LSTM if kind == "lstm" else GRU)(8, 16, 2, True, layer_norm=True, **extra)
    layer.recompute = 3 if how == "recompute" else None
    window = 30 if how == "window" else None
    x = torch.randn(4, 10, 8).to(torch.bfloat16)  # as an autocast product hands it over

    def run(amp: bool) -> list[torch.Tensor]:
        given = x.clone().requires_grad_() if amp else x.float().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = layer(given, window=window).outputs
        d_x, *grads = torch.autograd.grad(out.pow(2).sum(), [given, *layer.parameters()])
        return [out, d_x.to(torch.bfloat16), *grads]  # a bfloat16 input's gradient: rounded

    for got, want in zip(run(True), run(False), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_compiled_loop_is_used_under_autocast(monkeypatch):
    from rnnkit.bptt import native

    if not native.available():
        pytest.skip("no compiled loop on this machine (no C++ compiler)")
    calls = []
    original = LSTMKernel.native_forward

    def spy(self, *args, **kwargs):
        calls.append(args[1].dtype)  # x
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LSTMKernel, "native_forward", spy)
    layer = LSTM(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(2, 5, 8, dtype=torch.bfloat16))
    assert calls == [torch.float32]


def test_backward_inside_an_autocast_region_still_matches():
    torch.manual_seed(1)
    layer = LSTM(6, 10)
    x = torch.randn(3, 7, 6, requires_grad=True)
    out, _ = layer(x)
    out.sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the explicit BPTT stays float32
        out, _ = layer(x)
        out.sum().backward()
    for got, want in zip((p.grad for p in layer.parameters()), expected, strict=True):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell_cls", [LSTMCell, GRUCell])
def test_cell_step_under_autocast_is_the_float32_step_and_a_mismatch_outside_still_fails(
    cell_cls,
):
    torch.manual_seed(2)
    cell = cell_cls(5, 7)
    x = torch.randn(3, 5).to(torch.bfloat16)
    h = torch.randn(3, 7).to(torch.bfloat16)
    state = LSTMState(h, h * 0.5) if cell_cls is LSTMCell else h
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cell(x, state)
    f32 = LSTMState(h.float(), (h * 0.5).float()) if cell_cls is LSTMCell else h.float()
    want = cell(x.float(), f32)
    got_t = tuple(got) if cell_cls is LSTMCell else (got,)
    want_t = tuple(want) if cell_cls is LSTMCell else (want,)
    for g, w in zip(got_t, want_t, strict=True):
        assert g.dtype == torch.float32 and torch.equal(g, w)
    with pytest.raises(TypeError, match="bfloat16"):
        cell(x, None)  # outside autocast a dtype mismatch is the caller's to fix


# -- float16 and the GradScaler (CPU) ----------------------------------------------------------
def test_fp16_uses_a_grad_scaler_and_clips_the_unscaled_gradients():
    norms = {}

    def hook(name):
        return lambda model, norm, clipped: norms.setdefault(name, []).append(norm)

    fp32 = make_trainer(steps=5, grad_hook=hook("fp32"))
    fp16 = make_trainer(precision="fp16", steps=5, grad_hook=hook("fp16"))
    assert fp32.scaler is None and make_trainer(precision="bf16").scaler is None
    assert isinstance(fp16.scaler, torch.amp.GradScaler) and fp16.scaler.is_enabled()
    fp32.fit()
    fp16.fit()
    # The loss was scaled by 2^16 for the backward; clipping and the hook see the true
    # gradient norms (a scaled one would be 65536 times larger).
    assert fp16.scaler.get_scale() == 2.0**16
    for a, b in zip(norms["fp32"], norms["fp16"], strict=True):
        assert b == pytest.approx(a, rel=0.05)


def inf_grad_at(steps: set[int] | None):
    """A step function whose calls in ``steps`` (1-based; None: all) give an infinite
    gradient of the head (a float16 overflow, as far as the scaler can tell) and a finite
    loss."""
    calls = []

    def step(model, batch, carry):
        calls.append(1)
        out = stream_step(model, batch, carry)
        if steps is None or len(calls) in steps:
            handle = None

            def overflow(grad):
                handle.remove()  # this backward only
                return torch.full_like(grad, math.inf)

            handle = model.head.weight.register_hook(overflow)
        return out

    return step, calls


def test_a_scaler_skipped_step_is_not_a_divergence(tmp_path):
    step, calls = inf_grad_at({3})
    trainer = make_trainer(tmp_path, precision="fp16", steps=8, step_fn=step, log_every=1)
    before = weights(trainer.model)
    result = trainer.fit()
    assert result.steps == 8 and len(calls) == 9  # the overflowing batch made no step
    events = [e for e in result.history if e["event"] == "scaler_skip"]
    assert [e["step"] for e in events] == [3] and events[0]["scale"] == 2.0**15
    assert not [e for e in result.history if e["event"] == "skipped"]
    assert trainer.scaler_skips == 1 and trainer.scaler.get_scale() == 2.0**15
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert not torch.equal(before["head.weight"], trainer.model.head.weight)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(e["event"] == "scaler_skip" for e in logged)
    assert [e["loss_scale"] for e in logged if e["event"] == "train"][-1] == 2.0**15
    # The same gradient without a scaler IS a divergence, with the step named.
    step, _ = inf_grad_at({3})
    with pytest.raises(TrainingDiverged, match=r"gradient norm is (inf|nan) at step 3\b"):
        make_trainer(precision="bf16", steps=8, step_fn=step).fit()


@pytest.mark.parametrize(
    ("command_line", "advice"),
    [
        (False, "lower the optimizer's lr, lower clip_norm (now 1) or use precision='bf16'"),
        (True, "lower --lr, lower --clip-norm (now 1) or use --precision bf16"),  # as train's
    ],
)
def test_overflow_every_step_is_a_divergence_naming_the_step(tmp_path, command_line, advice):
    """The advice names the options as the user gave them (it said ``--lr`` to Python)."""
    step, calls = inf_grad_at(None)
    trainer = make_trainer(
        tmp_path, precision="fp16", steps=50, step_fn=step, eval_every=1, command_line=command_line
    )
    with pytest.raises(
        TrainingDiverged,
        match=rf"{MAX_SCALER_SKIPS} steps in a row, up to step 1\b.*\({re.escape(advice)}\)$",
    ):
        trainer.fit()
    assert len(calls) == MAX_SCALER_SKIPS and trainer.step == 0
    assert not (tmp_path / "latest.json").exists()  # nothing was ever saved


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_nan_loss_is_still_named_under_autocast(precision):
    def step(model, batch, carry):
        out = stream_step(model, batch, carry)
        if step.calls == 4:
            out = out._replace(loss=out.loss * float("nan"))
        step.calls += 1
        return out

    step.calls = 0
    with pytest.raises(TrainingDiverged, match=r"training loss is nan at step 5\b"):
        make_trainer(precision=precision, steps=10, step_fn=step).fit()


# -- exact resume -------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_resume_after_a_mixed_precision_run_is_exact(tmp_path, precision):
    n, total = 6, 30  # crosses an epoch boundary (23 batches) after the resume
    # fp16: an overflow at step 3 moves the scaler off its initial state before the snapshot.
    overflow = {3} if precision == "fp16" else set()
    straight = make_trainer(
        tmp_path / "a", precision, steps=total, step_fn=inf_grad_at(overflow)[0]
    )
    straight.fit()
    first = make_trainer(tmp_path / "b", precision, steps=n, step_fn=inf_grad_at(overflow)[0])
    first.fit()
    state, _ = load_snapshot(tmp_path / "b", make_trainer().model, None)
    assert state["precision"] == precision
    if precision == "fp16":
        assert state["scaler"]["scale"] == 2.0**15 and state["scaler_skips"] == 1
    else:
        assert state["scaler"] is None
    torch.manual_seed(12345)
    resumed = make_trainer(tmp_path / "b", precision, seed=99, steps=total)
    resumed.resume()
    assert resumed.step == n
    if precision == "fp16":
        assert resumed.scaler.get_scale() == 2.0**15 and resumed.scaler_skips == 1
    resumed.fit()
    assert_same(weights(resumed.model), weights(straight.model))
    if precision == "fp16":
        assert resumed.scaler.state_dict() == straight.scaler.state_dict()


def test_resume_with_another_precision_is_refused(tmp_path):
    make_trainer(tmp_path, "bf16", steps=2).fit()
    other = make_trainer(tmp_path, "fp32", steps=4)
    with pytest.raises(CheckpointError, match="precision='bf16', not 'fp32'"):
        other.resume()


# -- configuration errors -----------------------------------------------------------------------
def test_precision_config_is_validated():
    assert TrainConfig(train="x").precision == "fp32"
    TrainConfig(train="x", precision="bf16").validate()
    with pytest.raises(ConfigError, match=r"--precision must be one of fp32, bf16, fp16"):
        TrainConfig(train="x", precision="fp8").validate()
    with pytest.raises(ConfigError, match=r"^precision must be one of"):
        autocast_setup("half", torch.device("cpu"))
    with pytest.raises(ValueError):  # a TrainOptions typo fails when the Trainer is built
        make_trainer(precision="float16")


def test_a_precision_the_device_cannot_autocast_is_a_config_error(monkeypatch):
    # torch announces an unsupported autocast dtype with a warning and runs without it:
    # rnnkit turns that into an error instead of training silently in float32.
    real = torch.autocast

    def unsupported(*args, **kwargs):
        warnings.warn("In CPU autocast, but the target dtype is not supported.", stacklevel=2)
        return real("cpu", enabled=False)

    monkeypatch.setattr(precision_module.torch, "autocast", unsupported)
    with pytest.raises(
        ConfigError, match=r"^precision='fp16': torch .* has no fp16 autocast on cpu"
    ):
        autocast_setup("fp16", torch.device("cpu"))


def test_cli_precision_option_and_refused_change_on_resume(tmp_path, capsys):
    rng = np.random.default_rng(0)
    words = ["ab", "cd", "ef", "gh", "ij"]
    text = "".join(" ".join(rng.choice(words, 5)) + "\n" for _ in range(60))
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    common = ["train", "--train", str(tmp_path / "train.txt"), "--out", str(tmp_path / "r")]
    tiny = ["--hidden", "8", "--embedding", "8", "--batch-size", "4", "--ngram-order", "2"]
    assert main([*common, *tiny, "--steps", "3", "--quiet", "--precision", "bf16"]) == 0
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert config["precision"] == "bf16"
    # --resume continues in the run's own precision ...
    assert main([*common, "--resume", "--steps", "4", "--quiet"]) == 0
    assert json.loads((tmp_path / "r" / "latest.json").read_text())["step"] == 4
    # ... and another one is refused in one line (the default fp32 cannot be told from
    # "not given", so the fp32 run is the one asked to change).
    other = [*common[:-1], str(tmp_path / "f")]
    assert main([*other, *tiny, "--steps", "3", "--quiet"]) == 0
    capsys.readouterr()
    code = main([*other, "--resume", "--steps", "5", "--quiet", "--precision", "fp16"])
    err = capsys.readouterr().err
    assert code not in (0, None) and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--precision" in err, err
    with pytest.raises(SystemExit):
        main([*common, "--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


# -- CUDA (skipped where there is none) ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_on_cuda_trains_with_the_cuda_grad_scaler_and_resumes_exactly(tmp_path):
    def on_cuda(model, batch, carry):
        batch = batch._replace(
            inputs=batch.inputs.cuda(), targets=batch.targets.cuda(), starts=batch.starts.cuda()
        )
        return stream_step(model, batch, carry)

    def cuda_trainer(out, steps, seed=0):
        return make_trainer(out, "fp16", seed=seed, steps=steps, step_fn=on_cuda, device="cuda")

    straight = cuda_trainer(tmp_path / "a", 40)
    assert straight.scaler is not None and straight.scaler._device == "cuda"
    straight.fit()
    losses = train_losses(straight)
    assert losses[-1] < 0.8 * losses[0]
    # First, that this GPU's kernels repeat themselves: two identical runs from the same
    # seed. Where they do not (a kernel with atomics or a race, say torch's embedding
    # backward), no resume can be exact, and the failure says so rather than blaming it.
    again = cuda_trainer(tmp_path / "a2", 40)
    again.fit()
    for k, v in weights(straight.model).items():
        w = weights(again.model)[k]
        assert torch.equal(v, w), (
            f"two identical CUDA runs differ in {k} by {float((v - w).abs().max())}: "
            "the device's kernels are not deterministic here, so resuming cannot be exact"
        )
    cuda_trainer(tmp_path / "b", 15).fit()
    resumed = cuda_trainer(tmp_path / "b", 40, seed=9)
    resumed.resume()
    assert (
        resumed.scaler.get_scale()
        == load_snapshot(tmp_path / "b", make_trainer().model, None)[0]["scaler"]["scale"]
    )
    resumed.fit()
    assert resumed.scaler.state_dict() == straight.scaler.state_dict()
    # The same kernels in the same order on the same GPU: bitwise, as on CPU (cuBLAS is
    # deterministic for a fixed configuration without atomics in these products).
    assert_same(weights(resumed.model), weights(straight.model))


def test_fp16_skip_of_an_overflowing_gradient_norm_leaves_the_scaler_ready():
    """``on_nonfinite="skip"``: finite gradients whose norm overflows float32 (each 1e30:
    the sum of squares is inf) are a skipped step. The scaler had unscaled them already,
    so it must be ready for the next step's ``unscale_`` (it raised "unscale_() has
    already been called on this optimizer since the last update()"), its scale kept."""
    calls = []

    def step(model, batch, carry):
        calls.append(1)
        out = stream_step(model, batch, carry)
        if len(calls) == 3:
            handle = None

            def huge(grad):
                handle.remove()
                return torch.full_like(grad, 1e30)  # finite: no scaler overflow

            handle = model.head.weight.register_hook(huge)
        return out

    trainer = make_trainer(precision="fp16", steps=6, step_fn=step, on_nonfinite="skip")
    result = trainer.fit()
    assert result.steps == 6 and len(calls) == 7
    skipped = [e for e in result.history if e["event"] == "skipped"]
    assert len(skipped) == 1 and "gradient norm is inf" in skipped[0]["reason"]
    assert trainer.scaler_skips == 0 and trainer.scaler.get_scale() == 2.0**16


def test_bf16_on_a_gpu_that_only_emulates_it_is_a_config_error(monkeypatch):
    """A GPU below compute capability 8.0 (T4, V100) has no bfloat16 arithmetic, yet
    ``torch.cuda.is_bf16_supported()`` says True there (``including_emulation=True``, its
    default: a bfloat16 tensor can be made) — and asks the current device, not the one
    trained on. ``--precision bf16`` there is the documented ConfigError, asked of the
    training device (emulated here: a CPU build, a sm_75 card as cuda:1)."""
    asked = []

    def properties(device=None):
        asked.append(device)
        return type("Props", (), {"major": 7, "minor": 5, "name": "Tesla T4"})()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ConfigError, match=r"this GPU has no bfloat16 \(use .*fp16"):
        autocast_setup("bf16", torch.device("cuda", 1))
    assert asked and all(torch.device("cuda", 1) == torch.device(d) for d in asked)


@pytest.mark.parametrize("clip_value", [None, 0.5], ids=["norm-only", "clip-value"])
def test_an_fp16_step_asks_the_gradients_peak_only_where_the_norm_cannot_say(clip_value):
    """On a GPU every read of the device waits for it. An inf gradient makes the norm
    inf, so a finite norm (the common step) also says the scaler saw no overflow: the
    gradients' peak is read only where clipping by value could turn an inf finite."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_reads import HostReads

    trainer = make_trainer(precision="fp16", steps=3, clip_value=clip_value)
    with HostReads(trainer.model) as reads:
        result = trainer.fit()
    assert result.steps == 3
    peak_reads = sum(
        n for site, n in reads.sites.items() if site.startswith("training/nonfinite.py")
    )
    assert peak_reads == (0 if clip_value is None else 3), dict(reads.sites)
