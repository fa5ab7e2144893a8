"""The one comparison of a model with its baselines: which metric, which baseline, when it
says "behind" (strictly worse only), and the cause it gives — read from the run itself."""

from __future__ import annotations

import pytest

from rnnkit.training.baseline_check import (
    RunSettings,
    baseline_figures,
    behind_baseline,
    compare,
)


def _summary(task: str, valid: dict, **extra) -> dict:
    return {"task": task, "steps": 100, "stopped": "100 steps done", "valid": valid, **extra}


def test_classify_is_compared_with_its_best_baseline():
    s = _summary(
        "classify",
        {"step": 100, "accuracy": 0.6, "loss_nats": 0.9},
        baselines={
            "majority": {"kind": "majority class (a)", "accuracy": 0.4},
            "bag_of_ngrams": {"kind": "bag of n-grams", "accuracy": 0.7},
        },
    )
    found = compare(s)
    assert found == {
        "metric": "accuracy",
        "model": 0.6,
        "baseline": 0.7,
        "kind": "bag of n-grams",
        "behind": True,
    }
    behind = behind_baseline(s, "classify", RunSettings(steps=100))
    assert behind["baseline_kind"] == "bag of n-grams" and behind["baseline"] == 0.7
    assert behind["line"].startswith(
        "behind baseline: validation accuracy 0.6000 vs 0.7000 for the bag of n-grams, after 100 "
        "steps"
    )


@pytest.mark.parametrize(("model", "behind"), [(0.7, False), (0.71, False), (0.69, True)])
def test_only_strictly_worse_is_behind(model, behind):
    s = _summary(
        "tag",
        {"step": 100, "accuracy": model},
        baselines={"most_frequent_tag": {"kind": "most frequent tag per word", "accuracy": 0.7}},
    )
    assert (behind_baseline(s, "tag", RunSettings()) is not None) is behind


def test_lower_is_better_for_losses_errors_and_mse():
    lm = _summary("lm", {"step": 5, "loss_nats": 2.0, "tokens": 10}, ngram={"order": 5,
                  "loss_nats": 1.5, "tokens": 10})  # fmt: skip
    assert compare(lm)["behind"] is True and compare(lm)["kind"] == "5-gram"
    lm["valid"]["loss_nats"] = 1.4
    assert behind_baseline(lm, "lm", RunSettings()) is None
    reg = _summary("regress", {"step": 1, "mse": 0.5, "loss": 0.5},
                   baselines={"persistence": {"kind": "persistence", "mse": 0.25}})  # fmt: skip
    assert compare(reg)["behind"] is True
    s2s = _summary(
        "seq2seq",
        {"step": 3, "exact_match": 0.9, "character_error_rate": 0.05, "token_error_rate": 0.1},
        baselines={
            "copy": {"kind": "copy", "exact_match": 0.0, "character_error_rate": 0.6},
            "nearest_neighbour": {"kind": "nn", "exact_match": 0.2, "character_error_rate": 0.3},
        },
    )
    assert compare(s2s) == {
        "metric": "character_error_rate",
        "model": 0.05,
        "baseline": 0.3,
        "kind": "nn",
        "behind": False,
    }


def test_bits_per_char_first_and_only_over_the_same_tokens():
    s = _summary(
        "lm",
        {"step": 5, "loss_nats": 2.0, "bits_per_char": 2.885, "tokens": 10},
        ngram={"order": 3, "loss_nats": 1.0, "bits_per_char": 1.443, "tokens": 10},
    )
    assert compare(s)["metric"] == "bits_per_char"
    # --length stop: the model scores no </s> token, the n-gram does: not comparable.
    s["ngram"]["tokens"] = 12
    assert compare(s) is None and behind_baseline(s, "lm", RunSettings()) is None


def test_nothing_to_compare():
    assert compare({"task": "tag", "valid": {"accuracy": 0.5}}) is None
    assert compare({"task": "tag", "valid": None, "baselines": {}}) is None
    assert compare({"task": "other", "valid": {"accuracy": 0.5}}) is None
    assert baseline_figures({"baselines": {"x": "not a dict"}}) == []


def _behind_tag(valid: dict, **extra) -> dict:
    return _summary(
        "tag",
        valid,
        baselines={"most_frequent_tag": {"kind": "most frequent tag per word", "accuracy": 0.9}},
        **extra,
    )


def test_cause_a_budget_ended_while_validation_improved():
    s = _behind_tag({"step": 100, "accuracy": 0.5, "loss_nats": 1.0}, train_loss_nats=1.1)
    r = behind_baseline(s, "tag", RunSettings(epochs=2))
    assert r["still_improving"] is True and r["best_step"] == 100
    assert r["cause"] == "validation was still improving when the budget (--epochs 2) ended"
    assert r["advice"].startswith("train longer: raise --epochs")
    r = behind_baseline(s, "tag", RunSettings(epochs=None, steps=100, max_time=60.0))
    assert "(--steps 100, --max-time 60)" in r["cause"]
    assert "leave --steps / --max-time out of a new run" in r["advice"]


def test_cause_early_stopping_by_falls_too_small_to_count():
    # Every validation was a new best, but none by --min-gain: early stopping, not a budget.
    stopped = "no gain above --min-gain 0.01 for 3 validations (best at step 100)"
    s = _behind_tag({"step": 100, "accuracy": 0.5}, stopped=stopped, stopped_early=True)
    r = behind_baseline(s, "tag", RunSettings(steps=500, lr=0.002, patience=3, min_gain=0.01))
    assert r["still_improving"] is True
    assert r["cause"] == (
        f"validation was still improving, too slowly to count, when training stopped ({stopped})"
    )
    assert r["advice"] == (
        "a larger --lr (now 0.002), or a smaller --min-gain (now 0.01) or a larger --patience "
        "(now 3) to train on through slow gains"
    )


def test_cause_the_default_modes_cap():
    s = _behind_tag({"step": 100, "accuracy": 0.5}, stopped="cap reached: 100 epochs")
    r = behind_baseline(s, "tag", RunSettings(epochs=None, lr=0.002))
    assert r["cause"] == (
        "validation was still improving when training stopped (cap reached: 100 epochs)"
    )
    assert "a larger --lr (now 0.002)" in r["advice"]


def test_cause_overfitting_and_underfitting():
    over = _behind_tag(
        {"step": 40, "accuracy": 0.5, "loss_nats": 1.0},
        train_loss_nats=0.2,
        stopped="no improvement for 10 validations (best at step 40)",
    )
    r = behind_baseline(over, "tag", RunSettings(epochs=None, hidden=256, dropout=0.0))
    assert r["still_improving"] is False
    assert r["cause"] == (
        "validation stopped improving at step 40 of 100 while the training loss went on "
        "falling (0.2 vs 1 on validation): overfitting"
    )
    assert r["advice"].startswith("more --dropout (now 0), a smaller --hidden (now 256)")
    under = _behind_tag({"step": 40, "accuracy": 0.5, "loss_nats": 1.0}, train_loss_nats=0.9)
    r = behind_baseline(under, "tag", RunSettings(epochs=None, hidden=16, layers=1))
    assert r["cause"] == (
        "validation stopped improving at step 40 of 100 (training loss 0.9): the model underfits"
    )
    assert "a larger --hidden (now 16)" in r["advice"] and "--layers 2" in r["advice"]
    assert r["line"].endswith(f"likely cause: {r['cause']}; try: {r['advice']}")
    assert "\n" not in r["line"]


def test_cause_a_model_that_fits_better_than_its_baseline_but_does_not_generalise():
    # training loss 1.25 nats under the 5-gram's 1.62 on validation, the model's own
    # validation loss 1.81: not underfitting (the ratio rule alone would say so)
    s = {
        "task": "lm",
        "steps": 1310,
        "stopped": "no improvement for 20 validations (best at step 1210)",
        "train_loss_nats": 1.25,
        "valid": {"step": 1210, "loss_nats": 1.81, "bits_per_char": 2.61, "tokens": 500},
        "ngram": {"order": 5, "loss_nats": 1.62, "bits_per_char": 2.33, "tokens": 500},
    }
    r = behind_baseline(s, "lm", RunSettings(epochs=None, hidden=128, dropout=0.3))
    assert r["cause"] == (
        "validation stopped improving at step 1210 of 1310; the training loss (1.25) is "
        "below the 5-gram's validation loss (1.62) but the model's validation loss is 1.81: "
        "it does not generalise from this data (overfitting)"
    )
    assert r["advice"].startswith("more --dropout (now 0.3), a smaller --hidden (now 128)")
    # a training loss above the baseline's validation loss: the ratio rule decides
    s["train_loss_nats"] = 1.7
    r = behind_baseline(s, "lm", RunSettings(epochs=None, hidden=128, layers=2))
    assert r["cause"].endswith("(training loss 1.7): the model underfits")


def _course(train_best: float, train_end: float, valid_best: float, valid_last: float) -> dict:
    return {
        "train_loss_at_best": train_best,
        "train_loss_end": train_end,
        "valid_loss_best": valid_best,
        "valid_loss_last": valid_last,
    }


def _behind_words(best: int, steps: int, course: dict | None, **valid) -> dict:
    """A word classifier behind its bag of n-grams whose validation peaked at ``best``."""
    s = {
        "task": "classify",
        "steps": steps,
        "stopped": f"no improvement for 20 validations (best at step {best})",
        "train_loss_nats": 0.846,
        "valid": {"step": best, "accuracy": 0.3219, "loss_nats": 1.564, **valid},
        "baselines": {"bag_of_ngrams": {"kind": "bag of n-grams", "accuracy": 0.4117}},
    }
    if course is not None:
        s["trajectory"] = {"best_step": best, "last_valid_step": steps, **course}
    return s


def test_a_training_loss_that_went_on_falling_after_the_best_step_is_overfitting():
    # The word classifier on the stdlib lines (--dropout 0.3 --bidirectional --pooling max):
    # training loss 0.846 at the end against 1.564 on validation is not under half of it,
    # which alone read as underfitting; its course says otherwise: smoothed, the training
    # loss fell from 1.119 to 0.837 after step 1056 while validation rose to 1.980.
    s = _behind_words(1056, 1696, _course(1.119, 0.837, 1.564, 1.980))
    r = behind_baseline(s, "classify", RunSettings(epochs=None, hidden=256, dropout=0.3))
    assert r["still_improving"] is False and r["best_step"] == 1056
    assert r["cause"] == (
        "validation stopped improving at step 1056 of 1696; the training loss fell from 1.12 "
        "to 0.837 after the best step while validation rose from 1.56 to 1.98: overfitting"
    )
    assert r["advice"] == (
        "more --dropout (now 0.3), a smaller --hidden (now 256) or more training data"
    )
    assert "underfit" not in r["line"]
    # the same summary without its course: the final figures alone (summaries of old runs)
    del s["trajectory"]
    r = behind_baseline(s, "classify", RunSettings(epochs=None))
    assert r["cause"].endswith("(training loss 0.846): the model underfits")


def test_a_fall_just_past_the_threshold_is_overfitting_and_one_short_of_it_is_not():
    over = _behind_words(100, 200, _course(1.0, 0.95, 1.2, 1.25))  # fell by 5 %
    assert behind_baseline(over, "classify", RunSettings())["cause"].endswith(
        "the training loss fell from 1 to 0.95 after the best step while validation rose "
        "from 1.2 to 1.25: overfitting"
    )
    flat = _behind_words(100, 200, _course(1.0, 0.96, 1.2, 1.25))  # fell by 4 %
    assert behind_baseline(flat, "classify", RunSettings())["cause"].endswith(
        "the training loss stayed near 1 after the best step (0.96 at the end) while "
        "validation rose from 1.2 to 1.25: the model underfits"
    )


def test_a_fall_within_the_noise_of_the_records_is_not_overfitting():
    # 10 % lower, but the records scatter so that the change has a standard error of 0.06:
    # under two of them, the noise could have made it
    noisy = _behind_words(100, 200, {**_course(1.0, 0.9, 1.2, 1.25), "train_loss_change_se": 0.06})
    assert behind_baseline(noisy, "classify", RunSettings())["cause"].endswith(
        "the training loss stayed near 1 after the best step (0.9 at the end) while "
        "validation rose from 1.2 to 1.25: the model underfits"
    )
    noisy["trajectory"]["train_loss_change_se"] = 0.04  # 0.1 is 2.5 standard errors
    assert behind_baseline(noisy, "classify", RunSettings())["cause"].endswith(": overfitting")
    # a rise within the noise is no instability either
    noisy["trajectory"].update(train_loss_end=1.1, train_loss_change_se=0.06)
    assert "underfits" in behind_baseline(noisy, "classify", RunSettings())["cause"]


def test_a_flat_training_loss_near_the_validation_loss_is_underfitting():
    s = _behind_words(120, 400, _course(1.31, 1.30, 1.29, 1.2904))
    r = behind_baseline(s, "classify", RunSettings(epochs=None, hidden=32, lr=0.002, layers=1))
    assert r["cause"] == (
        "validation stopped improving at step 120 of 400; the training loss stayed near 1.31 "
        "after the best step (1.3 at the end) while validation stayed at 1.29: the model "
        "underfits"
    )
    assert r["advice"] == (
        "a larger --hidden (now 32), another --lr (now 0.002; try a third and three times "
        "it) or --layers 2"
    )


def test_a_flat_training_loss_far_under_the_validation_loss_is_overfitting():
    # the model fit its training data before validation peaked: flat, but far below
    s = _behind_words(300, 400, _course(0.2, 0.2, 1.0, 1.1))
    r = behind_baseline(s, "classify", RunSettings(hidden=512, dropout=0.1))
    assert r["cause"] == (
        "validation stopped improving at step 300 of 400; the training loss (0.2 at the "
        "end) is under half the validation loss (1): overfitting"
    )
    assert r["advice"].startswith("more --dropout (now 0.1), a smaller --hidden (now 512)")


def test_a_flat_training_loss_under_the_baselines_validation_loss_is_overfitting():
    s = {
        "task": "lm",
        "steps": 1310,
        "train_loss_nats": 1.3,
        "valid": {"step": 1210, "loss_nats": 1.81, "bits_per_char": 2.61, "tokens": 500},
        "ngram": {"order": 5, "loss_nats": 1.62, "bits_per_char": 2.33, "tokens": 500},
        "trajectory": _course(1.26, 1.25, 1.81, 1.83),
    }
    r = behind_baseline(s, "lm", RunSettings(epochs=None))
    assert r["cause"] == (
        "validation stopped improving at step 1210 of 1310; the training loss (1.25) is "
        "below the 5-gram's validation loss (1.62) but the model's validation loss is "
        "1.81: it does not generalise from this data (overfitting)"
    )


def test_a_training_loss_that_rose_after_the_best_step_asks_for_a_smaller_rate():
    s = _behind_words(50, 400, _course(1.0, 1.3, 1.2, 1.6))
    r = behind_baseline(s, "classify", RunSettings(lr=0.03))
    assert r["cause"].endswith(
        "the training loss rose from 1 to 1.3 after the best step while validation rose "
        "from 1.2 to 1.6: the optimisation is unstable"
    )
    assert r["advice"] == "a smaller --lr (now 0.03; try a third of it)"


def test_the_still_improving_branch_is_kept_whatever_the_course():
    s = _behind_words(1696, 1696, _course(1.2, 0.5, 1.5, 1.5))
    r = behind_baseline(s, "classify", RunSettings(epochs=None, steps=1696))
    assert r["still_improving"] is True
    assert r["cause"] == "validation was still improving when the budget (--steps 1696) ended"


def test_one_validation_at_the_end_of_the_budget_claims_no_trend():
    """A --max-time run on a large corpus validated once, at its end: "validation was
    still improving" was read from that one figure."""
    s = _behind_words(1317, 1317, {**_course(1.2, 1.2, 1.5, 1.5), "valids": 1})
    r = behind_baseline(s, "classify", RunSettings(epochs=None, max_time=240.0))
    assert r["still_improving"] is True
    assert r["cause"] == (
        "the budget (--max-time 240) ended with the run's only validation, too soon to tell "
        "whether validation had stopped improving"
    )
    assert r["advice"].startswith("train longer: raise --max-time")


@pytest.mark.parametrize(
    "course",
    [None, "x", {"train_loss_at_best": 1.1}, _course(1.1, "0.8", 1.5, 1.9), _course(1.1, -1, 1, 2)],
)
def test_an_incomplete_course_falls_back_to_the_final_figures(course):
    s = _behind_words(1056, 1696, None)
    s["trajectory"] = course
    r = behind_baseline(s, "classify", RunSettings())
    assert r["cause"] == (
        "validation stopped improving at step 1056 of 1696 (training loss 0.846): the model "
        "underfits"
    )


def _ended_by_time(after: int, every: int | None, **extra) -> dict:
    """A character model behind its 5-gram: validations every ``every`` steps improved up
    to step 950, then a 90-second budget ended the run at step 984 (its closing
    validation slightly worse); ``after`` validations came after the best."""
    course = {**_course(1.369, 1.368, 1.616, 1.631), "train_loss_change_se": 0.02}
    course.update(best_step=950, last_valid_step=984, valids_after_best=after, valid_every=every)
    return {
        "task": "lm",
        "steps": 984,
        "stopped": "time budget of 90 s reached",
        "train_loss_nats": 1.37,
        "valid": {"step": 950, "bits_per_char": 2.332, "loss_nats": 1.616, "tokens": 43136},
        "ngram": {"order": 5, "bits_per_char": 2.163, "loss_nats": 1.499, "tokens": 43136},
        "trajectory": course,
        **extra,
    }


def test_a_closing_validation_sooner_than_the_regular_ones_cannot_tell_a_stop():
    # The run's only validation after its best came 34 steps on, against every 190 before:
    # validation had improved at every regular check, so the budget cut a run still
    # improving (not "overfitting", which the training loss under the 5-gram's would say).
    r = behind_baseline(_ended_by_time(1, 190), "lm", RunSettings(epochs=None, max_time=90.0))
    assert r["still_improving"] is True and r["best_step"] == 950
    assert r["cause"] == (
        "validation was still improving when the budget (--max-time 90) ended (its best at "
        "step 950; the one validation after it, 34 steps later at the end, came too soon to "
        "tell it had stopped)"
    )
    assert r["advice"].startswith("train longer: raise --max-time")
    # the default mode's cap, the same
    s = _ended_by_time(1, 190, stopped="cap reached: 100 epochs")
    r = behind_baseline(s, "lm", RunSettings(epochs=None))
    assert r["still_improving"] is True
    assert r["cause"].startswith("validation was still improving when training stopped (cap")


@pytest.mark.parametrize(
    "after, every",
    [(1, 34), (1, 20), (2, 190), (1, None)],
    ids=["a-regular-gap", "a-longer-gap", "two-after", "no-usual-gap"],
)
def test_a_validation_after_the_best_at_a_regular_gap_or_more_is_a_stop(after, every):
    r = behind_baseline(_ended_by_time(after, every), "lm", RunSettings(max_time=90.0))
    assert r["still_improving"] is False
    assert r["cause"].startswith("validation stopped improving at step 950 of 984; ")
    assert "overfitting" in r["cause"]


def test_early_stopping_is_a_stop_whatever_the_gap():
    s = _ended_by_time(1, 190, stopped="no improvement for 1 validation", stopped_early=True)
    r = behind_baseline(s, "lm", RunSettings(patience=1))
    assert r["still_improving"] is False


def test_a_validation_loss_that_rose_clearly_over_a_flat_training_loss_is_overfitting():
    # A classifier of source lines by language (python, c, perl) with the default options:
    # the training loss fell 19 % after the best step, within the noise of its records,
    # while validation rose 48 % (0.151 to 0.223): it was called underfitting.
    course = {**_course(0.118, 0.0956, 0.151, 0.223), "train_loss_change_se": 0.0125}
    s = _behind_words(828, 1288, course)
    r = behind_baseline(s, "classify", RunSettings(epochs=None, hidden=256, dropout=0.0))
    assert r["cause"] == (
        "validation stopped improving at step 828 of 1288; validation rose from 0.151 to "
        "0.223 after the best step while the training loss did not rise (0.118, then "
        "0.0956 at the end): overfitting"
    )
    assert r["advice"].startswith("more --dropout (now 0), a smaller --hidden (now 256)")
    # just under a tenth above its best: within what the other signs decide
    s["trajectory"]["valid_loss_last"] = 0.166
    assert behind_baseline(s, "classify", RunSettings())["cause"].endswith("underfits")
    s["trajectory"]["valid_loss_last"] = 0.167  # 10.6 % above
    assert behind_baseline(s, "classify", RunSettings())["cause"].endswith(": overfitting")
    # a training loss that rose clearly too: the optimisation, not the fit
    s["trajectory"].update(train_loss_end=0.2, valid_loss_last=0.223)
    assert behind_baseline(s, "classify", RunSettings())["cause"].endswith("unstable")


def _events_behind(unknown: int, **extra) -> dict:
    """An events model behind its 5-gram on sessions of dpkg.log (one a package): 48 of
    the 286 validation events were templates no training session held."""
    return {
        "task": "events",
        "steps": 442,
        "stopped": "no improvement for 50 validations (best at step 342)",
        "train_loss_nats": 0.668,
        "valid": {"step": 342, "loss_nats": 2.668, "tokens": 286},
        "ngram": {"order": 5, "loss_nats": 2.006, "tokens": 286},
        "unknown_valid_events": unknown,
        "trajectory": {**_course(0.70, 0.633, 2.668, 2.729), "train_loss_change_se": 0.01},
        **extra,
    }


def test_validation_events_unknown_to_the_vocabulary_are_the_cause_said():
    r = behind_baseline(_events_behind(48), "events", RunSettings(epochs=None))
    assert r["still_improving"] is False
    assert r["cause"] == (
        "48 of the 286 validation events (16.8 %) are unknown to the vocabulary (never seen "
        "in training); with --min-freq 1 no training event was the unknown symbol, so the "
        "model learnt to give it almost no probability, where the 5-gram keeps some for the "
        "unseen"
    )
    assert r["advice"].startswith("--min-freq 2 (the events seen once in training")
    # a language model's tokens, the same
    s = {**_events_behind(0), "task": "lm", "unknown_valid_tokens": 10}
    del s["unknown_valid_events"]
    r = behind_baseline(s, "lm", RunSettings(epochs=None))
    assert r["cause"].startswith("10 of the 286 validation tokens (3.5 %) are unknown")
    # under 1 % of them, or a vocabulary that made rare training tokens unknown already:
    # the run's course decides
    for summary, settings in [
        (_events_behind(2), RunSettings()),
        (_events_behind(48), RunSettings(min_freq=2)),
    ]:
        cause = behind_baseline(summary, "events", settings)["cause"]
        assert "unknown to the vocabulary" not in cause and "overfitting" in cause


def _behind_walks(course: dict) -> dict:
    """A forecaster of random walks (two tanh units, ``--lr 0.1``) behind persistence."""
    return {
        "task": "regress",
        "steps": 300,
        "stopped": "no improvement for 5 validations (best at step 290)",
        "train_loss_nats": course["train_loss_end"],
        "valid": {"step": 290, "mse": 24.38, "loss": 24.38},
        "baselines": {
            "persistence": {"kind": "persistence forecast (the last value)", "mse": 1.03}
        },
        "trajectory": {"best_step": 290, "last_valid_step": 300, **course},
    }


def test_a_training_loss_far_above_the_baselines_validation_loss_is_underfitting():
    # The validation loss rose 12 % after the best step over a flat training loss — the
    # sign of overfitting — but the training loss (16) was 15 times persistence's
    # validation loss (1.03): the model had not fitted even its training data.
    s = _behind_walks(_course(16.0, 16.0, 24.4, 27.3))
    r = behind_baseline(s, "regress", RunSettings(epochs=30, hidden=2, lr=0.1))
    assert r["cause"] == (
        "validation stopped improving at step 290 of 300; the training loss (16 at the end) "
        "is over 2 times the persistence forecast (the last value)'s validation loss (1.03) "
        "while validation rose from 24.4 to 27.3: the model underfits"
    )
    assert r["advice"].startswith("a larger --hidden (now 2)")
    # under twice the baseline's loss, the rise decides as before
    s = _behind_walks(_course(2.0, 2.0, 24.4, 27.3))
    assert behind_baseline(s, "regress", RunSettings())["cause"].endswith(": overfitting")
    # a training loss below persistence's validation loss, in the same unit (mse)
    s = _behind_walks(_course(1.0, 1.0, 1.9, 1.92))
    assert (
        "below the persistence forecast (the last value)'s validation loss (1.03)"
        in (behind_baseline(s, "regress", RunSettings())["cause"])
    )


def test_a_gaussian_likelihood_is_not_compared_with_a_squared_error():
    """``regress --loss gaussian`` trains on a negative log-likelihood in nats; the
    persistence baseline has a mean squared error only: a training NLL of 0.7 against a
    baseline mse of 0.25 read as "over 2 times the baseline's loss: underfits"."""
    s = {
        **_behind_walks(_course(0.70, 0.70, 0.75, 0.85)),
        "loss": "gaussian",
        "baselines": {
            "persistence": {"kind": "persistence forecast (the last value)", "mse": 0.25}
        },
    }
    r = behind_baseline(s, "regress", RunSettings())
    assert r["cause"].endswith("after the best step while the training loss did not rise "
                               "(0.7, then 0.7 at the end): overfitting")  # fmt: skip
