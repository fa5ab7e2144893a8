"""The glue every task shares (``rnnkit.app.tasks.settings``, ``run_dir``): the loop's options
from the config, the run directory refused and locked."""

from __future__ import annotations

import dataclasses

import pytest

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.settings import model_spec, run_settings, train_options
from rnnkit.errors import ConfigError
from rnnkit.models.spec import ModelSpec
from rnnkit.training.baseline_check import RunSettings
from rnnkit.training.options import TrainOptions


def test_every_loop_option_comes_from_the_config() -> None:
    cfg = TrainConfig(
        train="corpus.txt",
        epochs=3,
        steps=17,
        max_time=12.5,
        clip_norm=0.5,
        clip_value=2.0,
        eval_every=4,
        patience=2,
        min_gain=0.01,
        on_nonfinite="skip",
        precision="bf16",
    ).validate()
    opts = train_options(cfg, quiet=True, units="bits")
    got = dataclasses.asdict(opts)
    for name in (
        "epochs",
        "steps",
        "max_time",
        "clip_norm",
        "clip_value",
        "eval_every",
        "patience",
        "min_gain",
        "on_nonfinite",
        "precision",
    ):
        assert got[name] == getattr(cfg, name), name
    assert opts.quiet is True and opts.units == "bits"
    # the command line's default is the loop's (torch's ReduceLROnPlateau threshold)
    assert TrainConfig().min_gain == TrainOptions().min_gain == 1e-4


def test_on_nonfinite_is_validated_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="--on-nonfinite must be one of stop, skip"):
        TrainConfig(train="corpus.txt", on_nonfinite="ignore").validate()


def test_prepare_run_dir_refuses_an_existing_run_and_overwrite_removes_only_run_files(tmp_path):
    from rnnkit.app.tasks.run_dir import prepare_run_dir
    from rnnkit.errors import CheckpointError

    prepare_run_dir(tmp_path / "new")  # a new path: fine, nothing created
    assert not (tmp_path / "new").exists()
    out = tmp_path / "run"
    (out / "snapshots" / "step-1").mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl", "report.html", "mine.txt"):
        (out / name).write_text(_WRITTEN.get(name, "x"))
    with pytest.raises(ConfigError, match=r"already holds a run \(snapshots, report\.html\)"):
        prepare_run_dir(out)
    with pytest.raises(ConfigError, match="--resume and --overwrite exclude each other"):
        prepare_run_dir(out, resume=True, overwrite=True)
    prepare_run_dir(out, resume=True)  # continuing it is fine
    prepare_run_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    with pytest.raises(CheckpointError, match="holds no run to continue"):
        prepare_run_dir(out, resume=True)
    # A run that failed before it saved anything (config and log only) is no run to
    # protect: a new run replaces what it left.
    for name in ("config.json", "vocab.json", "metrics.jsonl"):
        (out / name).write_text(_WRITTEN.get(name, "x"))
    prepare_run_dir(out)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


#: What rnnkit writes at the head of a run's config.json and of a report page
_WRITTEN = {
    "config.json": '{"format_version": 1, "config": {"task": "lm"}}',
    "report.html": "<!DOCTYPE html>\n<html><head><title>rnnkit report: run</title>",
}


@pytest.mark.parametrize("overwrite", [False, True])
def test_files_of_a_runs_names_that_rnnkit_did_not_write_are_never_replaced(tmp_path, overwrite):
    """Before: a directory holding a user's report.html and snapshots/notes.txt was said
    to hold a run, and --overwrite then removed both (as it removed a user's
    summary.json or metrics.csv where no run had been)."""
    from rnnkit.app.tasks.run_dir import prepare_run_dir, replacing_run

    out = tmp_path / "mine"
    (out / "snapshots").mkdir(parents=True)
    for name in ("snapshots/notes.txt", "report.html", "metrics.csv", "notes.md"):
        (out / name).write_text(f"my {name}")
    mine = _files(out)
    words = r"--out .*mine: snapshots, metrics\.csv, report\.html were not written by rnnkit"
    with pytest.raises(ConfigError, match=words):
        prepare_run_dir(out, overwrite=overwrite)
    with pytest.raises(ConfigError, match=words), replacing_run(out, overwrite=overwrite):
        pass
    assert _files(out) == mine
    # beside a run of rnnkit's: its snapshots' neighbours and a page of the user's
    run = tmp_path / "run"
    _old_run(run)
    (run / "snapshots" / "notes.txt").write_text("my notes")
    (run / "report.html").write_text("<p>my page</p>")
    before = _files(run)
    words = r"report\.html, snapshots/notes\.txt were not written by rnnkit train"
    with pytest.raises(ConfigError, match=words):
        prepare_run_dir(run, overwrite=overwrite)
    assert _files(run) == before
    (run / "report.html").write_text(_WRITTEN["report.html"])
    with pytest.raises(ConfigError, match=r": snapshots/notes\.txt was not written by rnnkit"):
        prepare_run_dir(run, overwrite=overwrite)
    (run / "snapshots" / "notes.txt").unlink()
    (run / "snapshots" / ".DS_Store").write_text("the system's")  # hidden: not refused
    if overwrite:  # a run of rnnkit's alone: replaced
        prepare_run_dir(run, overwrite=True)
        assert _files(run) == {"mine.txt": "old mine.txt"}
    else:
        with pytest.raises(ConfigError, match="already holds a run"):
            prepare_run_dir(run)


def test_what_marks_a_directory_as_rnnkits(tmp_path):
    """A report page of rnnkit's where no run is (``rnnkit report --out``), and a run
    whose config.json is gone (moved aside by a replacement killed meanwhile) but whose
    snapshot pointer or manifest is rnnkit's: replaced by --overwrite, not refused."""
    from rnnkit.app.tasks.run_dir import prepare_run_dir

    page = tmp_path / "page"
    page.mkdir()
    (page / "report.html").write_text(_WRITTEN["report.html"])
    with pytest.raises(ConfigError, match="already holds a run"):
        prepare_run_dir(page)
    prepare_run_dir(page, overwrite=True)
    for name, mark in [
        ("latest.json", '{"format_version": 1, "snapshot": "snapshots/step-1"}'),
        ("manifest.json", '{"format": "rnnkit.manifest", "version": 1, "files": {}}'),
    ]:
        run = tmp_path / name
        (run / "snapshots" / "step-1").mkdir(parents=True)
        (run / "model.safetensors").write_text("weights")
        (run / name).write_text(mark)
        prepare_run_dir(run, overwrite=True)
        assert list(run.iterdir()) == []


def _old_run(out):
    (out / "snapshots" / "step-1").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "snapshots/step-1/state.json", "mine.txt"):
        (out / name).write_text(_WRITTEN.get(name, f"old {name}"))
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}


def _files(out):
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}


def test_replacing_run_keeps_the_old_run_until_the_new_one_saved(tmp_path):
    from rnnkit.app.tasks.run_dir import replacing_run

    out = tmp_path / "run"
    old = _old_run(out)
    # The new run fails before it saved anything: what it wrote goes, the old run is back.
    with pytest.raises(KeyError), replacing_run(out, overwrite=True):
        # the old run is aside, in a folder the manifest and a new run leave alone
        (aside,) = [p for p in out.iterdir() if p.name.startswith(".replaced-")]
        assert _files(aside) == {k: v for k, v in old.items() if k != "mine.txt"}
        assert sorted(p.name for p in out.iterdir() if p != aside) == ["mine.txt"]
        (out / "config.json").write_text("new")
        (out / "metrics.jsonl").write_text("new")
        raise KeyError("bad data")
    assert _files(out) == old
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "mine.txt",
        "model.safetensors",
        "snapshots",
    ]
    # It fails writing its first snapshot (a full disk): snapshots/ holds only the one
    # being written, which is not a save. The old run was removed; it is back.
    with pytest.raises(OSError), replacing_run(out, overwrite=True):
        (out / "config.json").write_text("new")
        (out / "snapshots" / ".step-000000002-ab12.tmp").mkdir(parents=True)
        raise OSError(28, "No space left on device")
    assert _files(out) == old
    # It fails after it saved: the new run stays, the old one is gone.
    with pytest.raises(KeyboardInterrupt), replacing_run(out, overwrite=True):
        (out / "model.safetensors").write_text("new")
        raise KeyboardInterrupt
    assert _files(out) == {"model.safetensors": "new", "mine.txt": "old mine.txt"}
    _old_run(out)
    with replacing_run(out, overwrite=True):
        (out / "model.safetensors").write_text("new")
    assert _files(out) == {"model.safetensors": "new", "mine.txt": "old mine.txt"}


def test_an_old_run_left_aside_by_a_killed_run_is_settled_by_the_next(tmp_path):
    """A process killed while its old run waited aside (SIGKILL: no cleanup ran): the
    next run in the directory puts the old run back where the killed one saved nothing,
    and removes it where the killed one had saved."""
    from rnnkit.app.tasks.run_dir import replacing_run

    out = tmp_path / "run"
    old = _old_run(out)
    aside = out / ".replaced-k1"
    aside.mkdir()
    for name in ("config.json", "model.safetensors", "snapshots"):
        (out / name).rename(aside / name)
    (out / "config.json").write_text(_WRITTEN["config.json"])  # the killed run's start
    with pytest.raises(ConfigError, match="already holds a run"), replacing_run(out):
        pass  # the old run is back: a new run without --overwrite is refused
    assert _files(out) == old
    assert not aside.exists()
    # killed after it saved: the new run stays, the old one is gone
    aside.mkdir()
    (out / "model.safetensors").rename(aside / "model.safetensors")
    (out / "model.safetensors").write_text("new")
    with replacing_run(out, resume=True):
        pass
    assert not aside.exists()
    assert _files(out)["model.safetensors"] == "new"


def test_an_input_that_is_a_file_of_the_run_replaced_is_refused(tmp_path):
    from rnnkit.app.tasks.run_dir import prepare_run_dir, replacing_run

    out = tmp_path / "run"
    old = _old_run(out)
    state = out / "snapshots" / "step-1" / "state.json"
    for inputs, words in [
        ({"--train": str(out / "config.json")}, "--train .*config.json: is the run's config.json"),
        ({"--valid": str(state)}, "--valid .*state.json: is the run's snapshots in --out"),
    ]:
        with pytest.raises(ConfigError, match=words):
            prepare_run_dir(out, overwrite=True, inputs=inputs)
        with (
            pytest.raises(ConfigError, match=words),
            replacing_run(out, overwrite=True, inputs=inputs),
        ):
            pass
        assert _files(out) == old
    # a file of the user's in the directory is no run file: read, and kept
    prepare_run_dir(out, overwrite=True, inputs={"--train": str(out / "mine.txt"), "--valid": None})
    assert _files(out) == {"mine.txt": "old mine.txt"}


def test_the_python_api_refuses_to_train_over_a_run_too(tmp_path):
    from rnnkit.app.tasks.lm import train_lm

    (tmp_path / "c.txt").write_text("ab ba abba\n" * 40)
    cfg = TrainConfig(
        train=str(tmp_path / "c.txt"), out=str(tmp_path / "r"), hidden=4, embedding=4, steps=1
    ).validate()
    train_lm(cfg, quiet=True)
    with pytest.raises(ConfigError, match="already holds a run"):
        train_lm(cfg, quiet=True)
    assert train_lm(cfg, quiet=True, overwrite=True)["steps"] == 1


def test_a_held_lock_refuses_a_second_holder_with_the_pid(tmp_path):
    import os

    from rnnkit.app.tasks.run_dir import lock_run_dir

    with (
        lock_run_dir(tmp_path / "r"),
        pytest.raises(
            ConfigError, match=rf"in use by another rnnkit process \(pid {os.getpid()}\)"
        ),
        lock_run_dir(tmp_path / "r"),
    ):
        pass
    with lock_run_dir(tmp_path / "r"):  # released at the end of the first
        pass
    assert not (tmp_path / "r").exists()  # created for nothing: removed again


def test_a_run_directory_removed_while_the_run_trained_is_an_error_not_a_success(tmp_path):
    """Before: ``rm -rf`` of --out mid-run, and the run's later writes made the directory
    again without its config.json and vocabulary: exit 0, then "not a run directory"
    from every reader, and nothing to resume."""
    import shutil

    from rnnkit.app.tasks.run_dir import lock_run_dir, prepare_run_dir
    from rnnkit.errors import WriteError

    out = tmp_path / "r"
    with (
        pytest.raises(WriteError, match=r"--out .*r: the run directory was removed while"),
        lock_run_dir(out),
    ):
        (out / "config.json").write_text("{}")
        shutil.rmtree(out)
        out.mkdir()  # a later write makes it again
        (out / "metrics.csv").write_text("step\n")
    # what the run wrote since is rnnkit's (its snapshot's pointer): --overwrite replaces it
    (out / "latest.json").write_text('{"format_version": 1, "snapshot": "snapshots/step-1"}')
    prepare_run_dir(out, overwrite=True)
    assert list(out.iterdir()) == []
    with pytest.raises(WriteError, match="was removed"), lock_run_dir(tmp_path / "gone"):
        shutil.rmtree(tmp_path / "gone")  # and nothing made it again
    with lock_run_dir(out):  # a directory left alone: no error
        (out / "config.json").write_text(_WRITTEN["config.json"])
    with lock_run_dir(out):  # its lock file alone removed: the run is whole
        (out / ".lock").unlink()


def test_model_spec_defaults_are_the_train_defaults() -> None:
    """``ModelSpec()`` is the model of ``rnnkit train`` with no option given: every field
    is a train option of the same name and default."""
    assert model_spec(TrainConfig(train="x")) == ModelSpec()


def test_model_spec_carries_every_model_option() -> None:
    changed = {
        "cell": "gru",
        "hidden": 9,
        "layers": 2,
        "bidirectional": True,
        "embedding": 5,
        "tie_weights": True,
        "dropout": 0.25,
        "nonlinearity": "relu",
        "update": "keep",
        "reset": "after",
        "recompute": 4,
        "length": "stop",
        "max_len": 33,
        "wiring": "jordan",
        "condition": "init",
        "pooling": "mean",
        "char_rnn": True,
        "attention": "additive",
        "context": "both",
        "attention_wiring": "after",
        "input_dropout": 0.1,
        "locked_dropout": 0.2,
        "output_dropout": 0.3,
        "recurrent_dropout": 0.4,
        "weight_drop": 0.5,
        "zoneout": 0.6,
        "embedding_dropout": 0.7,
        "layer_norm": True,
    }
    assert set(changed) == {f.name for f in dataclasses.fields(ModelSpec)}
    spec = model_spec(TrainConfig(train="x", **changed))
    assert dataclasses.asdict(spec) == changed


def test_run_settings_are_the_configs() -> None:
    assert run_settings(TrainConfig(train="x")) == RunSettings()
    cfg = TrainConfig(train="x", steps=7, epochs=None, max_time=3.5, lr=0.1, hidden=9,
                      layers=3, dropout=0.5, patience=4, min_gain=0.01, min_freq=3)  # fmt: skip
    assert dataclasses.asdict(run_settings(cfg)) == {
        "steps": 7, "epochs": None, "max_time": 3.5, "lr": 0.1, "hidden": 9, "layers": 3,
        "dropout": 0.5, "patience": 4, "min_gain": 0.01, "min_freq": 3,
    }  # fmt: skip


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_finished_run_is_reported_by_rank_0_alone(tmp_path, monkeypatch, capsys, rank):
    """``--resume`` of a finished run under torchrun: every process finds it finished;
    rank 0 says so and returns the run's summary, the others return their rank (the
    command line reports nothing for them), instead of each printing it and writing the
    report."""
    from rnnkit import messages
    from rnnkit.app.tasks.run_dir import guarded_run
    from rnnkit.errors import RunFinished
    from rnnkit.training.checkpoint import atomic_write_json

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "run"

    @guarded_run
    def finished(cfg, resume=False, quiet=False):
        atomic_write_json(out / "summary.json", {"task": "lm", "steps": 12})
        raise RunFinished(f"{cfg.out} finished at step 12 of 12")

    out.mkdir()
    before = messages.LOGGER.level
    messages.set_verbosity(0)  # the default: notes shown
    try:
        got = finished(TrainConfig(train="x", out=str(out)))
    finally:
        messages.LOGGER.setLevel(before)
    said = capsys.readouterr().err
    if rank == "0":
        assert got == {"task": "lm", "steps": 12}
        assert said.count("finished at step 12 of 12") == 1
    else:
        assert got == {"task": "lm", "rank": 1}
        assert said == ""


def test_a_resume_records_its_budget_first_and_takes_it_back_if_nothing_trained(tmp_path):
    """``--resume --steps 40`` of a run of 6 writes the budget into config.json before it
    trains (a run killed under it, SIGKILL or out of memory, resumes under it), and puts
    the file back, byte for byte, where no step was saved under it: a refusal, a run
    already finished."""
    import json

    from rnnkit.app.tasks.run_config import save_config
    from rnnkit.app.tasks.run_dir import guarded_run
    from rnnkit.errors import RunFinished
    from rnnkit.training.checkpoint import atomic_write_json

    out = tmp_path / "run"
    out.mkdir()
    save_config(out, TrainConfig(train="x", out=str(out), steps=6), data=None)
    atomic_write_json(out / "latest.json", {"step": 6})
    atomic_write_json(out / "summary.json", {"task": "lm", "steps": 6})
    original = (out / "config.json").read_bytes()
    seen = []

    def resume(effect, **budget):
        @guarded_run
        def train(cfg, resume=False, quiet=False):
            seen.append(json.loads((out / "config.json").read_text())["config"]["steps"])
            return effect()

        return train(TrainConfig(train="x", out=str(out), **budget), resume=True)

    def refused():
        raise ConfigError("refused before any step")

    def finished():
        raise RunFinished("finished")

    def killed_after_a_snapshot():
        atomic_write_json(out / "latest.json", {"step": 20})
        raise RuntimeError("killed")

    with pytest.raises(ConfigError):
        resume(refused, steps=40)
    assert resume(finished, steps=40) == {"task": "lm", "steps": 6}
    assert seen == [40, 40] and (out / "config.json").read_bytes() == original
    with pytest.raises(RuntimeError):
        resume(killed_after_a_snapshot, steps=40)
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["steps"] == 40
    first = json.loads(original)
    first["config"]["steps"] = 40
    assert config == first  # the budget alone changed
