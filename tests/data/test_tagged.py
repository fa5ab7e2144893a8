"""Tagged readers: CoNLL-U (comments, multiword ranges, empty nodes, column by name) and
token<TAB>tag lines; every malformed input is a one-line DataError naming file and line."""

from __future__ import annotations

import pytest

from rnnkit.app.cli.main import main
from rnnkit.data.tagged import (
    CONLLU_COLUMNS,
    TaggedSentence,
    detect_tagged_format,
    read_conllu,
    read_tagged,
    read_token_tags,
    tagged_sentence,
)
from rnnkit.errors import ConfigError, DataError

CONLLU = """\
# newdoc id = x
# sent_id = 1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\tMood=Ind\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\tVerbForm=Inf\t0\troot\t_\tSpaceAfter=No
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = 2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_

"""


def write(tmp_path, text, name="data.txt"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_conllu_skips_comments_ranges_and_empty_nodes(tmp_path):
    p = write(tmp_path, CONLLU, "a.conllu")
    assert read_conllu(p) == [
        TaggedSentence(["Do", "n't", "go", "."], ["AUX", "PART", "VERB", "PUNCT"], 5),
        TaggedSentence(["Hi"], ["INTJ"], 12),
    ]


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        ("upos", ["AUX", "PART", "VERB", "PUNCT"]),
        ("xpos", ["VBP", "RB", "VB", "."]),
        ("lemma", ["do", "not", "go", "."]),
        ("deprel", ["aux", "advmod", "root", "punct"]),
        ("head", ["3", "3", "0", "3"]),
        ("feats", ["Mood=Ind", "_", "VerbForm=Inf", "_"]),
        ("misc", ["_", "_", "SpaceAfter=No", "_"]),
    ],
)
def test_conllu_column_by_name(tmp_path, column, expected):
    p = write(tmp_path, CONLLU, "a.conllu")
    assert read_conllu(p, column)[0].tags == expected
    assert read_tagged(p, column) == (read_conllu(p, column), "conllu")


def test_conllu_unknown_column_is_a_config_error(tmp_path, capsys):
    """From Python the readers name their ``column`` argument; ``rnnkit train --task tag``
    checks ``--tag-column`` first and names it."""
    p = write(tmp_path, CONLLU)
    for read in (read_conllu, read_tagged):
        with pytest.raises(ConfigError, match=r"^column must be one of form, lemma, upos"):
            read(p, "pos")
    assert len(CONLLU_COLUMNS) == 10
    argv = ["train", "--task", "tag", "--train", str(p), "--out", str(tmp_path / "run")]
    assert main([*argv, "--tag-column", "pos", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rnnkit train: error: --tag-column must be one of form, lemma, upos")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\tDo\tdo\tAUX", "malformed CoNLL-U line: expected 10 tab-separated columns, got 4"),
        (
            "1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_\textra",
            "malformed CoNLL-U line: expected 10 tab-separated columns, got 11",
        ),
        (
            "1 Do do AUX VBP _ 3 aux _ _",
            "malformed CoNLL-U line: expected 10 tab-separated columns, got 1",
        ),
        (
            "x\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_",
            "malformed CoNLL-U line: id must be a positive integer, got 'x'",
        ),
        ("1\tDo\tdo\t\tVBP\t_\t3\taux\t_\t_", "malformed CoNLL-U line: empty upos column"),
    ],
)
def test_conllu_malformed_line_names_file_and_line(tmp_path, line, message):
    lines = CONLLU.split("\n")
    lines[5] = line  # line 6 of the file
    p = write(tmp_path, "\n".join(lines), "bad.conllu")
    with pytest.raises(DataError) as info:
        read_conllu(p)
    assert str(info.value) == f"{p}:6: {message}"
    assert (info.value.path, info.value.line) == (str(p), 6)


def test_token_tag_lines(tmp_path):
    p = write(tmp_path, "\n\nThe\tDET\nNew York\tPROPN\n\n\nruns\tVERB\n", "t.tsv")
    assert read_token_tags(p) == [
        TaggedSentence(["The", "New York"], ["DET", "PROPN"], 3),
        TaggedSentence(["runs"], ["VERB"], 7),
    ]
    assert read_tagged(p) == (read_token_tags(p), "tsv")


def test_spaces_around_a_token_are_no_part_of_it(tmp_path):
    """Before: "cat  <TAB>NOUN" put "cat  " in the vocabulary, which no sentence to tag
    (split at whitespace) could ever meet."""
    p = write(tmp_path, "The \tDET\n  cat  \tNOUN\nNew York\tPROPN\n", "t.tsv")
    assert read_token_tags(p) == [
        TaggedSentence(["The", "cat", "New York"], ["DET", "NOUN", "PROPN"], 1)
    ]
    with pytest.raises(DataError, match=r"s\.tsv:1: empty token"):  # spaces alone: none
        read_token_tags(write(tmp_path, "  \tNOUN\n", "s.tsv"))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("cat NOUN", "line has no tab (expected token<TAB>tag)"),
        ("cat\tNOUN\tSg", "expected token<TAB>tag, got 3 tab-separated fields"),
        ("cat\t", "empty tag (expected token<TAB>tag)"),
        ("\tNOUN", "empty token (expected token<TAB>tag)"),
    ],
)
def test_token_tag_errors(tmp_path, bad, message):
    p = write(tmp_path, f"The\tDET\n{bad}\nsat\tVERB\n", "t.tsv")
    with pytest.raises(DataError) as info:
        read_token_tags(p)
    assert str(info.value) == f"{p}:2: {message}"


def test_wrong_length_and_empty_files(tmp_path):
    with pytest.raises(DataError, match=r"^s.tsv:3: tag sequence of the wrong length: 3 tokens"):
        tagged_sentence(["a", "b", "c"], ["X", "Y"], "s.tsv", 3)
    with pytest.raises(DataError, match="empty tag"):
        tagged_sentence(["a"], [" "])
    with pytest.raises(DataError, match="empty corpus"):
        read_token_tags(write(tmp_path, "\n\n"))
    with pytest.raises(DataError, match="no tagged sentence in the file"):
        read_conllu(write(tmp_path, "# only a comment\n"))
    with pytest.raises(DataError, match="file not found"):
        read_tagged(tmp_path / "missing.tsv")


def test_invalid_utf8_names_the_byte(tmp_path):
    p = tmp_path / "b.tsv"
    p.write_bytes(b"ok\tX\n\xff\tY\n")
    with pytest.raises(
        DataError, match=r"b.tsv:2: invalid UTF-8 at byte 1 of the line \(byte 0xff\)$"
    ):
        read_tagged(p)


def test_format_detection():
    assert detect_tagged_format("\n1\ta\ta\tX\t_\t_\t0\troot\t_\t_\n") == "conllu"
    assert detect_tagged_format("# comment\n") == "conllu"
    assert detect_tagged_format("a\tX\n") == "tsv"


@pytest.mark.parametrize(
    "text, expected",
    [
        # token<TAB>tag files whose first token starts with "#": a hashtag, a number sign
        ("#rnnkit\tHASHTAG\nrocks\tVERB\n\nthe\tDET\n", "tsv"),
        ("#1\tNUM\n", "tsv"),
        ("#a\tX\n\n#b\tY\n", "tsv"),
        ("\n#\tSYM\nx\tX\n", "tsv"),
        # CoNLL-U files starting with comments, one holding a tab, before ten columns
        ("# sent_id = 1\n# text = a\n1\ta\ta\tX\t_\t_\t0\troot\t_\t_\n", "conllu"),
        ("# text = a\tb\n1\ta\ta\tX\t_\t_\t0\troot\t_\t_\n", "conllu"),
        ("#\tx\n1\ta\ta\tX\t_\t_\t0\troot\t_\t_\n", "conllu"),
        ("# sent_id = 1\n", "conllu"),
        ("", "tsv"),
    ],
)
def test_format_detection_hash_lines(text, expected):
    assert detect_tagged_format(text) == expected


def test_a_header_line_over_token_tag_lines_says_why_the_file_was_conllu(tmp_path):
    """A ``# header`` above ``token<TAB>tag`` lines makes the file CoNLL-U, and its first
    token line was "expected 10 tab-separated columns, got 2", no word of why: the error
    names the ``#`` line and both ways out. A CoNLL-U file's own broken line (not of two
    fields) is told as before."""
    p = write(tmp_path, "\n# exported from my tool\nJohn\tB-PER\nmet\tO\n", "h.tsv")
    with pytest.raises(DataError) as info:
        read_tagged(p)
    assert str(info.value) == (
        f"{p}:3: malformed CoNLL-U line: expected 10 tab-separated columns, got 2 (the file "
        "was read as CoNLL-U because line 2 starts with '#'; for a token<TAB>tag file "
        "remove that line, else give a CoNLL-U file)"
    )
    assert (info.value.path, info.value.line) == (str(p), 3)
    lines = CONLLU.split("\n")
    lines[5] = "1\tDo\tdo\tAUX"
    c = write(tmp_path, "\n".join(lines), "bad.conllu")
    with pytest.raises(DataError, match=r"bad\.conllu:6: [^(]*got 4$"):
        read_tagged(c)
    with pytest.raises(DataError, match=r"got 2$"):  # told the format: no guess to explain
        read_tagged(p, fmt="conllu")


def test_tsv_whose_first_token_starts_with_hash_reads_as_tsv(tmp_path):
    p = write(tmp_path, "#rnnkit\tHASHTAG\nrocks\tVERB\n\nthe\tDET\ndog\tNOUN\n", "hash.tsv")
    assert read_tagged(p) == (
        [
            TaggedSentence(["#rnnkit", "rocks"], ["HASHTAG", "VERB"], 1),
            TaggedSentence(["the", "dog"], ["DET", "NOUN"], 4),
        ],
        "tsv",
    )
    # a CoNLL-U file opening with comments is still CoNLL-U
    c = write(tmp_path, CONLLU, "a.conllu")
    assert read_tagged(c) == (read_conllu(c), "conllu")
