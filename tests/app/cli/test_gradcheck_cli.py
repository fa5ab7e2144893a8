"""``rnnkit gradcheck`` end to end: exit 0 for every cell, exit 1 for a broken backward."""

from __future__ import annotations

import json

import pytest

from rnnkit.app.cli.gradcheck import build_parser
from rnnkit.app.cli.main import main
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.rnn import RNNKernel

VARIANTS = [
    ["--cell", "rnn"],
    ["--cell", "rnn", "--nonlinearity", "relu"],
    ["--cell", "rnn", "--nonlinearity", "sigmoid"],
    ["--cell", "lstm"],
    ["--cell", "gru"],
    ["--cell", "gru", "--update", "keep", "--reset", "after"],
    ["--cell", "gru", "--update", "keep", "--reset", "before"],
    ["--cell", "gru", "--update", "candidate", "--reset", "after"],
    ["--cell", "lstm", "--layer-norm"],
    ["--cell", "gru", "--reset", "after", "--layer-norm"],
    ["--cell", "lstm", "--layer-norm", "--layers", "2", "--window", "2"],
]


def run_gradcheck(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["gradcheck", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv", VARIANTS, ids=lambda a: "-".join(a[1::2]))
def test_every_cell_variant_passes(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    status, out, err = run_gradcheck(capsys, *argv, "--steps", "4")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"gradcheck: {argv[1]}")
    assert lines[1].split()[:2] == ["tensor", "size"]
    assert any(line.startswith("layers.0.cell.weight_hh ") for line in lines)
    assert any(line.startswith("input ") for line in lines)
    assert lines[-1].startswith("worst relative error ") and lines[-1].endswith(": ok")


def test_options_reach_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_gradcheck(
        capsys,
        *("--cell", "lstm", "--hidden", "3", "--input", "2", "--batch", "2", "--steps", "3"),
        *("--layers", "2", "--bidirectional", "--window", "2", "--seed", "7", "--json"),
    )
    assert status == 0
    data = json.loads(out)
    assert data["passed"] is True and data["max_rel_error"] < 1e-6
    assert data["config"] == {
        "cell": "lstm",
        "hidden_size": 3,
        "input_size": 2,
        "batch_size": 2,
        "steps": 3,
        "num_layers": 2,
        "bidirectional": True,
        "window": 2,
        "seed": 7,
        "eps": 1e-6,
    }
    names = {e["name"] for e in data["errors"]}
    assert "layers.1.directions.1.cell.weight_hh" in names and {"state.h", "state.c"} <= names


def test_the_regularizers_and_recompute_reach_the_check(capsys: pytest.CaptureFixture[str]):
    status, out, _ = run_gradcheck(
        capsys,
        *("--cell", "lstm", "--layers", "2", "--steps", "4", "--recompute", "2"),
        *("--recurrent-dropout", "0.3", "--zoneout", "0.2", "--weight-drop", "0.1", "--json"),
    )
    assert status == 0
    data = json.loads(out)
    assert data["passed"] is True
    config = data["config"]
    assert (config["recompute"], config["recurrent_dropout"]) == (2, 0.3)
    assert (config["zoneout"], config["weight_drop"]) == (0.2, 0.1)
    status, out, _ = run_gradcheck(capsys, "--cell", "gru", "--zoneout", "0.2", "--window", "2")
    assert status == 0
    assert out.splitlines()[0].endswith(
        "BPTT(2), zoneout 0.2; central differences, eps 1e-06, float64"
    )
    status, out, _ = run_gradcheck(capsys, "--cell", "rnn", "--resets", "--window", "2", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["passed"] is True and data["config"]["resets"] is True


def test_a_corrupted_backward_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = RNNKernel.step_backward

    def scaled(self, *args):
        return tuple(1.01 * d for d in original(self, *args))

    monkeypatch.setattr(RNNKernel, "step_backward", scaled)
    if hasattr(RNNKernel, "native_backward"):  # the compiled twin of the same backward
        native = RNNKernel.native_backward

        def native_scaled(self, *args):
            d_xp, d_hp, d0, d_x, d_b = native(self, *args)
            d_x = None if d_x is None else 1.01 * d_x
            d_b = None if d_b is None else 1.01 * d_b
            return 1.01 * d_xp, 1.01 * d_hp, tuple(1.01 * d for d in d0), d_x, d_b

        monkeypatch.setattr(RNNKernel, "native_backward", native_scaled)
    status, out, err = run_gradcheck(capsys, "--cell", "rnn")
    assert (status, err) == (1, "")
    assert out.splitlines()[-1].endswith("> tol 1e-06: FAILED")
    status, out, _ = run_gradcheck(capsys, "--cell", "rnn", "--json")
    assert status == 1 and json.loads(out)["passed"] is False
    status, _, _ = run_gradcheck(capsys, "--cell", "rnn", "--tol", "0.5")  # a loose enough tol
    assert status == 0


def test_a_corrupted_gru_backward_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = GRUKernel.recurrent_grads

    def scaled(self, *args):
        d_w, d_b = original(self, *args)
        return 1.01 * d_w, d_b

    monkeypatch.setattr(GRUKernel, "recurrent_grads", scaled)
    status, out, _ = run_gradcheck(capsys, "--cell", "gru", "--steps", "3")
    assert status == 1 and "(layers.0.cell.weight_hh)" in out.splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cell", "lstm", "--update", "keep"], "--update applies to --cell gru only"),
        (["--cell", "gru", "--nonlinearity", "relu"], "--nonlinearity applies to --cell rnn"),
        (["--cell", "rnn", "--hidden", "0"], "--hidden must be a positive integer, got 0"),
        (["--cell", "rnn", "--window", "0"], "--window must be a positive integer, got 0"),
        (["--cell", "rnn", "--layer-norm"], "--layer-norm applies to --cell lstm or gru"),
        (["--cell", "gru", "--layer-norm"], "--layer-norm with --cell gru needs --reset after"),
        (["--cell", "rnn", "--tol", "-1"], "--tol must be a positive finite number, got -1.0"),
        # Found by tests/fuzz: each was a traceback (RuntimeError, ValueError) or a hang.
        (["--cell", "lstm", "--hidden", "100000"], "over the limit of 1,000,000 (minutes"),
        (["--cell", "lstm", "--eps", "inf"], "--eps must be a positive finite number, got inf"),
        (["--cell", "lstm", "--tol", "inf"], "--tol must be a positive finite number, got inf"),
        (["--cell", "lstm", "--seed", str(10**20)], "--seed must be below 2^63 in size"),
        (["--cell", "lstm", "--zoneout", "1"], "--zoneout must be in [0, 1), got 1.0"),
        (["--cell", "lstm", "--weight-drop", "nan"], "--weight-drop must be in [0, 1), got nan"),
        (["--cell", "rnn", "--recompute", "0"], "--recompute must be a positive integer, got 0"),
        (["--cell", "rnn", "--window", "2", "--recompute", "2"], "--window cannot be combined"),
        (["--cell", "rnn", "--resets", "--bidirectional"], "--resets needs a unidirectional"),
        (
            ["--cell", "gru", "--reset", "after", "--layer-norm", "--recurrent-dropout", "0.1"],
            "--recurrent-dropout has no layer-normalised GRU form",
        ),
    ],
)
def test_bad_options_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run_gradcheck(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("rnnkit gradcheck: error:")


def test_unknown_cell_and_missing_cell_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["gradcheck", "--cell", "transformer"], ["gradcheck"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "--cell" in capsys.readouterr().err


def test_every_option_has_help() -> None:
    for action in build_parser()._actions:
        assert action.help, action.dest


def test_a_window_longer_than_the_batch_is_full_bptt(capsys: pytest.CaptureFixture[str]) -> None:
    # --window 10**22 overflowed torch's index (a traceback, found by tests/fuzz).
    status, out, _ = run_gradcheck(capsys, "--cell", "rnn", "--window", str(10**22), "--json")
    assert status == 0 and json.loads(out)["config"]["window"] == 5
