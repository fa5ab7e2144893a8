"""Size limits (rnnkit.data.limits): each absurd size is a one-line DataError naming the
file, the line, the limit and how to raise it; each default admits real data; each can be
raised by keyword or environment variable."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from rnnkit.data.events import read_sessions
from rnnkit.data.labelled import LabelSet, read_labelled
from rnnkit.data.limits import MAX_JSON_DEPTH, MAX_LINE_CHARS, MAX_SEQ_LEN, MAX_VOCAB, loads_json
from rnnkit.data.pairs import read_pairs
from rnnkit.data.tagged import read_tagged
from rnnkit.data.text import build_vocab_from_file
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.training.checkpoint import read_json


def _error(call) -> str:
    with pytest.raises(DataError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_are_generous() -> None:
    assert MAX_LINE_CHARS.value() == 2**20
    assert MAX_SEQ_LEN.value() == MAX_VOCAB.value() == 1_000_000
    assert MAX_JSON_DEPTH.value() == 100


# ---- line length --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reader", "row"),
    [
        (read_labelled, "pos\t{}"),
        (read_pairs, "{}\tx"),
        (lambda p, **kw: read_tagged(p, fmt="tsv", **kw), "{}\tNOUN"),
        (lambda p, **kw: read_tagged(p, fmt="conllu", **kw), "1\t{}\t_\tNOUN\t_\t_\t0\troot\t_\t_"),
    ],
)
def test_a_line_over_the_limit_names_file_line_and_limit(tmp_path: Path, reader, row) -> None:
    path = tmp_path / "data.tsv"
    path.write_text(row.format("ok") + "\n" + row.format("x" * 100) + "\n")
    message = _error(lambda: reader(path, max_line_chars=50))
    assert message.startswith(f"{path}:2: line of ")
    assert "over the limit of 50 characters" in message
    assert "RNNKIT_MAX_LINE_CHARS=N" in message and "max_line_chars=N" in message
    assert reader(path, max_line_chars=200)  # raised by keyword, it reads


def test_line_limit_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data.tsv"
    path.write_text("pos\t" + "x" * 100 + "\n")
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "50")
    assert "over the limit of 50 characters" in _error(lambda: read_labelled(path))
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "1_000")
    assert read_labelled(path)[0].label == "pos"
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "lots")
    with pytest.raises(ConfigError, match="RNNKIT_MAX_LINE_CHARS must be a positive integer"):
        read_labelled(path)


def test_a_line_at_the_default_limit_reads(tmp_path: Path) -> None:
    path = tmp_path / "long.tsv"
    path.write_text("pos\t" + "x" * (2**20 - 4) + "\n" + "neg\t" + "y" * 2**20 + "\n")
    assert f"{path}:2: line of 1,048,580 characters" in _error(lambda: read_labelled(path))
    path.write_text("pos\t" + "x" * (2**20 - 4) + "\n")
    assert len(read_labelled(path)[0].text) == 2**20 - 4


def test_an_overlong_json_line_is_refused_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    big = 20 * 2**20
    path.write_bytes(b'{"session": "a", "events": ["' + b"x" * big + b'"]}\n')
    monkeypatch.setenv("RNNKIT_MAX_JSON_LINE_BYTES", str(2**20))
    tracemalloc.start()
    try:
        message = _error(lambda: read_sessions(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"{path}:1: line too long, over the limit of 1,048,576 bytes")
    assert "RNNKIT_MAX_JSON_LINE_BYTES=N" in message
    assert peak < 4 * 2**20  # one bounded read, never the 20 MiB line


# ---- sequence length ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tsv", "conllu"])
def test_a_sentence_over_the_limit_names_where_it_starts(tmp_path: Path, fmt: str) -> None:
    row = "w\tX" if fmt == "tsv" else "1\tw\t_\tX\t_\t_\t0\troot\t_\t_"
    path = tmp_path / "t.txt"
    path.write_text("\n".join([row, "", *[row] * 6]) + "\n")
    message = _error(lambda: read_tagged(path, fmt=fmt, max_seq_len=5))
    assert message.startswith(f"{path}:3: sentence of more than 5 tokens (no blank line)")
    assert "RNNKIT_MAX_SEQ_LEN=N" in message
    assert len(read_tagged(path, fmt=fmt, max_seq_len=6)[0]) == 2


def test_a_session_over_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"session": "a", "events": ["x"] * 8}) + "\n")
    monkeypatch.setenv("RNNKIT_MAX_SEQ_LEN", "7")
    message = _error(lambda: read_sessions(path))
    assert message.startswith(f"{path}:1: session 'a' has 8 events, over the limit of 7 tokens")
    assert read_sessions(path, max_seq_len=8)[0].events == ["x"] * 8


# ---- vocabulary size ------------------------------------------------------------------


def test_a_word_vocabulary_of_random_data_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "random.txt"
    path.write_text(" ".join(f"w{i}" for i in range(30)) + " w0\n")
    message = _error(lambda: build_vocab_from_file(path, unit="word", max_vocab=20))
    assert message.startswith(f"{path}: vocabulary of 30 distinct tokens")
    assert "over the limit of 20 tokens" in message and "--min-freq" in message
    # min_freq is the natural fix; max_size truncates on purpose and is not refused.
    assert len(build_vocab_from_file(path, unit="word", min_freq=2, max_vocab=20)) == 5
    assert len(build_vocab_from_file(path, unit="word", max_size=10, max_vocab=2)) == 10


def test_vocabulary_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RNNKIT_MAX_VOCAB", "2")
    with pytest.raises(DataError, match="RNNKIT_MAX_VOCAB=N"):
        Vocabulary.from_text("a b c", unit="word")
    monkeypatch.setenv("RNNKIT_MAX_VOCAB", "3")
    assert len(Vocabulary.from_text("a b c", unit="word")) == 7


# ---- JSON nesting -----------------------------------------------------------------


def test_json_depth_limit_is_exact() -> None:
    assert loads_json("[" * 100 + "]" * 100) is not None
    message = _error(lambda: loads_json("[" * 101 + "]" * 101, "f.json", 4))
    assert message.startswith("f.json:4: JSON nested too deeply, over the limit of 100 levels")
    assert loads_json("[" * 101 + "]" * 101, max_depth=101) is not None
    # Brackets inside strings are not nesting.
    assert loads_json(json.dumps(["[" * 500])) == ["[" * 500]


def test_a_repeated_key_is_refused_at_any_depth() -> None:
    # The oracle: json.loads, which keeps the last value in silence.
    for text, key in [('{"a": 1, "a": 2}', "a"), ('[{"b": {"c": 1, "c": 1}}]', "c")]:
        assert json.loads(text) is not None
        assert _error(lambda t=text: loads_json(t, "f.json", 2)) == (
            f"f.json:2: invalid JSON: key {key!r} appears twice"
        )
    assert loads_json('{"a": {"a": 1}, "b": [{"a": 2}]}') == {"a": {"a": 1}, "b": [{"a": 2}]}


def test_a_lone_surrogate_in_any_string_is_refused_naming_the_line(tmp_path: Path) -> None:
    """JSON spells any UTF-16 code unit (\\ud800); Python decodes half a pair to a str
    that no encoder takes. Before: events with one trained (the vocabulary's write
    failed) and were scored (the verdict's print failed), each with a traceback."""
    for text in ['["open", "\\ud800"]', '{"\\uDC00x": 1}', '{"a": [{"b": "x\\udbff"}]}']:
        value = json.loads(text)  # the oracle: a str that cannot be encoded
        with pytest.raises(UnicodeEncodeError):
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        message = _error(lambda t=text: loads_json(t, "s.jsonl", 4, only_text=True))
        assert message.startswith("s.jsonl:4: invalid JSON: the string ")
        assert "lone surrogate" in message and "\n" not in message
    assert loads_json('["\\ud83d\\ude00", "\\u00e9"]') == ["\U0001f600", "\u00e9"]  # a pair
    path = tmp_path / "s.jsonl"
    path.write_text('{"session": "a", "events": ["open", "\\ud800"]}\n')
    with pytest.raises(DataError, match=r"s\.jsonl:1: invalid JSON: .*lone surrogate"):
        read_sessions(path)
    # a run's own files keep paths, which Python spells so where a name is not UTF-8
    # (b"caf\xe9.txt"): a run trained on such a file must still read its config.json
    run_file = tmp_path / "config.json"
    run_file.write_text(json.dumps({"train": "caf\udce9.txt"}))
    assert read_json(run_file) == {"train": "caf\udce9.txt"}


@pytest.mark.parametrize("depth", [101, 5_000, 100_000])
def test_deep_json_files_are_one_line_errors(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "vocab.json"
    path.write_text("[" * depth + "]" * depth)
    assert "nested too deeply" in _error(lambda: Vocabulary.load(path))
    assert "nested too deeply" in _error(lambda: LabelSet.load(path))
    with pytest.raises(CheckpointError, match=r"vocab\.json: not valid JSON.*nested too deeply"):
        read_json(path)
