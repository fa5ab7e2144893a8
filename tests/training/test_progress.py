"""The progress display: totals from the real budget, plain lines (no carriage returns)
when the output is not a terminal."""

from __future__ import annotations

import io
import math

import pytest

from rnnkit.training.progress import RATE_KEYS, Progress, postfix


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_step_budget_is_the_bar_total():
    out = Terminal()
    bar = Progress(total_steps=500, max_time=None, initial=100, file=out)
    assert bar.bar is not None and bar.bar.total == 500 and bar.bar.n == 100
    bar.update(101, loss="1.0")
    assert bar.bar.n == 101
    bar.close()


def test_a_time_budget_counts_seconds_not_steps():
    out = Terminal()
    bar = Progress(total_steps=10**9, max_time=270.0, file=out)  # a step total would lie
    assert bar.bar is not None and bar.bar.total == 270.0
    bar.update(5, loss="1.0")
    assert 0 <= bar.bar.n < 270 and bar._postfix["step"] == 5
    bar.close()
    assert "/270 s" in out.getvalue()


def test_open_ended_training_has_no_total_and_so_no_eta():
    out = Terminal()
    bar = Progress(total_steps=None, max_time=None, file=out)
    assert bar.bar is not None and bar.bar.total is None
    bar.update(7, no_gain="3/20")
    bar.bar.refresh()
    bar.close()
    text = out.getvalue()
    assert "7step" in text and "no_gain=3/20" in text and "<" not in text  # no remaining


def test_not_a_terminal_plain_lines_at_an_interval():
    out = io.StringIO()
    bar = Progress(total_steps=40, max_time=None, file=out, interval=0.0)
    assert bar.bar is None
    for step in range(1, 4):
        bar.update(step, loss=f"{step}.0")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 3 and lines[-1].startswith("train:")
    assert "3/40" in lines[-1] and "loss=3.0" in lines[-1]


def test_not_a_terminal_nothing_before_the_first_interval():
    out = io.StringIO()
    bar = Progress(total_steps=40, max_time=None, file=out, interval=3600.0)
    bar.update(1, loss="1.0")
    bar.close()
    assert out.getvalue() == ""


def test_disabled_shows_nothing():
    out = Terminal()
    bar = Progress(total_steps=10, max_time=None, disable=True, file=out)
    bar.update(3)
    bar.close()
    assert bar.bar is None and out.getvalue() == ""


def test_not_a_terminal_a_time_budget_in_whole_seconds():
    # "train: 32% 1055/3300 s [17:35<37:24, step=5]", not "1055.2852751320024/3300.0".
    bar = Progress(total_steps=None, max_time=3300.0, file=io.StringIO())
    bar.update(5, loss="0.2")
    line = bar.line(1055.2852751320024)
    assert line.startswith("train: 32% 1055/3300 s [17:35<")
    assert "step=5" in line and "loss=0.2" in line and "s/s" not in line


def test_the_postfix_shows_loss_bits_or_perplexity_rate_and_patience():
    # by hand: e^1.5 = 4.4817, 1.5 / ln 2 = 2.1640 bits
    assert list(postfix(1.5, 3e-4, 1234.6).items()) == [
        ("loss", "1.500"),
        ("ppl", "4.48"),
        ("lr", "0.0003"),
        ("tok_s", "1235"),
    ]
    bits = postfix(1.5, 0.002, 10.0, units="bits", no_gain="3/20")
    assert list(bits.items()) == [
        ("loss", "1.500"),
        ("bits", "2.164"),
        ("lr", "0.002"),
        ("tok_s", "10"),
        ("no_gain", "3/20"),
    ]
    assert float(postfix(1.5, 1.0, 1.0)["ppl"]) == pytest.approx(math.exp(1.5), abs=0.005)
    # a diverging loss shows a large perplexity, never an overflow
    assert float(postfix(1e6, 1.0, 1.0)["ppl"]) == pytest.approx(math.exp(50))


@pytest.mark.parametrize("counts", list(RATE_KEYS))
def test_the_rate_is_named_by_what_the_loss_counts(counts):
    assert RATE_KEYS[counts] in postfix(1.0, 0.1, 5.0, counts=counts)
