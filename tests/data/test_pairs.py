"""``source<TAB>target`` reading (errors with file:line), pair batching, generated tasks."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from rnnkit.data.generated_pairs import date_to_words, generate_pairs, main, transduce
from rnnkit.data.pairs import PairBatcher, encode_pairs, make_pair_batch, read_pairs
from rnnkit.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from rnnkit.errors import ConfigError, DataError


def write(tmp_path, text: str, name: str = "pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_reads_pairs_with_line_numbers_skipping_blank_lines_and_crlf(tmp_path):
    path = write(tmp_path, "ab\tba\r\n\n  \nx y\t5 March 2024\n")
    pairs = read_pairs(path)
    assert [(p.source, p.target, p.line) for p in pairs] == [
        ("ab", "ba", 1),
        ("x y", "5 March 2024", 4),
    ]


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("ab\tba\nno tab here\n", 2, "no tab"),
        ("ab\tba\n\tba\n", 2, "empty source"),
        ("ab\tba\ncd\t  \n", 2, "empty target"),
        ("\n\nab\tb\ta\n", 3, "2 tabs"),
    ],
)
def test_bad_lines_are_errors_naming_file_and_line(tmp_path, text, line, problem):
    path = write(tmp_path, text)
    with pytest.raises(DataError) as err:
        read_pairs(path)
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert problem in str(err.value)


def test_empty_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(DataError, match="empty"):
        read_pairs(write(tmp_path, "\n \n"))
    with pytest.raises(DataError, match=r"missing\.tsv"):
        read_pairs(tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"ab\tb\xff\n")
    with pytest.raises(DataError, match=r"bad\.tsv"):
        read_pairs(bad)


def test_a_side_without_tokens_is_an_error_with_its_line(tmp_path):
    words = Vocabulary(["a"], unit="word")
    pairs = read_pairs(write(tmp_path, "a\ta\n"))
    pairs = [pairs[0]._replace(target=" ", line=9)]
    with pytest.raises(DataError, match=r":9: the target has no token"):
        encode_pairs(pairs, words, words, tmp_path / "x.tsv")


def test_batch_is_in_teacher_forcing_form():
    b = make_pair_batch([np.array([4, 5, 6])], [np.array([7, 8])])
    assert b.target_in.tolist() == [[BOS_ID, 7, 8]]
    assert b.target_out.tolist() == [[7, 8, EOS_ID]]
    assert b.source_mask.tolist() == [[True, True, True]]


def test_pair_batcher_covers_every_pair_once_and_resumes_exactly():
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 9, size=n) for n in rng.integers(1, 9, size=23)]
    tgt = [s[::-1].copy() for s in src]
    batcher = PairBatcher(src, tgt, batch_size=4, seed=3)
    seen = []
    for b in batcher:
        assert b.source.shape[0] == b.target_in.shape[0] <= 4
        for row, i in enumerate(b.indices.tolist()):
            n = len(src[i])
            assert b.source[row, :n].tolist() == src[i].tolist()
            assert b.target_out[row, : n + 1].tolist() == [*tgt[i].tolist(), EOS_ID]
            assert b.target_in[row, n + 1 :].eq(PAD_ID).all()
        seen.extend(b.indices.tolist())
    assert sorted(seen) == list(range(23))
    it = iter(batcher)
    next(it)
    state = batcher.state_dict()
    expected = [b.indices.tolist() for b in it]
    again = PairBatcher(src, tgt, batch_size=4, seed=3)
    again.load_state_dict(state)
    assert [b.indices.tolist() for b in again] == expected


def test_generated_tasks_have_exact_answers_and_are_reproducible():
    for task in ("reverse", "sort", "date"):
        pairs = generate_pairs(task, 50, seed=4)
        assert pairs == generate_pairs(task, 50, seed=4)
        assert pairs != generate_pairs(task, 50, seed=5)
        assert all(transduce(task, s) == t for s, t in pairs)
    for s, t in generate_pairs("reverse", 20, seed=1):
        assert t == s[::-1] and 3 <= len(s) <= 8
    for s, t in generate_pairs("sort", 20, seed=1):
        assert list(t) == sorted(s)
    for s, t in generate_pairs("date", 100, seed=1):
        d = datetime.date.fromisoformat(s)
        day, month, year = t.split(" ")
        assert (int(day), int(year)) == (d.day, d.year)
        assert month == datetime.date(2000, d.month, 1).strftime("%B")
    assert date_to_words("1999-12-31") == "31 December 1999"
    with pytest.raises(ConfigError):
        generate_pairs("upper", 3)


def test_generator_command_line_writes_a_readable_file(tmp_path):
    out = tmp_path / "sort.tsv"
    assert main(["sort", "--n", "7", "--seed", "2", "--out", str(out)]) == 0
    pairs = read_pairs(out)
    assert [(p.source, p.target) for p in pairs] == generate_pairs("sort", 7, seed=2)
