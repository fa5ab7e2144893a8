"""Soak test: train and score for a long time; memory must not grow.

Marked ``soak``: ``make test`` / plain ``pytest`` skip it (``-m "not soak"`` in the
pytest options). Run it on its own::

    RNNKIT_SOAK_SECONDS=600 nice -n 19 .venv/bin/python -m pytest -m soak tests/soak -s

What runs, in ONE ``Trainer.fit()`` (as a long real run does): a 2-layer LSTM language
model trained on an event stream with validation and a resumable snapshot (fsync'ed
safetensors + JSON) every ``EVAL_EVERY`` steps; every ``SCORE_EVERY`` steps, from the
trainer's per-step hook, a scoring round with a trained ``events`` run: a batch of
sessions through ``score_sessions`` (what ``rnnkit score`` does) and the same number of
sessions fed event by event to a ``StreamScorer`` (``rnnkit score --follow``), each
closed by its end.

What is measured: the resident set size (``/proc/self/statm``) after every training step.
The first half of the run is warm-up (allocator pools, the compiled loop, page cache of
the snapshot files settle); over the second half a least-squares line is fitted to
RSS against the step number, and its slope must stay under ``RNNKIT_SOAK_MAX_SLOPE``
bytes per step (default 256). A leak of one small tensor per step — the (B, H) float32
carried state of this model, 8 × 32 × 4 = 1 KiB — is 4 times that; allocator noise over
thousands of steps is far below it (see docs/reliability.md for the measured figures).
The figures are printed (``-s`` shows them) and written to ``$RNNKIT_SOAK_REPORT`` when set.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.anomaly.stream_format import StreamItem
from rnnkit.anomaly.streaming import StreamScorer
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks import events as ev
from rnnkit.data.batching import StreamBatcher
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec
from rnnkit.training.loop import Trainer, TrainOptions

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("RNNKIT_SOAK_SECONDS", "180"))
MAX_SLOPE = float(os.environ.get("RNNKIT_SOAK_MAX_SLOPE", "256"))  # bytes per step
PRECISION = os.environ.get("RNNKIT_SOAK_PRECISION", "fp32")
EVAL_EVERY = 200
SCORE_EVERY = 20
SESSIONS_PER_ROUND = 16
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size now (``/proc/self/statm``, field 2, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * _PAGE


def rss_parts() -> dict[str, int]:
    """``RssAnon`` / ``RssFile`` of ``/proc/self/status`` in bytes (heap vs mapped files)."""
    parts = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                parts[key] = int(value.split()[0]) * 1024
    return parts


def slope_per_step(steps: np.ndarray, rss: np.ndarray) -> float:
    """Least-squares slope of ``rss`` against ``steps`` (bytes per step).

    >>> slope_per_step(np.arange(4.0), np.array([10.0, 12.0, 14.0, 16.0]))
    2.0
    """
    x = steps - steps.mean()
    return float((x * (rss - rss.mean())).sum() / (x * x).sum())


def _events_run(tmp: Path) -> ev.EventsModel:
    """A small trained ``events`` run to score with (setup, not measured)."""
    train_path, valid_path = tmp / "train.jsonl", tmp / "valid.jsonl"
    write_sessions(train_path, generate_sessions(150, anomalies=6, seed=1))
    write_sessions(valid_path, generate_sessions(80, anomalies=8, seed=2, prefix="v"))
    cfg = TrainConfig(
        task="events",
        train=str(train_path),
        valid=str(valid_path),
        out=str(tmp / "events-run"),
        hidden=32,
        embedding=16,
        epochs=2,
        batch_size=16,
        lr=1e-2,
        bptt="full",
        ngram_order=3,
        target_fpr=0.05,
        top_g=3,
    ).validate()
    ev.train(cfg, quiet=True)
    return ev.load_events(cfg.out)


def test_training_and_scoring_for_a_long_time_do_not_grow_memory(tmp_path):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    run = _events_run(tmp_path)
    # The training stream: the events of many sessions, one after another.
    sessions = generate_sessions(2000, seed=3, prefix="t")
    ids = np.concatenate([run.vocab.encode_events(s.events)[0] for s in sessions])
    spec = ModelSpec(hidden=32, embedding=16, layers=2, dropout=0.1)
    model = build_language_model(spec, len(run.vocab))
    valid = StreamBatcher(ids[:2000], 8, 32)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        nats = tokens = 0.0
        with torch.no_grad():
            for batch in valid:
                out = m.loss(batch.inputs, batch.targets, starts=batch.starts)
                nats, tokens = nats + out.nats, tokens + out.tokens
        return {"loss_nats": nats / tokens}

    score_pool = generate_sessions(400, anomalies=20, seed=4, prefix="p")
    scorer = StreamScorer(run.model, run.vocab, threshold=1e9, max_sessions=64, idle_timeout=None)
    # Preallocated: appending Python ints to lists would itself grow ~80 bytes a step.
    capacity = int(SECONDS * 2000) + 10_000
    steps, rss = np.zeros(capacity, dtype=np.int64), np.zeros(capacity, dtype=np.int64)
    n = 0
    parts_half: dict[str, int] = {}
    started = time.perf_counter()
    counts = {"rounds": 0, "scored": 0, "streamed_events": 0, "verdicts": 0}

    def per_step(m: torch.nn.Module, grad_norm: float, clipped: bool) -> None:
        nonlocal n
        step = trainer.step + 1  # the step in flight
        if step % SCORE_EVERY == 0:
            r = counts["rounds"]
            lo = (r * SESSIONS_PER_ROUND) % len(score_pool)
            chunk = score_pool[lo : lo + SESSIONS_PER_ROUND]
            counts["scored"] += sum(1 for _ in ev.score_sessions(run, chunk, batch_size=8))
            items = [  # fresh session ids every round: sessions open, stream and close
                StreamItem(f"r{r}-{s.session}", tuple(s.events), end=True) for s in chunk
            ]
            counts["verdicts"] += len(scorer.feed(items))
            counts["streamed_events"] += sum(len(s.events) for s in chunk)
            counts["rounds"] += 1
        if n < capacity:
            steps[n], rss[n] = step, rss_bytes()
            n += 1
            if not parts_half and time.perf_counter() - started >= SECONDS / 2:
                parts_half.update(rss_parts())

    trainer = Trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=3e-3),
        StreamBatcher(ids[2000:], 8, 32),
        lambda m, b, c: m.loss(b.inputs, b.targets, state=c, starts=b.starts),
        TrainOptions(
            steps=10**9,
            max_time=SECONDS,
            clip_norm=1.0,
            eval_every=EVAL_EVERY,
            quiet=True,
            precision=PRECISION,
        ),
        evaluate_fn=evaluate,
        out_dir=tmp_path / "soak-run",
        grad_hook=per_step,
    )
    gc.collect()
    result = trainer.fit()
    elapsed = time.perf_counter() - started

    assert n >= 400, f"only {n} steps in {SECONDS} s: too short to measure a slope"
    half = n // 2
    slope = slope_per_step(steps[half:n].astype(float), rss[half:n].astype(float))
    mib = 1 / 2**20
    figures = {
        "seconds": round(elapsed, 1),
        "precision": PRECISION,
        "steps": result.steps,
        "scoring_rounds": counts["rounds"],
        "sessions_scored_batch": counts["scored"],
        "sessions_streamed": counts["verdicts"],
        "events_streamed": counts["streamed_events"],
        "snapshots_written": result.steps // EVAL_EVERY,
        "rss_start_mib": round(rss[0] * mib, 1),
        "rss_half_mib": round(rss[half] * mib, 1),
        "rss_end_mib": round(rss[n - 1] * mib, 1),
        "rss_anon_file_mib_mid": {k: round(v * mib, 1) for k, v in parts_half.items()},
        "rss_anon_file_mib_end": {k: round(v * mib, 1) for k, v in rss_parts().items()},
        "rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "slope_bytes_per_step": round(slope, 2),
        "max_slope_bytes_per_step": MAX_SLOPE,
        "final_train_loss_nats": result.train_loss_nats,
    }
    print("\nsoak:", json.dumps(figures))
    if os.environ.get("RNNKIT_SOAK_REPORT"):  # with the RSS curve, 40 points
        at = np.linspace(0, n - 1, 40).astype(int)
        trace = [[int(steps[i]), round(rss[i] * mib, 2)] for i in at]
        report = json.dumps({**figures, "trace_step_rss_mib": trace}, indent=2)
        Path(os.environ["RNNKIT_SOAK_REPORT"]).write_text(report + "\n")
    assert counts["scored"] == counts["verdicts"] > 0  # every streamed session closed
    assert scorer.open_sessions == 0
    assert result.train_loss_nats is not None and np.isfinite(result.train_loss_nats)
    assert slope < MAX_SLOPE, f"memory grows {slope:.0f} bytes/step over the second half"
