"""The training progress display: a tqdm bar against the run's real budget.

The bar measures what actually ends the run: seconds for a time budget (``--max-time``),
steps for a step or epoch budget, and, when training runs until validation stops
improving, a plain step counter (no total, so no invented ETA) with the validations
without improvement in the postfix. On a terminal it is tqdm's bar; when stderr is a file
or a pipe (a log), tqdm would write one carriage-return-separated line per refresh, so
instead the same text (``tqdm.format_meter``) is written as an ordinary line every
``interval`` seconds. What the bar shows after each step is :func:`postfix`.
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO, Any

from tqdm import tqdm

__all__ = ["RATE_KEYS", "Progress", "postfix"]

# A time budget's bar counts seconds: "42/270 s [00:42<03:48, step=1200, ...]".
TIME_FORMAT = "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"


#: The bar's name for the rate, by what the loss counts (``TrainOptions.counts``).
RATE_KEYS = {"tokens": "tok_s", "examples": "ex_s", "values": "values_s"}


def postfix(
    loss: float,
    lr: float,
    rate: float,
    counts: str = "tokens",
    units: str = "ppl",
    no_gain: str | None = None,
) -> dict[str, str]:
    """What the bar shows after a step: the training loss since the last record, its
    bits (``units="bits"``: ``loss / ln 2``) or perplexity (``exp(loss)``) where the loss
    is a cross-entropy per token (``counts="tokens"``), the learning rate of the step, the
    rate named by what the loss counts (:data:`RATE_KEYS`), and ``no_gain`` (validations
    without improvement out of the patience) when given.

    A classifier's loss (``counts="examples"``) is nats per example and a regressor's
    (``"values"``) the loss per predicted value (the mean squared error, or a Gaussian
    negative log-likelihood): their bar shows the loss alone, as the summary does.

    >>> postfix(1.0, 0.002, 40960.4)
    {'loss': '1.000', 'ppl': '2.72', 'lr': '0.002', 'tok_s': '40960'}
    >>> postfix(0.6931, 0.002, 812.4, counts="examples")
    {'loss': '0.693', 'lr': '0.002', 'ex_s': '812'}
    """
    shown = (
        {}
        if counts != "tokens"  # exp of nats per example, or of an mse: no perplexity
        else {"bits": f"{loss / math.log(2):.3f}"}
        if units == "bits"
        else {"ppl": f"{math.exp(min(loss, 50)):.2f}"}
    )
    return {
        "loss": f"{loss:.3f}",
        **shown,
        "lr": f"{lr:.3g}",
        RATE_KEYS.get(counts, "tok_s"): f"{rate:.0f}",
        **({"no_gain": no_gain} if no_gain is not None else {}),
    }


class Progress:
    """Progress of one ``Trainer.fit()`` call.

    Args:
        total_steps: the step budget (None: no step budget).
        max_time: the time budget in seconds (None: none); it takes precedence over
            ``total_steps`` (a time budget is what ends such a run).
        initial: steps already done (a resumed run).
        disable: show nothing.
        file: where to write (default: ``sys.stderr``).
        interval: seconds between plain lines when ``file`` is not a terminal.
    """

    def __init__(
        self,
        *,
        total_steps: int | None,
        max_time: float | None,
        initial: int = 0,
        disable: bool = False,
        file: IO[str] | None = None,
        interval: float = 30.0,
    ) -> None:
        self.file = file if file is not None else sys.stderr
        self.by_time = max_time is not None
        self.total: float | None = max_time if self.by_time else total_steps
        self.unit = "s" if self.by_time else "step"
        self.step = initial
        self.initial = initial
        self.interval = interval
        self.started = time.perf_counter()
        self._last_line = self.started
        self._postfix: dict[str, Any] = {}
        isatty = getattr(self.file, "isatty", None)
        self.terminal = bool(isatty and isatty())
        self.bar: tqdm | None = None
        self.disabled = disable
        if disable or not self.terminal:
            return
        if self.by_time:
            self.bar = tqdm(
                total=max_time,
                file=self.file,
                dynamic_ncols=True,
                leave=False,
                bar_format=TIME_FORMAT,
            )
        else:
            self.bar = tqdm(
                total=total_steps,
                initial=initial,
                file=self.file,
                unit="step",
                dynamic_ncols=True,
                leave=False,
            )

    def update(self, step: int, **postfix: Any) -> None:
        """Record that ``step`` steps are done; ``postfix`` is shown after the bar."""
        if self.disabled:
            return
        now = time.perf_counter()
        elapsed = now - self.started
        if self.by_time:
            postfix = {"step": step, **postfix}
        self._postfix = postfix
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            if self.by_time:
                assert self.total is not None
                self.bar.update(min(elapsed, self.total) - self.bar.n)
            else:
                self.bar.update(step - self.step)
            self.step = step
            return
        self.step = step
        if now - self._last_line >= self.interval:
            self._last_line = now
            print(self.line(elapsed), file=self.file, flush=True)

    def line(self, elapsed: float) -> str:
        """The progress as one plain line (what the bar shows, without the bar)."""
        n = min(elapsed, self.total) if self.by_time and self.total is not None else self.step
        text = tqdm.format_meter(
            n,
            self.total,
            elapsed,
            # ncols=0 (no bar) also drops a custom bar_format; the time form has no {bar}.
            ncols=None if self.by_time else 0,
            unit=self.unit,
            initial=0 if self.by_time else self.initial,
            bar_format=TIME_FORMAT.replace("{l_bar}{bar}| ", "{percentage:3.0f}% ")
            if self.by_time
            else None,
            postfix=", ".join(f"{k}={v}" for k, v in self._postfix.items()) or None,
        )
        return "train: " + text.strip()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
