"""``rnnkit report --checkpoint DIR [--out PATH]``: writes the HTML report, says where,
and turns a bad directory into one line on stderr with a non-zero exit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rnnkit.app.cli.main import main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "hat"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    rng = random.Random(0)
    text = "".join(" ".join(rng.choice(WORDS) for _ in range(5)) + "\n" for _ in range(100))
    (root / "train.txt").write_text(text, encoding="utf-8")
    argv = ["train", "--train", str(root / "train.txt"), "--out", str(root / "run")]
    argv += ["--cell", "rnn", "--hidden", "8", "--embedding", "8", "--batch-size", "4"]
    argv += ["--bptt", "segment:16", "--steps", "10", "--ngram-order", "2", "--quiet"]
    assert main(argv) == 0
    return root / "run"


def test_report_writes_the_default_path_and_says_where(run_cli, run_dir):
    code, out, err = run_cli("report", "--checkpoint", str(run_dir))
    assert code == 0, err
    path = run_dir / "report.html"
    assert out == f"report: {path}\n"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "data:image/png;base64," in text


def test_report_out_option(run_cli, run_dir, tmp_path, monkeypatch):
    import rnnkit.app.report.page as page

    # The content is the library's business (tests/app/report); here only where it goes.
    monkeypatch.setattr(page, "render_report", lambda run, device: f"<!DOCTYPE html>{run}")
    out_path = tmp_path / "reports" / "run.html"
    code, out, _ = run_cli("report", "--checkpoint", str(run_dir), "--out", str(out_path))
    assert code == 0
    assert out.strip() == f"report: {out_path}"
    assert out_path.read_text() == f"<!DOCTYPE html>{run_dir}"
    code, out, _ = run_cli("report", "--checkpoint", str(run_dir), "--out", str(tmp_path))
    assert code == 0 and out.strip() == f"report: {tmp_path / 'report.html'}"
    # '-' is standard output, as for sessions --out (it wrote a file named "-")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli("report", "--checkpoint", str(run_dir), "--out", "-")
    assert (code, out) == (0, f"<!DOCTYPE html>{run_dir}") and not (tmp_path / "-").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "{tmp}/missing"], "no such checkpoint directory"),
        (["--checkpoint", "{tmp}"], "config.json: missing"),
    ],
)
def test_bad_checkpoint_is_one_line_and_exit_2(run_cli, tmp_path, argv, message):
    code, out, err = run_cli("report", *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("rnnkit report: error:")
    assert not (tmp_path / "report.html").exists()


def test_usage_errors(run_cli):
    code, _, err = run_cli("report")
    assert code == 2 and "--checkpoint" in err
    code, out, _ = run_cli("report", "--help")
    assert code == 0 and "--out" in out and "self-contained" in out


def special_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, and a character device (a copy of /dev/null's node, where mknod is allowed:
    the test never points rnnkit at a real system device)."""
    import os
    import stat

    made = {"FIFO": tmp_path / "fifo"}
    os.mkfifo(made["FIFO"])
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made["character device"] = tmp_path / "null"
    except OSError:
        pass  # not root: the FIFO still shows the rule
    return made


def test_report_never_replaces_a_device_or_fifo(run_cli, run_dir, tmp_path):
    import os
    import stat

    for kind, path in special_files(tmp_path).items():
        mode = os.lstat(path).st_mode
        code, out, err = run_cli("report", "--checkpoint", str(run_dir), "--out", str(path))
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"{path}: is a {kind}, not a regular file; refusing to replace it" in err
        assert os.lstat(path).st_mode == mode and not stat.S_ISREG(mode)


def test_report_never_replaces_a_file_that_is_not_a_report(run_cli, run_dir, tmp_path):
    """``--out notes.txt`` or ``--out RUN/model.safetensors`` given by mistake: the file was
    silently replaced by the page. Now refused in one line, the file byte for byte as it was;
    an earlier report is still replaced, and an empty ``--out`` is refused."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the only copy of my notes\n")
    weights = run_dir / "model.safetensors"
    before = weights.read_bytes()
    for path in (notes, weights):
        code, out, err = run_cli("report", "--checkpoint", str(run_dir), "--out", str(path))
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"{path}: exists and is not a report written by rnnkit; refusing" in err
    assert notes.read_text() == "the only copy of my notes\n" and weights.read_bytes() == before
    page = tmp_path / "page.html"
    for _ in range(2):  # a new path, then the report written there the first time
        code, _, err = run_cli("report", "--checkpoint", str(run_dir), "--out", str(page))
        assert code == 0, err
    code, _, err = run_cli("report", "--checkpoint", str(run_dir), "--out", "")
    assert code == 2 and err.endswith(
        "error: --out is empty: name the report's file or directory\n"
    )
