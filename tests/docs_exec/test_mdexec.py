"""The runner of the documentation's code fails when a page is broken, and names where.

Temporary pages: a copy of a real page with one block broken on purpose, and small
pages made for one rule each (the marks, doctest blocks, shown output, the budget).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mdexec import (
    PageError,
    check_tutorial_fences,
    forkserver,
    read_page,
    run_python,
    run_shell,
    shell_env,
)

# The runner runs bash and forks (forkserver.py).
pytestmark = pytest.mark.skipif(os.name != "posix", reason="the runner needs bash and fork")
DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = "```"


def page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_real_page_runs_and_the_same_page_broken_fails_at_its_line(tmp_path: Path) -> None:
    source = (DOCS / "torch-nn.md").read_text(encoding="utf-8")
    good = page(tmp_path, source, "good.md")
    done = run_python(read_page(good), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    # The state h0 is no longer defined: the block fails where the page uses it.
    definition = "h0 = c0 = torch.zeros(2 * 2, 3, 16)  # (L·D, B, H)\n"
    assert definition in source
    broken = page(tmp_path, source.replace(definition, ""), "broken.md")
    block = read_page(broken).of("python")[0]
    use = block.line + block.text.splitlines().index(
        "output, (h_n, c_n) = lstm(packed, (h0, c0))  # a PackedSequence out, states (L·D, B, H)"
    )
    done = run_python(read_page(broken), tmp_path)
    assert done.returncode == 1
    assert f"{broken}:{block.line}: the block fails" in done.stderr
    assert f'File "{broken}", line {use}' in done.stderr
    assert "NameError: name 'h0' is not defined" in done.stderr


def test_blocks_share_one_namespace_and_doctest_blocks_check_their_output(
    tmp_path: Path,
) -> None:
    text = (
        f"{FENCE}python\nx = 20\n{FENCE}\n\n"
        f"{FENCE}python\n>>> y = x + 1\n>>> y * 2\n42\n{FENCE}\n\n"
        f"{FENCE}python\nassert y == 21, y\n{FENCE}\n"
    )
    done = run_python(read_page(page(tmp_path, text)), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ran") == 3

    wrong = page(tmp_path, text.replace("\n42\n", "\n43\n"), "wrong.md")
    done = run_python(read_page(wrong), tmp_path)
    assert done.returncode == 1
    assert f"{wrong}:6: the block fails" in done.stderr
    assert "Expected:\n    43\nGot:\n    42" in done.stderr


def test_a_warning_of_the_pages_code_is_an_error(tmp_path: Path) -> None:
    text = f"{FENCE}python\nimport warnings\nwarnings.warn('careful')\n{FENCE}\n"
    done = run_python(read_page(page(tmp_path, text)), tmp_path)
    assert done.returncode == 1
    assert "UserWarning: careful" in done.stderr


def test_skip_and_needs_marks_keep_a_block_from_running(tmp_path: Path) -> None:
    text = (
        f"<!-- skip: installs a package -->\n{FENCE}python\nraise SystemExit(3)\n{FENCE}\n\n"
        f"<!-- needs: no_such_module_of_rnnkit -->\n\n{FENCE}python\n1 / 0\n{FENCE}\n\n"
        f"<!-- needs: json -->\n{FENCE}python\nimport json\nran = True\n{FENCE}\n\n"
        "A paragraph between a mark and a fence cancels the mark.\n\n"
        f"<!-- skip -->\nText.\n\n{FENCE}python\nassert ran\n{FENCE}\n"
    )
    path = page(tmp_path, text)
    marks = [b.marks for b in read_page(path).blocks]
    assert marks == [
        {"skip": "installs a package"},
        {"needs": "no_such_module_of_rnnkit"},
        {"needs": "json"},
        {},
    ]
    done = run_python(read_page(path), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}:3: skipped (installs a package)" in done.stdout
    assert f"{path}:9: skipped (needs no_such_module_of_rnnkit, not installed)" in done.stdout
    assert done.stdout.count(": ran") == 2


def test_pages_the_runner_cannot_read_are_errors(tmp_path: Path) -> None:
    with pytest.raises(PageError, match=r"page\.md:1: the fence is never closed"):
        read_page(page(tmp_path, f"{FENCE}python\nx = 1\n"))
    with pytest.raises(PageError, match=r"page\.md:2: unknown directive 'skipp'"):
        read_page(page(tmp_path, f"Text.\n<!-- skipp -->\n{FENCE}python\n{FENCE}\n"))
    path = page(tmp_path, "<!-- after: tutorial-lm.md, tutorial-tag.md -->\n# T\n")
    assert read_page(path).after == ("tutorial-lm.md", "tutorial-tag.md")


def test_a_tutorial_tags_every_block(tmp_path: Path) -> None:
    text = f"{FENCE}\nrnnkit train\n{FENCE}\n\n{FENCE}output\nhello\n{FENCE}\n\n"
    path = page(tmp_path, text + f"{FENCE}text\nok\n{FENCE}\n")
    assert check_tutorial_fences(read_page(path)) == [
        f"{path}:2: a tutorial's block needs a language (sh, output, text, python, toml)",
        f"{path}:6: an output block follows a sh block",
    ]


def test_shell_blocks_run_in_order_and_their_shown_output_is_checked(tmp_path: Path) -> None:
    env = shell_env(tmp_path / "bin", None)
    work = tmp_path / "work"
    work.mkdir()
    text = (
        f"{FENCE}sh\necho 'trained 300 steps in 12 s' > log.txt\n{FENCE}\n\n"
        f"<!-- figures vary -->\n{FENCE}sh\nsed 's/300/5/' log.txt\n{FENCE}\n\n"
        f"{FENCE}output\ntrained 300 steps in 12 s\n{FENCE}\n"
    )
    assert run_shell(read_page(page(tmp_path, text)), work, env) == [
        f"{tmp_path / 'page.md'}:11: the output differs from the page's\n--- shown:\n"
        "trained 300 steps in 12 s\n--- printed:\ntrained 5 steps in 12 s\n"
    ]  # "figures vary" marks the output block, not the command
    varying = text.replace("<!-- figures vary -->\n", "").replace(
        f"{FENCE}output", f"<!-- figures vary -->\n{FENCE}output"
    )
    assert run_shell(read_page(page(tmp_path, varying)), work, env) == []

    failing = page(tmp_path, f"{FENCE}sh\necho first\nfalse\necho never\n{FENCE}\n", "f.md")
    assert run_shell(read_page(failing), work, env) == [f"{failing}:2: exit status 1\nfirst"]
    piped = page(tmp_path, f"{FENCE}sh\nfalse | cat\n{FENCE}\n", "p.md")
    assert run_shell(read_page(piped), work, env) == [f"{piped}:2: exit status 1"]


def test_the_budget_appends_steps_to_rnnkit_train(tmp_path: Path) -> None:
    text = (
        f"{FENCE}sh\nrnnkit train --task lm --train x.txt --steps 300 --print-config"
        f" | grep -E '^(steps|epochs) '\n{FENCE}\n\n{FENCE}output\nsteps = 7\n{FENCE}\n"
    )
    path = page(tmp_path, text)
    assert run_shell(read_page(path), tmp_path, shell_env(tmp_path / "bin", 7)) == []
    unchanged = run_shell(read_page(path), tmp_path, shell_env(tmp_path / "bin", None))
    assert unchanged and "printed:\nsteps = 300\n" in unchanged[0]


def test_the_forkserver_runs_commands_as_a_fresh_process_would(tmp_path: Path) -> None:
    """Standard input, output and error, the exit status, the working directory, the
    environment and the budget, through ``forkserver.py``, as with the plain commands."""
    text = (
        f"{FENCE}sh\nexport DOC_VALUE=7\n"
        "echo in | python -c 'import os, sys; print(sys.stdin.read().strip(), os.getcwd(), "
        'os.environ["DOC_VALUE"], sys.argv[1:])\' a b\n'
        'python -c \'import sys; sys.exit("to stderr")\' 2>&1 || echo "status $?"\n'
        "python - <<'PY'\nprint(__name__)\nPY\n"
        "rnnkit train --task lm --train x.txt --steps 300 --print-config | grep '^steps '\n"
        'rnnkit evaluate 2>/dev/null || echo "status $?"\n'
        f"{FENCE}\n\n{FENCE}output\n"
        f"in {tmp_path} 7 ['a', 'b']\nto stderr\nstatus 1\n__main__\nsteps = 7\nstatus 2\n{FENCE}\n"
    )
    path = page(tmp_path, text)
    with forkserver(tmp_path / "fork.sock") as server:
        env = shell_env(tmp_path / "bin", 7, server)
        assert run_shell(read_page(path), tmp_path, env) == []
    plain = shell_env(tmp_path / "plain", 7)
    assert run_shell(read_page(path), tmp_path, plain) == []
