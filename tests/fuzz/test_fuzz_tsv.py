"""Fuzz the tab-separated example readers: ``label<TAB>text`` and ``source<TAB>target``."""

from __future__ import annotations

from pathlib import Path

from fuzzkit import FUZZ, file_bytes, huge_line, outcome, tabbed_lines, write
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.data.labelled import LabelledExample, read_labelled
from rnnkit.data.pairs import Pair, encode_pairs, read_pairs
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import DataError

tsv_files = file_bytes(st.one_of(tabbed_lines(2), tabbed_lines(3)))


@FUZZ
@given(data=tsv_files)
def test_labelled_file_reads_or_names_file_and_line(tmp_path: Path, data: bytes):
    path = write(tmp_path, "labelled.tsv", data)
    result = outcome(lambda: read_labelled(path), names=path)
    if not isinstance(result, DataError):
        for ex in result:
            assert isinstance(ex, LabelledExample) and ex.label and ex.text.strip()
            assert ex.line >= 1


@FUZZ
@given(data=tsv_files, units=st.tuples(*[st.sampled_from(["char", "word"])] * 2))
def test_pairs_file_reads_or_names_file_and_line(
    tmp_path: Path, data: bytes, units: tuple[str, str]
):
    path = write(tmp_path, "pairs.tsv", data)
    result = outcome(lambda: read_pairs(path), names=path)
    if isinstance(result, DataError):
        return
    assert result and all(isinstance(p, Pair) and p.line >= 1 for p in result)
    src = Vocabulary.from_text(" ".join(p.source for p in result), unit=units[0])
    tgt = Vocabulary.from_text(" ".join(p.target for p in result), unit=units[1])
    encoded = outcome(lambda: encode_pairs(result, src, tgt, path), names=path)
    if not isinstance(encoded, DataError):
        assert all(len(s) and len(t) for s, t in zip(*encoded, strict=True))


@FUZZ
@given(text=huge_line(), reader=st.sampled_from([read_labelled, read_pairs]))
def test_huge_example_line(tmp_path: Path, text: str, reader):
    path = write(tmp_path, "big.tsv", "x\t" + text.replace("\t", " ") + "\n")
    outcome(lambda: reader(path), names=path)
