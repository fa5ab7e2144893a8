"""Fuzz the tagged-sentence readers (CoNLL-U and ``token<TAB>tag``)."""

from __future__ import annotations

from pathlib import Path

from fuzzkit import FUZZ, file_bytes, huge_line, outcome, tabbed_lines, write
from hypothesis import given
from hypothesis import strategies as st

from rnnkit.data.tagged import CONLLU_COLUMNS, TaggedSentence, read_tagged
from rnnkit.errors import ConfigError, DataError

# CoNLL-U-like rows: an id that is sometimes right, then nine more fields.
_conllu_row = st.tuples(
    st.one_of(st.integers(-2, 30).map(str), st.sampled_from(["1-2", "2.1", "", "x", "٣"])),
    st.lists(
        st.text(max_size=6).map(lambda s: s.replace("\t", "").replace("\n", "")),
        min_size=8,
        max_size=10,
    ),
).map(lambda t: "\t".join([t[0], *t[1]]))
conllu = st.lists(st.one_of(_conllu_row, st.just(""), st.just("# sent_id = 1")), max_size=12)
tagged_files = file_bytes(st.one_of(tabbed_lines(2), tabbed_lines(10), conllu.map("\n".join)))


@FUZZ
@given(
    data=tagged_files,
    column=st.sampled_from([*CONLLU_COLUMNS[1:], "id", "nope"]),
    fmt=st.sampled_from([None, "conllu", "tsv", "csv"]),
)
def test_tagged_file_reads_or_names_file_and_line(
    tmp_path: Path, data: bytes, column: str, fmt: str | None
):
    path = write(tmp_path, "tags.conllu", data)
    result = outcome(lambda: read_tagged(path, column=column, fmt=fmt), names=None)
    if isinstance(result, ConfigError):
        assert column in ("id", "nope") or fmt == "csv"  # an option error, not the file's
        return
    if isinstance(result, DataError):
        assert str(path) in str(result)
        return
    sentences, found = result
    assert found in ("conllu", "tsv") and sentences
    for s in sentences:
        assert isinstance(s, TaggedSentence) and len(s.tokens) == len(s.tags) > 0
        assert all(t.strip() for t in s.tags) and s.line >= 1


@FUZZ
@given(token=huge_line(), fmt=st.sampled_from(["conllu", "tsv"]))
def test_huge_token_line(tmp_path: Path, token: str, fmt: str):
    token = token.replace("\t", " ").replace("\n", " ")
    row = f"1\t{token}\t_\tNOUN\t_\t_\t0\troot\t_\t_" if fmt == "conllu" else f"{token}\tNOUN"
    path = write(tmp_path, "big.tsv", row + "\n")
    result = outcome(lambda: read_tagged(path, fmt=fmt), names=path)
    assert isinstance(result, (tuple, DataError))
