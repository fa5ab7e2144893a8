"""rnnkit.messages: one level for what rnnkit says on stderr, in rnnkit's own format."""

from __future__ import annotations

import logging

import pytest

from rnnkit import messages


@pytest.fixture(autouse=True)
def _default_level():
    yield
    messages.set_verbosity(0)


def said(capsys) -> list[str]:
    messages.debug("a detail")
    messages.info("a note")
    messages.warning("a warning")
    messages.info("a summary", who="rnnkit score")
    captured = capsys.readouterr()
    assert captured.out == ""  # never on stdout: that is for results
    return captured.err.splitlines()


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (2, ["rnnkit: a detail", "rnnkit: a note", "rnnkit: warning: a warning",
             "rnnkit score: a summary"]),
        (1, ["rnnkit: a detail", "rnnkit: a note", "rnnkit: warning: a warning",
             "rnnkit score: a summary"]),
        (0, ["rnnkit: a note", "rnnkit: warning: a warning", "rnnkit score: a summary"]),
        (-1, ["rnnkit: warning: a warning"]),
        (-2, []),
        (-5, []),
    ],
)  # fmt: skip
def test_each_level_shows_what_it_says(capsys, level, expected):
    messages.set_verbosity(level)
    assert said(capsys) == expected
    assert messages.verbosity() == max(-2, min(1, level))


def test_the_default_is_info_and_nothing_reaches_the_root_logger(capsys):
    assert messages.level_name() == "INFO"
    root = logging.getLogger()
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Collect()
    root.addHandler(handler)
    try:
        messages.warning("once")
    finally:
        root.removeHandler(handler)
    # A program's own logging.basicConfig must not print every line a second time.
    assert seen == []
    assert capsys.readouterr().err == "rnnkit: warning: once\n"


def test_a_warning_may_name_its_own_kind(capsys):
    messages.warning("behind baseline: 2.1 vs 2.0", label="")
    messages.set_verbosity(-2)
    messages.warning("behind baseline: hidden by -qq", label="")
    assert capsys.readouterr().err == "rnnkit: behind baseline: 2.1 vs 2.0\n"


def test_a_level_set_through_logging_is_honoured(capsys):
    logging.getLogger("rnnkit").setLevel(logging.ERROR)
    assert messages.verbosity() == -2
    assert said(capsys) == []


def test_a_quieted_note_is_that_modules_only_and_the_filters_change_once():
    import sys
    import types
    import warnings

    def module(name: str) -> types.ModuleType:  # code whose warnings come from ``name``
        mod = types.ModuleType(name)
        exec(
            "import warnings\ndef say(text):\n    warnings.warn(text, UserWarning)\n", mod.__dict__
        )
        sys.modules[name] = mod
        return mod

    ours, theirs = module("rnnkit._quiet_probe"), module("users_program")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            messages.quiet_in_module("note of torch", "rnnkit._quiet_probe")
            before = list(warnings.filters)
            messages.quiet_in_module("note of torch", "rnnkit._quiet_probe")
            assert warnings.filters == before  # in force: not put again (no change)
            ours.say("note of torch: beta")
            ours.say("another note")
            theirs.say("note of torch: beta")
            assert [str(w.message) for w in caught] == ["another note", "note of torch: beta"]
            warnings.simplefilter("error")  # a caller's filter went before it
            # and a caller's near-copy for another category (it quiets no UserWarning)
            warnings.filterwarnings(
                "ignore", "note of torch", DeprecationWarning, r"rnnkit\._quiet_probe\Z"
            )
            messages.quiet_in_module("note of torch", "rnnkit._quiet_probe")
            ours.say("note of torch: again")  # quiet again, not an error
            with pytest.raises(UserWarning):
                theirs.say("note of torch")
    finally:
        del sys.modules["rnnkit._quiet_probe"], sys.modules["users_program"]
