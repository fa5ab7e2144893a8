"""Readers of real-valued sequences: JSON lines and CSV, and their one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from rnnkit.data.vectors import read_vector_sequences
from rnnkit.errors import DataError


def test_json_lines_with_vectors_scalars_and_targets(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(
        '{"seq": [[1, 2], [3, 4.5]], "y": 7}\n\n{"seq": [[0, -1]], "y": [1, 2]}\n',
        encoding="utf-8",
    )
    a, b = read_vector_sequences(path)
    np.testing.assert_array_equal(a.values, [[1, 2], [3, 4.5]])
    assert a.target.tolist() == [7.0] and b.target.tolist() == [1.0, 2.0]
    assert (a.line, b.line) == (1, 3)
    scalars = tmp_path / "x.jsonl"
    scalars.write_text('{"seq": [1, 2, 3]}\n', encoding="utf-8")
    (s,) = read_vector_sequences(scalars)
    assert s.values.shape == (3, 1) and s.target is None


def test_csv_file_is_one_sequence_and_a_directory_many(tmp_path):
    (tmp_path / "b.csv").write_text("x,y\n1,2\n3,4\n", encoding="utf-8")
    (tmp_path / "a.csv").write_text("0.5,1e-3\n", encoding="utf-8")
    (one,) = read_vector_sequences(tmp_path / "b.csv")
    np.testing.assert_array_equal(one.values, [[1, 2], [3, 4]])
    assert one.line == 2  # the header is skipped
    both = read_vector_sequences(tmp_path)
    assert [s.path.rsplit("/", 1)[1] for s in both] == ["a.csv", "b.csv"]


@pytest.mark.parametrize(
    ("name", "content", "where", "words"),
    [
        ("w.csv", "1,2\n3,4\n5\n", ":3", "row has 1 values, the rows before 2"),
        ("n.csv", "1,2\n3,abc\n", ":2", "not a number: 'abc'"),
        ("f.csv", "1,2\n3,nan\n", ":2", "not finite"),
        ("e.csv", "a,b\n", "", "no numeric rows"),
        ("j.jsonl", '{"seq": [[1, 2]]}\n{"seq": [[1, "x"]]}\n', ":2", "not a number"),
        ("k.jsonl", '{"seq": [[1, 2], [3]]}\n', ":1", "step 2 of seq has 1 values"),
        ("d.jsonl", '{"seq": [[1, 2]]}\n{"seq": [[1, 2, 3]]}\n', ":2", "the first sequence's 2"),
        ("m.jsonl", '{"sequence": [[1]]}\n', ":1", '{"seq"'),
        ("t.jsonl", '{"seq": [[1]]\n', ":1", "not valid JSON"),
        ("b.jsonl", '{"seq": [[true]]}\n', ":1", "not a number"),
        # json.loads kept the last "seq" in silence: a broken writer, not a guess to make
        (
            "r.jsonl",
            '{"seq": [[1]]}\n{"seq": [[1]], "seq": [[2]]}\n',
            ":2",
            "key 'seq' appears twice",
        ),
        ("y.jsonl", '{"seq": [[1]], "y": 1, "y": 2}\n', ":1", "key 'y' appears twice"),
        # another format altogether (numbers a line, a JSON list): what a line must hold
        ("p.txt", "1 2 3\n", ":1", "Extra data (column 3)); each line is one sequence, a JSON"),
        ("l.txt", "[1, 2]\n", ":1", 'expected one sequence, a JSON object such as {"seq"'),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, name, content, where, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_vector_sequences(path)
    assert str(err.value).startswith(f"{path}{where}: ")
    assert words in str(err.value)


def test_labelled_sequences_from_json_lines_and_label_folders(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"seq": [[1, 2], [3, 4]], "label": "walk"}\n\n{"seq": [[5, 6]], "label": "run"}\n'
    )
    seqs = read_vector_sequences(tmp_path / "a.jsonl", labelled=True)
    assert [s.label for s in seqs] == ["walk", "run"] and [s.line for s in seqs] == [1, 3]
    assert seqs[0].values.tolist() == [[1, 2], [3, 4]] and seqs[0].target is None
    for cls, rows in (("sit", "x,y\n0,0\n0,1\n"), ("walk", "1,2\n"), ("walk", "3,4\n5,6\n")):
        (tmp_path / "csv" / cls).mkdir(parents=True, exist_ok=True)
        n = len(list((tmp_path / "csv" / cls).iterdir()))
        (tmp_path / "csv" / cls / f"{n}.csv").write_text(rows)
    seqs = read_vector_sequences(tmp_path / "csv", labelled=True)
    assert [(s.label, len(s.values)) for s in seqs] == [("sit", 2), ("walk", 1), ("walk", 2)]
    assert seqs[0].line == 2  # the first data row, after the header


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"seq": [1, 2]}\n', ['"label" must be a non-empty string']),
        ('{"seq": [1, 2], "label": 3}\n', ['"label" must be a non-empty string']),
        ('{"seq": [1, 2], "label": "a", "y": 1}\n', ["unknown keys ['y']"]),
    ],
)
def test_a_labelled_line_needs_its_label(tmp_path, content, words):
    (tmp_path / "a.jsonl").write_text(content)
    with pytest.raises(DataError) as err:
        read_vector_sequences(tmp_path / "a.jsonl", labelled=True)
    assert "a.jsonl:1" in str(err.value) and all(w in str(err.value) for w in words)
    (tmp_path / "one.csv").write_text("1,2\n")
    with pytest.raises(DataError, match="folder named by its label"):
        read_vector_sequences(tmp_path / "one.csv", labelled=True)
    with pytest.raises(DataError, match=r"unknown keys \['label'\]"):  # regress: no label
        (tmp_path / "b.jsonl").write_text('{"seq": [1], "label": "a"}\n')
        read_vector_sequences(tmp_path / "b.jsonl")


def test_an_endless_line_is_refused_after_one_bounded_read(tmp_path, monkeypatch):
    # /dev/zero read line by line grew to gigabytes, then MemoryError.
    with pytest.raises(DataError, match=r"^/dev/zero:1: line too long, over the limit of "):
        read_vector_sequences("/dev/zero")
    path = tmp_path / "s.jsonl"
    path.write_text('{"seq": [1]}\n{"seq": [1, 2, 3, 4, 5]}\n', encoding="utf-8")
    monkeypatch.setenv("RNNKIT_MAX_JSON_LINE_BYTES", "20")
    with pytest.raises(DataError, match=r":2: line too long.*RNNKIT_MAX_JSON_LINE_BYTES"):
        read_vector_sequences(path)
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("1,2\n" + ",".join(["3"] * 30) + "\n", encoding="utf-8")
    monkeypatch.setenv("RNNKIT_MAX_LINE_CHARS", "20")
    with pytest.raises(DataError, match=r":2: line too long.*RNNKIT_MAX_LINE_CHARS"):
        read_vector_sequences(csv_path)
    monkeypatch.setenv("RNNKIT_MAX_FILE_BYTES", "30")
    monkeypatch.setenv("RNNKIT_MAX_JSON_LINE_BYTES", "100")
    path.write_text('{"seq": [1]}\n' * 3, encoding="utf-8")
    with pytest.raises(DataError, match=r"file of more than 30 bytes"):
        read_vector_sequences(path)


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("i.jsonl", '{"seq": [[1], [1%s]]}\n' % ("0" * 400), "out of float32's range"),
        ("y.jsonl", '{"seq": [[1]], "y": -1%s}\n' % ("0" * 400), "out of float32's range"),
        ("f.jsonl", '{"seq": [[1e300]]}\n', "out of float32's range (±3.4e38): 1e+300"),
        ("h.jsonl", '{"seq": [[1%s]]}\n' % ("0" * 5000), "an integer with too many digits"),
        ("x.jsonl", '{"seq": [[1e999]]}\n', "not valid JSON"),
        ("c.csv", "1\n1%s\n" % ("0" * 400), "not finite"),
        ("d.csv", "1\n-1e300\n", "out of float32's range"),
    ],
)
def test_extreme_values_are_one_line_errors(tmp_path, name, content, words):
    # A 400-digit integer raised OverflowError; 1e300 became inf in float32 silently.
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_vector_sequences(path)
    message = str(err.value)
    assert message.startswith(f"{path}:") and words in message and len(message) < 200


def test_a_byte_order_mark_is_not_content(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"seq": [1, 2]}\n')
    (s,) = read_vector_sequences(path)
    assert s.values.tolist() == [[1.0], [2.0]]
    csv_path = tmp_path / "s.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf1,2\n3,4\n")
    (c,) = read_vector_sequences(csv_path)
    assert c.values.tolist() == [[1.0, 2.0], [3.0, 4.0]] and c.line == 1


GOOD_JSON = b'{"seq": [[1, 2], [3, 4]], "y": 1}'


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        # 1,500 good lines (over 8 KB) before the bad one: a text stream said line 1,446
        ("late.jsonl", (GOOD_JSON + b"\n") * 1500 + b'{"\xff": 1}\n', 1501),
        ("crlf.jsonl", (GOOD_JSON + b"\r\n") * 1500 + b'{"\xff": 1}\r\n', 1501),
        ("late.csv", b"x,y\n" + b"1,2\n" * 1500 + b"3,\xff\n", 1502),
        ("cr.csv", b"1,2\r" * 1500 + b"3,\xff\r", 1501),  # a lone \r ends a row
        ("bom.csv", b"\xef\xbb\xbf1,2\n" + b"1,2\r\n" * 1500 + b"3,\xff\r\n", 1502),
    ],
)
def test_invalid_utf8_names_its_own_line(tmp_path, name, data, where):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as err:
        read_vector_sequences(path)
    assert str(err.value) == f"{path}:{where}: invalid UTF-8 at byte 3 of the line (byte 0xff)"


def test_bom_crlf_and_a_character_across_a_chunk_are_read(tmp_path):
    path = tmp_path / "ok.jsonl"
    line = b'{"seq": [1], "label": "walk"}\r\n'
    head = b"\xef\xbb\xbf" + line * 250
    last = '{"seq": [2], "label": "café"}\r\n'.encode()
    head += b" " * (8191 - len(head) - last.index("é".encode()))  # the last line's indent
    data = head + last
    # "é" straddles byte 8,192, where a text stream's decoder cuts its chunks.
    assert data.index("é".encode()) == 8191
    path.write_bytes(data)
    seqs = read_vector_sequences(path, labelled=True)
    assert [s.label for s in seqs] == ["walk"] * 250 + ["café"] and seqs[-1].line == 251
