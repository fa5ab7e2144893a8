"""Generated tasks: the answers are exact (re-derived here independently), the splits never
share a source file, and what is written reads back through rnnkit's own readers."""

from __future__ import annotations

import io
import keyword
import tokenize

import pytest

from rnnkit.data.generated import (
    majority_letter_examples,
    python_tagging_corpus,
    python_token_sentences,
    stdlib_files,
    stdlib_package_examples,
    write_labelled,
)
from rnnkit.data.labelled import LabelledExample, read_labelled
from rnnkit.data.tagged import read_token_tags
from rnnkit.errors import ConfigError, DataError
from rnnkit.metrics.labels import bio_spans, is_bio_tagset

SOURCE = """\
import os.path  # the path module

class Box(object):
    def size(self, n=3):
        return len(self.items) + n * 2.5
print("a b", f(x).y, obj.attr)
"""


def test_type_tags_by_hand():
    tagged = [list(zip(s.tokens, s.tags, strict=True)) for s in python_token_sentences(SOURCE)]
    assert tagged[0] == [
        ("import", "KEYWORD"),
        ("os", "NAME"),
        (".", "OP"),
        ("path", "ATTR"),
        ("# the path module", "COMMENT"),
    ]
    assert tagged[1][:2] == [("class", "KEYWORD"), ("Box", "DEF")]
    assert ("size", "DEF") in tagged[2] and ("3", "NUMBER") in tagged[2]
    assert tagged[3][:5] == [
        ("return", "KEYWORD"),
        ("len", "CALL"),
        ("(", "OP"),
        ("self", "NAME"),
        (".", "OP"),
    ]
    assert ("2.5", "NUMBER") in tagged[3]
    assert tagged[4][:3] == [("print", "CALL"), ("(", "OP"), ('"a b"', "STRING")]
    assert ("y", "ATTR") in tagged[4] and ("attr", "ATTR") in tagged[4]


def test_type_tags_agree_with_tokenize_on_a_real_module():
    source = stdlib_files(["json"])[0].read_text(encoding="utf-8")
    sentences = python_token_sentences(source)
    assert len(sentences) > 50
    types: dict[str, set[int]] = {}
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        types.setdefault(t.string, set()).add(t.type)
    coarse = {
        "KEYWORD": tokenize.NAME,
        "DEF": tokenize.NAME,
        "CALL": tokenize.NAME,
        "ATTR": tokenize.NAME,
        "NAME": tokenize.NAME,
        "STRING": tokenize.STRING,
        "NUMBER": tokenize.NUMBER,
        "COMMENT": tokenize.COMMENT,
        "OP": tokenize.OP,
    }
    for s in sentences:
        for tok, tag in zip(s.tokens, s.tags, strict=True):
            # Python 3.12+ splits f-strings into FSTRING_* parts: string material too.
            parts = ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
            fstring = {getattr(tokenize, n, -1) for n in parts}
            assert coarse[tag] in types[tok] or (tag == "STRING" and types[tok] & fstring)
            assert (tag == "KEYWORD") == (coarse[tag] == tokenize.NAME and keyword.iskeyword(tok))


def test_bio_scheme_spans():
    s = python_token_sentences("x = a.b.c(d) + e.f\n", scheme="bio")[0]
    assert bio_spans(s.tags) == [(0, 1, "REF"), (2, 7, "CALL"), (8, 9, "REF"), (11, 14, "REF")]
    assert is_bio_tagset(s.tags)
    with pytest.raises(ConfigError, match="scheme must be one of types, bio"):
        python_token_sentences("x\n", scheme="iob")


def test_unwritable_tokens_and_long_lines_are_left_out():
    src = 'a = """two\nlines"""\nb = "tab\tinside"\nc = 1\n' + "d = " + " + ".join("1" * 50) + "\n"
    sentences = python_token_sentences(src, max_tokens=80)
    assert [s.tokens[0] for s in sentences] == ["c"]


def test_tagging_corpus_splits_by_file_and_reads_back(tmp_path):
    paths = python_tagging_corpus(tmp_path, packages=["json"], max_sentences=30)
    parts = {name: read_token_tags(p) for name, p in paths.items() if name != "test"}
    assert len(parts["train"]) == 30 and len(parts["valid"]) == 30
    assert {t for s in parts["train"] for t in s.tags} <= {
        "KEYWORD",
        "OP",
        "NUMBER",
        "STRING",
        "COMMENT",
        "DEF",
        "CALL",
        "ATTR",
        "NAME",
    }


def test_package_examples_are_unambiguous_and_disjoint():
    parts = stdlib_package_examples(["json", "logging"])
    owner: dict[str, set[str]] = {}
    for examples in parts.values():
        for e in examples:
            owner.setdefault(e.text, set()).add(e.label)
            assert e.text == e.text.strip() and len(e.text) >= 12
    assert all(len(labels) == 1 for labels in owner.values())
    assert {e.label for e in parts["train"]} == {"json", "logging"}
    with pytest.raises(DataError, match="no package 'nope'"):
        stdlib_package_examples(["nope"])


def test_majority_letter_and_writing_labelled(tmp_path):
    examples = majority_letter_examples(50, seed=2)
    for e in examples:
        counts = {c: e.text.count(c) for c in "abc"}
        assert counts[e.label] > max(v for c, v in counts.items() if c != e.label)
    write_labelled(examples, tmp_path / "m.tsv")
    assert [(e.label, e.text) for e in read_labelled(tmp_path / "m.tsv")] == [
        (e.label, e.text) for e in examples
    ]
    with pytest.raises(DataError, match="cannot hold a newline"):
        write_labelled([LabelledExample("a", "x\ny")], tmp_path / "bad.tsv")
