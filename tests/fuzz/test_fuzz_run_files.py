"""Fuzz the files of a run directory that a run writes as it goes and a reader trusts
later: ``summary.json``, ``metrics.jsonl``, ``thresholds.json``, ``labels.json`` (on
resume) and a snapshot's ``state.json`` (with its checksums recomputed, as a forger
would). The rule is the readers' own: a result, or one line naming the file; and what is
accepted must be usable (the report's metrics table is built from it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fuzzkit import FUZZ, outcome, write
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_json import _mutated, json_docs, json_values

from rnnkit.app.config import TrainConfig
from rnnkit.app.report.page import Run, metrics_section
from rnnkit.app.tasks.events import read_thresholds
from rnnkit.app.tasks.run_config import check_labels
from rnnkit.data.labelled import LabelSet
from rnnkit.errors import RnnkitError
from rnnkit.training.checkpoint import load_snapshot, save_snapshot
from rnnkit.training.run_files import read_metrics, read_summary

_SUMMARY = {
    "task": "lm",
    "steps": 6,
    "epoch": 1,
    "elapsed_s": 1.5,
    "tokens_per_s": 1000.0,
    "parameters": 1234,
    "train_loss_nats": 2.5,
    "valid": {"loss_nats": 2.0, "perplexity": 7.4, "bits_per_char": 2.9, "step": 6},
    "ngram": {"order": 3, "loss_nats": 2.2, "perplexity": 9.0},
}
_EVENT = {"event": "valid", "step": 4, "epoch": 0, "loss_nats": 2.1, "best": True}


def _run(tmp: Path, summary: dict[str, Any], events: list[dict[str, Any]]) -> Run:
    return Run(tmp, TrainConfig(train="t.txt"), {}, summary, events)


@FUZZ
@given(data=st.one_of(json_docs(_SUMMARY), json_docs(_SUMMARY["valid"]).map(
    lambda b: b'{"valid": ' + b + b"}"
)))  # fmt: skip
def test_summary_json_reads_or_names_the_file_and_what_it_accepts_renders(
    tmp_path: Path, data: bytes
):
    path = write(tmp_path, "summary.json", data)
    result = outcome(lambda: read_summary(tmp_path), names=path)
    if not isinstance(result, RnnkitError):
        assert isinstance(result, dict)
        outcome(lambda: metrics_section(_run(tmp_path, result, [])), names=None)


_event_lines = st.lists(
    st.one_of(
        json_docs(_EVENT).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ")),
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
        st.just(json.dumps(_EVENT).encode()),
    ),
    max_size=8,
).map(b"\n".join)


@FUZZ
@given(data=_event_lines)
def test_metrics_jsonl_lines_are_read_or_skipped_and_counted(tmp_path: Path, data: bytes):
    write(tmp_path, "metrics.jsonl", data)
    events, bad = outcome(lambda: read_metrics(tmp_path), names=None)
    lines = [line for line in data.splitlines() if line.strip()]
    assert len(events) + bad == len(lines)
    outcome(lambda: metrics_section(_run(tmp_path, {}, events)), names=None)


_THRESHOLDS_V2 = {
    "format": "rnnkit.anomaly.thresholds",
    "version": 2,
    "target_fpr": 0.01,
    "top_g": 3,
    "score": "max",
    "window": None,
    "method": "quantile",
    "rnn": {s: 1.0 for s in ("max", "mean", "count", "end", "norm", "combined")},
    "ngram": {s: 1.0 for s in ("max", "mean", "count", "end", "norm", "combined")},
}


@FUZZ
@given(
    data=st.one_of(
        json_docs(_THRESHOLDS_V2),
        st.sampled_from(["NaN", "Infinity", "-1e999"]).map(
            lambda v: json.dumps(_THRESHOLDS_V2).replace("1.0", v, 1).encode()
        ),
    )
)
def test_thresholds_json_reads_or_names_the_file_and_is_finite(tmp_path: Path, data: bytes):
    import math

    path = write(tmp_path, "thresholds.json", data)
    result = outcome(lambda: read_thresholds(tmp_path), names=path)
    if not isinstance(result, RnnkitError):
        for model in ("rnn", "ngram"):
            assert all(math.isfinite(v) for v in result[model].values())


@FUZZ
@given(data=json_docs(LabelSet(["neg", "pos"]).to_dict()))
def test_labels_json_on_resume_matches_the_data_or_names_the_file(tmp_path: Path, data: bytes):
    path = write(tmp_path, "labels.json", data)
    found = LabelSet(["neg", "pos"])  # what the (unchanged) training data holds

    def resume() -> None:
        try:
            saved = LabelSet.load(path)
        except RnnkitError as exc:  # the task turns a bad file into this one line
            raise type(exc)(str(exc)) from None
        check_labels(tmp_path, saved, found, "train.tsv")
        assert saved.labels == found.labels

    outcome(resume, names=path)


@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("snap")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_snapshot(out, 1, model, opt, {"batches": {"position": 0}, "best": None})
    return out


def _state_docs(valid: dict[str, Any]) -> st.SearchStrategy[str]:
    optimizer = valid["optimizer"]
    group = optimizer["param_groups"][0]
    in_group = _mutated(group).map(
        lambda g: json.dumps({**valid, "optimizer": {**optimizer, "param_groups": ["@"]}}).replace(
            '"@"', g
        )
    )
    in_state = st.tuples(st.sampled_from(sorted(optimizer["state"])), json_values).map(
        lambda t: json.dumps({**valid, "optimizer": {**optimizer, "state": {t[0]: {"step": t[1]}}}})
    )
    return st.one_of(_mutated(valid), in_group, in_state)


@FUZZ
@given(data=st.data())
def test_forged_state_json_with_its_checksum_loads_or_names_the_snapshot(
    snapshot_dir: Path, data: st.DataObject
):
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(snapshot_dir, out)
        pointer = json.loads((out / "latest.json").read_text())
        state_path = out / pointer["snapshot"] / "state.json"
        valid = json.loads(state_path.read_text())
        text = data.draw(_state_docs(valid))
        state_path.write_text(text)
        pointer["state_sha256"] = hashlib.sha256(state_path.read_bytes()).hexdigest()
        (out / "latest.json").write_text(json.dumps(pointer))
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        result = outcome(lambda: load_snapshot(out, model, opt), names=out)
        if not isinstance(result, RnnkitError):
            # What was accepted can be trained on: one more step stays finite.
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
