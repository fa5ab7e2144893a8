"""Fuzz every JSON reader: event sessions (JSON lines), the streaming line format, and the
files of a run directory (config.json, vocab.json, labels.json, latest.json,
thresholds.json).

Inputs are random bytes, random JSON of every type, valid documents with one value
replaced by random JSON, deep nesting (``[`` x 100,000), and numbers such as ``1e999``,
``NaN`` or a 5,000-digit integer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fuzzkit import FUZZ, any_text, file_bytes, outcome, write
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.anomaly.stream_format import StreamItem, parse_stream_line
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events import EventVocabulary, read_thresholds
from rnnkit.app.tasks.run_config import load_config, save_config
from rnnkit.data.events import Session, read_sessions
from rnnkit.data.labelled import LabelSet
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import RnnkitError
from rnnkit.training.checkpoint import FORMAT_VERSION, load_snapshot, read_json

# Numbers Python's json reads but no format expects: inf, nan, huge ints; and raw
# literals that are not JSON at all.
_ODD_NUMBERS = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1" * 5000, "-0", "1e-999"]

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def deep(draw: st.DrawFn) -> str:
    """``[[[...`` / ``{"a":{"a":...`` nested up to 100,000 levels, closed or not."""
    depth = draw(st.sampled_from([10, 63, 64, 65, 200, 1000, 5000, 100_000]))
    opener = draw(st.sampled_from(["[", '{"a":', '{"events":']))
    closer = "]" if opener == "[" else "}"
    closed = draw(st.booleans())
    return opener * depth + "1" + (closer * depth if closed else "")


def _mutated(valid: dict[str, Any]) -> st.SearchStrategy[str]:
    """``valid`` with one key's value replaced (or the key dropped / a key added)."""
    keys = sorted(valid)

    def apply(t: tuple[str, Any, int]) -> str:
        key, value, how = t
        doc = dict(valid)
        if how == 0:
            doc[key] = value
        elif how == 1:
            doc.pop(key, None)
        else:
            doc[key + "x"] = value
        return json.dumps(doc)

    mutation = st.tuples(st.sampled_from(keys), json_values, st.integers(0, 2)).map(apply)
    raw = st.tuples(st.sampled_from(keys), st.sampled_from([*_ODD_NUMBERS, "[" * 3000])).map(
        lambda t: json.dumps({**valid, t[0]: None}).replace("null", t[1], 1)
    )
    return st.one_of(mutation, raw)


def json_docs(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    text = st.one_of(
        json_values.map(json.dumps), deep(), st.sampled_from(_ODD_NUMBERS), _mutated(valid)
    )
    return file_bytes(text)


# ---- JSON lines: event sessions and the streaming format -------------------------------

_SESSION = {"session": "s1", "events": ["open:ok", "read:ok"], "label": 0}
session_lines = st.lists(
    st.one_of(json_docs(_SESSION).map(lambda b: b.replace(b"\n", b" ")), st.just(b"")),
    max_size=6,
).map(b"\n".join)


@FUZZ
@given(data=session_lines)
def test_event_sessions_read_or_name_file_and_line(tmp_path: Path, data: bytes):
    path = write(tmp_path, "sessions.jsonl", data)
    result = outcome(lambda: read_sessions(path), names=path)
    if isinstance(result, RnnkitError):
        return
    assert result and all(isinstance(s, Session) and s.events for s in result)
    assert all(s.label in (None, 0, 1) for s in result)


_STREAM = {"session": "s1", "event": "open:ok", "end": True}


@FUZZ
@given(line=st.one_of(json_docs(_STREAM), json_docs(_SESSION)))
def test_stream_line_parses_or_names_file_and_line(line: bytes):
    result = outcome(lambda: parse_stream_line(line, "stdin", 7), names="stdin:7")
    assert isinstance(result, (StreamItem, RnnkitError))


# ---- the JSON files of a run directory -------------------------------------------------

_VOCAB = json.loads(Vocabulary(["a", "b"]).to_json())
_EVENT_VOCAB = json.loads(EventVocabulary(["open:ok", "a b"]).to_json())
_LABELS = LabelSet(["neg", "pos"]).to_dict()


@FUZZ
@given(data=st.one_of(json_docs(_VOCAB), json_docs(_EVENT_VOCAB)))
def test_vocabulary_json_loads_or_names_the_file(tmp_path: Path, data: bytes):
    path = write(tmp_path, "vocab.json", data)
    for cls in (Vocabulary, EventVocabulary):
        result = outcome(lambda cls=cls: cls.load(path), names=path)
        assert isinstance(result, (cls, RnnkitError))


@FUZZ
@given(data=json_docs(_LABELS))
def test_label_set_json_loads_or_names_the_file(tmp_path: Path, data: bytes):
    path = write(tmp_path, "labels.json", data)
    result = outcome(lambda: LabelSet.load(path), names=path)
    assert isinstance(result, (LabelSet, RnnkitError))


def _config_doc(tmp: Path) -> dict[str, Any]:
    save_config(tmp, TrainConfig(train="t.txt", out=str(tmp)))
    return json.loads((tmp / "config.json").read_text())


@FUZZ
@given(data=st.data())
def test_config_json_loads_or_names_the_file(tmp_path: Path, data: st.DataObject):
    valid = _config_doc(tmp_path)
    # Mutate the inner config too: that is where the types are checked.
    inner = data.draw(_mutated(valid["config"]))
    doc = data.draw(
        st.one_of(
            json_docs(valid),
            st.just(json.dumps({**valid, "config": "@"}).replace('"@"', inner).encode()),
        )
    )
    path = write(tmp_path, "config.json", doc)
    result = outcome(lambda: load_config(tmp_path, verify=False), names=path)  # the parser
    if not isinstance(result, RnnkitError):
        cfg, _ = result
        assert isinstance(cfg, TrainConfig)


_LATEST = {
    "format_version": FORMAT_VERSION,
    "snapshot": "snapshots/step-1",
    "step": 1,
    "state_sha256": "0" * 64,
}
_THRESHOLDS = {
    "format": "rnnkit.anomaly.thresholds",
    "version": 1,
    "target_fpr": 0.01,
    "top_g": 3,
    "score": "max",
    "rnn": {},
    "ngram": {},
}


@FUZZ
@given(
    data=st.one_of(json_docs(_LATEST), json_docs(_THRESHOLDS)),
    name=st.sampled_from(["latest.json", "thresholds.json", "state.json"]),
)
def test_checkpoint_json_reads_or_names_the_file(tmp_path: Path, data: bytes, name: str):
    import torch

    path = write(tmp_path, name, data)
    outcome(lambda: read_json(path), names=path)
    if name == "latest.json":
        model = torch.nn.Linear(1, 1)
        result = outcome(lambda: load_snapshot(tmp_path, model, None), names=tmp_path)
        assert isinstance(result, RnnkitError)  # there is no snapshot to load
    elif name == "thresholds.json":
        result = outcome(lambda: read_thresholds(tmp_path), names=path)


@FUZZ
@given(text=any_text)
def test_random_text_as_json_line(text: str):
    outcome(lambda: parse_stream_line(text, "in.jsonl", 1), names="in.jsonl:1")
