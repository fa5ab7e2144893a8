"""Is the trained model behind its baseline? One comparison for every task.

Every task scores a baseline on the same validation data as the model: the n-gram
(``summary["ngram"]``: ``lm``, ``events``) or the task's own (``summary["baselines"]``:
``{name: {"kind": …, metric: value, …}}``). :func:`behind_baseline` compares the model
with the best of them on the task's headline metric (:data:`HEADLINE`) and, when the
model is worse, says so in one line with the likely cause and what to try, read from
the run itself:

* validation tokens unknown to the vocabulary, :data:`UNKNOWN_SHARE` of them or more, in
  a run whose vocabulary holds every training token (``--min-freq 1``: ``lm``,
  ``events``; the summary's ``unknown_valid_tokens`` or ``unknown_valid_events``): no
  training token was the unknown symbol, so the model learnt to give it almost no
  probability, where the n-gram's smoothing keeps some for the unseen — the more it
  trains, the worse its validation loss (a rise that reads as overfitting) —
  ``--min-freq 2``;

* validation still improving when training ended (the best validation was the last, or
  the only one after it is the run's closing validation, sooner after the best than
  validations came before: a budget that ended the run between two regular validations
  leaves one noisy figure, not a trend): the run was too short — a budget option
  (``--steps``, ``--epochs``, ``--max-time``) ended it, or the default mode's cap did;
  or it improved too slowly: falls each short of ``--min-gain`` made early stopping end
  it;
* validation stopped improving, read from the run's course after the best step
  (``summary["trajectory"]``, :mod:`rnnkit.training.trajectory`: the smoothed training
  loss at the best step and at the end, the validation loss at the best and at the last
  validation), in this order:

  - the training loss fell clearly (by :data:`CLEAR_CHANGE` of its value and
    :data:`CLEAR_SE` standard errors of the change, or more) while validation stayed or
    rose: overfitting — more ``--dropout``, a smaller ``--hidden``,
    more data;
  - the training loss at the end under :data:`OVERFIT_RATIO` of the validation loss, or
    below the baseline's own validation loss (the model fits its training data better
    than the baseline fits the validation data, yet ends behind on validation: it does
    not generalise from this data): overfitting, the same advice;
  - the training loss rose clearly: the optimisation is unstable — a smaller ``--lr``;
  - the training loss at the end :data:`UNDERFIT_RATIO` times the baseline's validation
    loss or more (in its unit: nats a token, a ``regress --loss mse`` run's mean squared
    error; a Gaussian likelihood has no baseline to compare): the model fits even its
    training data far worse than the baseline predicts new data — underfitting, whatever
    validation did;
  - the validation loss rose by :data:`VALID_RISE` of its best or more while the training
    loss did not rise (the model grew ever surer of its training data and wronger on new
    data: a classifier's validation loss climbs so long before its accuracy moves):
    overfitting, the same advice;
  - the training loss flat as well, and validation with it (the model learns no more,
    from either): underfitting — a larger ``--hidden``, another ``--lr``, more
    ``--layers``.

  The sentence names the figures (``the training loss fell from 1.12 to 0.837 after the
  best step while validation rose from 1.56 to 1.98: overfitting``). A summary without
  the course (the best validation came before a ``--resume``, whose events are not in
  memory) is judged by the final training loss against the validation loss alone: under
  half of it, or under the baseline's, overfitting; otherwise underfitting.

The result is ``summary["behind_baseline"]`` (None when the model is not behind, or no
baseline can be compared), printed by ``rnnkit train`` on stderr and shown in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

__all__ = ["HEADLINE", "LABELS", "RunSettings", "baseline_figures", "behind_baseline", "compare"]

#: Per task: the validation metrics to compare, in order of preference (the first that
#: the model and a baseline both report), and whether higher is better.
HEADLINE: dict[str, tuple[tuple[str, ...], bool]] = {
    "lm": (("bits_per_char", "loss_nats"), False),
    "events": (("loss_nats",), False),
    "regress": (("mse",), False),
    "tag": (("accuracy",), True),
    "classify": (("accuracy",), True),
    "seq2seq": (("character_error_rate", "token_error_rate"), False),
}

LABELS = {
    "bits_per_char": "bits/char",
    "loss_nats": "loss (nats/token)",
    "mse": "mse",
    "accuracy": "accuracy",
    "character_error_rate": "character error rate",
    "token_error_rate": "token error rate",
}

# The training loss under half the validation loss, once validation stopped improving:
# the model fits the training data much better than the rest — overfitting.
OVERFIT_RATIO = 0.5

# A smoothed training loss that moved by this share of its value at the best step, and
# by CLEAR_SE standard errors of the change (the records' own noise), moved clearly
# (fell: the model went on fitting its training data while validation did not follow;
# rose: the optimisation went astray); less is a plateau.
CLEAR_CHANGE = 0.05
CLEAR_SE = 2.0

# A validation loss this share above its best at the last validation rose clearly: it is
# measured on the whole validation set at every validation, so without the training
# records' noise.
VALID_RISE = 0.10

# The training loss at the end this many times the baseline's validation loss or more:
# the model fits even the data it trains on far worse than the baseline predicts new
# data — it underfits, whatever validation did after its best step.
UNDERFIT_RATIO = 2.0

# Validation tokens unknown to a vocabulary of every training token: from this share on,
# their loss decides the comparison with an n-gram (each costs some ten nats or more).
UNKNOWN_SHARE = 0.01


@dataclass(frozen=True)
class RunSettings:
    """The options of a run that the advice names: its budget (``steps``, ``epochs``,
    ``max_time``; None: not given) and the knobs to turn (``lr``, ``hidden``, ``layers``,
    ``dropout``, ``patience``, ``min_gain``). Each field is the train option of its name,
    with its default."""

    steps: int | None = None
    epochs: int | None = 1
    max_time: float | None = None
    lr: float = 2e-3
    hidden: int = 256
    layers: int = 1
    dropout: float = 0.0
    patience: int | None = None
    min_gain: float = 1e-4
    min_freq: int = 1


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def baseline_figures(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(what, metrics)`` of every baseline of a summary: the n-gram, then the task's own.

    >>> baseline_figures({"ngram": {"order": 3, "loss_nats": 1.0}})
    [('3-gram', {'order': 3, 'loss_nats': 1.0})]
    """
    out: list[tuple[str, dict[str, Any]]] = []
    ngram = summary.get("ngram")
    if isinstance(ngram, dict):
        out.append((f"{ngram.get('order', 'n')}-gram", ngram))
    baselines = summary.get("baselines")
    if isinstance(baselines, dict):
        for name, figures in baselines.items():
            if isinstance(figures, dict):
                out.append((str(figures.get("kind", name)), figures))
    return out


def _comparable(valid: dict[str, Any], baseline: dict[str, Any], metric: str) -> bool:
    # A loss per token compares only over the same tokens (an LM with --length stop has
    # no </s> token, the n-gram has one).
    if metric in ("loss_nats", "bits_per_char") and "tokens" in valid and "tokens" in baseline:
        return valid["tokens"] == baseline["tokens"]
    return True


def _budget(settings: RunSettings) -> list[str]:
    """The budget options of the run (empty: trained until validation stopped improving)."""
    given = []
    if settings.steps is not None:
        given.append(f"--steps {settings.steps}")
    elif settings.epochs is not None:
        given.append(f"--epochs {settings.epochs}")
    if settings.max_time is not None:
        given.append(f"--max-time {settings.max_time:g}")
    return given


def _baseline_loss(summary: dict[str, Any], kind: str) -> float | None:
    """The validation loss of the baseline ``kind`` in the unit of the model's training
    loss (nats a token; a ``regress --loss mse`` run's mean squared error), where it has
    one over the same tokens as the model. None for ``regress --loss gaussian``, whose
    negative log-likelihood no baseline has."""
    valid = summary.get("valid") or {}
    key = "loss_nats"
    if summary.get("task") == "regress":
        if summary.get("loss", "mse") != "mse":
            return None
        key = "mse"
    for what, figures in baseline_figures(summary):
        if what == kind and _comparable(valid, figures, key):
            return _number(figures.get(key))
    return None


def _too_soon_to_tell(summary: dict[str, Any]) -> int | None:
    """The steps from the best validation to the run's last, where that last is the only
    validation after the best and came sooner after it than validations came before
    (``valid_every`` of ``summary["trajectory"]``): a budget ended the run between two
    regular validations, and its closing one, a few steps on, cannot show that
    validation stopped improving (one noisy figure against a trend). None otherwise."""
    course = summary.get("trajectory")
    if not isinstance(course, dict):
        return None
    keys = ("best_step", "last_valid_step", "valids_after_best", "valid_every")
    figures = [course.get(k) for k in keys]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in figures):
        return None
    best, last, after, every = cast("list[int]", figures)
    return last - best if after == 1 and last - best < every else None


def _unknown_tokens(
    summary: dict[str, Any], settings: RunSettings, baseline_kind: str | None
) -> tuple[str, str] | None:
    """``(cause, advice)`` where :data:`UNKNOWN_SHARE` or more of the validation tokens are
    unknown to a vocabulary of every training token (``--min-freq 1``); None otherwise."""
    if settings.min_freq != 1:
        return None
    what = "events" if "unknown_valid_events" in summary else "tokens"
    unknown = summary.get(f"unknown_valid_{what}")
    scored = (summary.get("valid") or {}).get("tokens")
    if not (isinstance(unknown, int) and isinstance(scored, int) and scored > 0):
        return None
    if unknown < UNKNOWN_SHARE * scored:
        return None
    one = what.removesuffix("s")
    against = f"the {baseline_kind}" if baseline_kind else "the baseline"
    return (
        f"{unknown:,} of the {scored:,} validation {what} ({100 * unknown / scored:.1f} %) "
        f"are unknown to the vocabulary (never seen in training); with --min-freq 1 no "
        f"training {one} was the unknown symbol, so the model learnt to give it almost no "
        f"probability, where {against} keeps some for the unseen",
        f"--min-freq 2 (the {what} seen once in training become the unknown symbol, "
        f"which the model then learns to expect)",
    )


def _still_improving(summary: dict[str, Any], settings: RunSettings) -> tuple[str, str] | None:
    """``(cause, advice)`` when the best validation was the last, or the one after it came
    too soon to tell (:func:`_too_soon_to_tell`); None otherwise."""
    steps, best = summary.get("steps"), (summary.get("valid") or {}).get("step")
    if not (isinstance(best, int) and isinstance(steps, int)):
        return None
    stopped = summary.get("stopped") or ""
    soon = None
    if best < steps:
        soon = None if summary.get("stopped_early") is True else _too_soon_to_tell(summary)
        if soon is None:
            return None
    # (where the run's closing validation came too soon after the best to tell)
    after = (
        ""
        if soon is None
        else f" (its best at step {best}; the one validation after it, {soon} "
        f"step{'' if soon == 1 else 's'} later "
        f"at the end, came too soon to tell it had stopped)"
    )
    if summary.get("stopped_early") is True:
        # each validation a new best, yet early stopping: the falls were below --min-gain
        patience = f" or a larger --patience (now {settings.patience})" if settings.patience else ""
        return (
            f"validation was still improving, too slowly to count, when training stopped "
            f"({stopped or 'early stopping'})",
            f"a larger --lr (now {settings.lr:g}), or a smaller --min-gain (now "
            f"{settings.min_gain:g}){patience} to train on through slow gains",
        )
    budget = _budget(settings)
    course = summary.get("trajectory")
    once = isinstance(course, dict) and course.get("valids") == 1
    if budget:
        flags = " / ".join(b.split()[0] for b in budget)
        # one validation, the closing one, shows no trend: "still improving" was a guess
        ended = (
            f"the budget ({', '.join(budget)}) ended with the run's only validation, too "
            "soon to tell whether validation had stopped improving"
            if once
            else f"validation was still improving when the budget ({', '.join(budget)}) "
            f"ended{after}"
        )
        return (
            ended,
            f"train longer: raise {flags} (with --resume, training goes on from the last "
            f"snapshot), or leave {flags} out of a new run (training then runs until "
            "validation stops improving)",
        )
    return (
        f"validation was still improving when training stopped ({stopped or 'the cap'}){after}",
        f"a larger --lr (now {settings.lr:g}) or a longer run (--epochs beyond the cap)",
    )


def _overfit_advice(settings: RunSettings) -> str:
    return (
        f"more --dropout (now {settings.dropout:g}), a smaller --hidden "
        f"(now {settings.hidden}) or more training data"
    )


def _underfit_advice(settings: RunSettings) -> str:
    return (
        f"a larger --hidden (now {settings.hidden}), another --lr (now {settings.lr:g}; "
        f"try a third and three times it) or --layers {settings.layers + 1}"
    )


class _Course(NamedTuple):
    """The figures of ``summary["trajectory"]`` the diagnosis reads."""

    train_best: float
    train_end: float
    valid_best: float
    valid_last: float
    change_se: float  # 0 where unknown: the share rule alone

    def moved(self) -> int:
        """-1: the training loss fell clearly after the best step, +1: rose clearly, 0:
        neither (by :data:`CLEAR_CHANGE` of its value and :data:`CLEAR_SE` standard
        errors)."""
        change = self.train_end - self.train_best
        if abs(change) < max(CLEAR_CHANGE * self.train_best, CLEAR_SE * self.change_se):
            return 0
        return -1 if change < 0 else 1


def _course(summary: dict[str, Any]) -> _Course | None:
    """The figures of ``summary["trajectory"]`` (None where the run's events could not
    tell, and for a negative loss — a Gaussian log-likelihood — whose shares of itself
    mean nothing)."""
    course = summary.get("trajectory")
    if not isinstance(course, dict):
        return None
    keys = ("train_loss_at_best", "train_loss_end", "valid_loss_best", "valid_loss_last")
    figures = [f for k in keys if (f := _number(course.get(k))) is not None and f >= 0]
    if len(figures) != len(keys):
        return None
    se = _number(course.get("train_loss_change_se"))
    train_best, train_end, valid_best, valid_last = figures
    known = se if se is not None and se >= 0 else 0.0
    return _Course(train_best, train_end, valid_best, valid_last, known)


def _gap(
    summary: dict[str, Any], train_loss: float, valid_loss: float, baseline_kind: str | None
) -> str | None:
    """Whether a training loss ``train_loss`` is far below the validation loss: ``"ratio"``
    when under :data:`OVERFIT_RATIO` of it, the sentence saying so when under the
    baseline's own validation loss, None when neither."""
    if valid_loss > 0 and train_loss < OVERFIT_RATIO * valid_loss:
        return "ratio"
    base_loss = None if baseline_kind is None else _baseline_loss(summary, baseline_kind)
    if base_loss is not None and train_loss < base_loss < valid_loss:
        return (
            f"the training loss ({train_loss:.3g}) is below the {baseline_kind}'s "
            f"validation loss ({base_loss:.3g}) but the model's validation loss is "
            f"{valid_loss:.3g}: it does not generalise from this data (overfitting)"
        )
    return None


def _from_course(
    summary: dict[str, Any],
    settings: RunSettings,
    baseline_kind: str | None,
    course: _Course,
) -> tuple[str, str]:
    """``(cause, advice)`` of a run whose validation stopped improving, read from its
    course after the best step."""
    train_best, train_end, valid_best, valid_last = course[:4]
    moved = course.moved()
    best, steps = (summary.get("valid") or {}).get("step"), summary.get("steps")
    peak = f"validation stopped improving at step {best} of {steps}"
    valid = (
        f"validation rose from {valid_best:.3g} to {valid_last:.3g}"
        if f"{valid_last:.3g}" != f"{valid_best:.3g}"
        else f"validation stayed at {valid_best:.3g}"
    )
    if moved < 0:
        return (
            f"{peak}; the training loss fell from {train_best:.3g} to {train_end:.3g} after "
            f"the best step while {valid}: overfitting",
            _overfit_advice(settings),
        )
    gap = _gap(summary, train_end, valid_best, baseline_kind)
    if gap == "ratio":
        return (
            f"{peak}; the training loss ({train_end:.3g} at the end) is under half the "
            f"validation loss ({valid_best:.3g}): overfitting",
            _overfit_advice(settings),
        )
    if gap is not None:
        return f"{peak}; {gap}", _overfit_advice(settings)
    if moved > 0:
        return (
            f"{peak}; the training loss rose from {train_best:.3g} to {train_end:.3g} after "
            f"the best step while {valid}: the optimisation is unstable",
            f"a smaller --lr (now {settings.lr:g}; try a third of it)",
        )
    base_loss = None if baseline_kind is None else _baseline_loss(summary, baseline_kind)
    if base_loss is not None and base_loss > 0 and train_end >= UNDERFIT_RATIO * base_loss:
        # however validation moved: a model this far from the baseline on the data it
        # trains on has not fitted it, let alone too well
        return (
            f"{peak}; the training loss ({train_end:.3g} at the end) is over "
            f"{UNDERFIT_RATIO:g} times the {baseline_kind}'s validation loss "
            f"({base_loss:.3g}) while {valid}: the model underfits",
            _underfit_advice(settings),
        )
    if valid_last >= (1 + VALID_RISE) * valid_best:
        return (
            f"{peak}; {valid} after the best step while the training loss did not rise "
            f"({train_best:.3g}, then {train_end:.3g} at the end): overfitting",
            _overfit_advice(settings),
        )
    return (
        f"{peak}; the training loss stayed near {train_best:.3g} after the best step "
        f"({train_end:.3g} at the end) while {valid}: the model underfits",
        _underfit_advice(settings),
    )


def _diagnose(
    summary: dict[str, Any], settings: RunSettings, baseline_kind: str | None = None
) -> tuple[bool, str, str]:
    """``(still improving, likely cause, what to try)`` of a run that ended behind its
    baseline ``baseline_kind``."""
    unknown = _unknown_tokens(summary, settings, baseline_kind)
    if unknown is not None:  # whatever the course: more of it makes the loss no better
        return False, *unknown
    still = _still_improving(summary, settings)
    if still is not None:
        return True, *still
    course = _course(summary)
    if course is not None:
        return False, *_from_course(summary, settings, baseline_kind, course)
    # Without the run's course (a summary without ``trajectory``): the final training
    # loss against the validation loss.
    valid = summary.get("valid") or {}
    loss_key = "loss" if summary.get("task") == "regress" else "loss_nats"
    train_loss, valid_loss = _number(summary.get("train_loss_nats")), _number(valid.get(loss_key))
    peak = f"validation stopped improving at step {valid.get('step')} of {summary.get('steps')}"
    if train_loss is not None and valid_loss is not None:
        gap = _gap(summary, train_loss, valid_loss, baseline_kind)
        if gap == "ratio":
            return (
                False,
                f"{peak} while the training loss went on falling ({train_loss:.3g} vs "
                f"{valid_loss:.3g} on validation): overfitting",
                _overfit_advice(settings),
            )
        if gap is not None:
            return False, f"{peak}; {gap}", _overfit_advice(settings)
    shown = f" (training loss {train_loss:.3g})" if train_loss is not None else ""
    return False, f"{peak}{shown}: the model underfits", _underfit_advice(settings)


def compare(summary: dict[str, Any], task: str | None = None) -> dict[str, Any] | None:
    """The model against its best baseline on the task's headline metric: ``{"metric",
    "model", "baseline", "kind", "behind"}`` (None when nothing can be compared). The
    first metric of :data:`HEADLINE` that the model and a baseline both report decides.

    >>> compare({"task": "classify", "valid": {"accuracy": 0.9},
    ...          "baselines": {"a": {"kind": "x", "accuracy": 0.5},
    ...                        "b": {"kind": "y", "accuracy": 0.7}}})["kind"]
    'y'
    """
    task = summary.get("task", task)
    if task not in HEADLINE:
        return None
    metrics, higher = HEADLINE[task]
    valid = summary.get("valid")
    if not isinstance(valid, dict):
        return None
    for metric in metrics:
        model = _number(valid.get(metric))
        if model is None:
            continue
        scored = [
            (value, kind)
            for kind, figures in baseline_figures(summary)
            if (value := _number(figures.get(metric))) is not None
            and _comparable(valid, figures, metric)
        ]
        if not scored:
            continue
        base, kind = max(scored) if higher else min(scored)
        behind = model < base if higher else model > base
        return {"metric": metric, "model": model, "baseline": base, "kind": kind, "behind": behind}
    return None


def _figure(value: float) -> str:
    """Four significant digits, zeros kept (3.0004 is ``3.000`` beside ``2.334``, as the
    summary prints it, not ``3``).

    >>> _figure(3.0004), _figure(0.75), _figure(1234.6), _figure(1e-5)
    ('3.000', '0.7500', '1235', '1.000e-05')
    """
    return f"{value:#.4g}".rstrip(".")


def behind_baseline(
    summary: dict[str, Any], task: str, settings: RunSettings
) -> dict[str, Any] | None:
    """The model against its best baseline on the task's headline metric; None unless
    the model is strictly worse. ``task`` applies when the summary does not name its own;
    ``settings``: what the advice quotes and suggests changing.

    Returns ``{"metric", "model", "baseline", "baseline_kind", "steps", "best_step",
    "still_improving", "cause", "advice", "line"}``; ``line`` is the one line to show.

    >>> s = {"task": "tag", "steps": 1, "stopped": "1 step done",
    ...      "valid": {"step": 1, "accuracy": 0.4},
    ...      "baselines": {"most_frequent_tag": {"kind": "most frequent tag", "accuracy": 0.6}}}
    >>> r = behind_baseline(s, "tag", RunSettings(steps=1))
    >>> r["line"].split(";")[0]
    'behind baseline: validation accuracy 0.4000 vs 0.6000 for the most frequent tag, after 1 step'
    >>> r["cause"]
    'validation was still improving when the budget (--steps 1) ended'
    """
    found = compare(summary, task)
    if found is None or not found["behind"]:
        return None
    metric, model, base, kind = (found[k] for k in ("metric", "model", "baseline", "kind"))
    still, cause, advice = _diagnose(summary, settings, kind)
    steps = summary.get("steps")
    label = LABELS.get(metric, metric)
    line = (
        f"behind baseline: validation {label} {_figure(model)} vs {_figure(base)} for the {kind}, "
        f"after {steps} step{'' if steps == 1 else 's'}; likely cause: {cause}; try: {advice}"
    )
    return {
        "metric": metric,
        "model": model,
        "baseline": base,
        "baseline_kind": kind,
        "steps": steps,
        "best_step": (summary.get("valid") or {}).get("step"),
        "still_improving": still,
        "cause": cause,
        "advice": advice,
        "line": line,
    }
