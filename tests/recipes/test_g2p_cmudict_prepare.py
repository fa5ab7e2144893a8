"""recipes/g2p_cmudict/prepare.py on tiny generated dictionary lines: what is kept, the
seeded split by word, and files that the seq2seq reader takes as they are."""

from __future__ import annotations

import pytest
from _load import load_prepare

from rnnkit.data.pairs import read_pairs

prepare = load_prepare("g2p_cmudict")

LINES = [
    ";;; a comment line of an older dictionary format is not a word",
    "abbey AE1 B IY0",
    "abbey(2) AE0 B EY1",  # a variant: the first pronunciation is the one kept
    "ab's AE1 B Z # possessive",
    "a.m. EY2 EH1 M",  # abbreviation: dropped
    "x-ray EH1 K S R EY2",  # compound: dropped
    "3d TH R IY1 D IY1",  # digit: dropped
    "",
    "zoo Z UW1",
]


def test_keeps_first_pronunciation_of_letter_words_without_stress():
    assert prepare.parse_dict(LINES) == {
        "abbey": ["AE", "B", "IY"],
        "ab's": ["AE", "B", "Z"],
        "zoo": ["Z", "UW"],
    }


def test_a_word_without_phonemes_names_its_line():
    with pytest.raises(ValueError, match="line 2: a word without phonemes"):
        prepare.parse_dict(["ok OW1 K EY1", "broken"])


def test_split_is_disjoint_complete_and_seeded():
    entries = {f"w{chr(97 + i)}{chr(97 + j)}": ["AH"] for i in range(5) for j in range(6)}
    parts = prepare.split_words(entries, test=7, valid=5, seed=3)
    words = {p: [w for w, _ in pairs] for p, pairs in parts.items()}
    assert (len(words["test"]), len(words["valid"]), len(words["train"])) == (7, 5, 18)
    assert sorted(words["test"] + words["valid"] + words["train"]) == sorted(entries)
    assert prepare.split_words(entries, test=7, valid=5, seed=3) == parts
    assert prepare.split_words(entries, test=7, valid=5, seed=4) != parts
    with pytest.raises(ValueError, match="30 words cannot give 25 test and 5 valid"):
        prepare.split_words(entries, test=25, valid=5)


def test_files_read_as_source_tab_target_pairs(tmp_path):
    parts = {"train": [("abbey", ["AE", "B", "IY"]), ("zoo", ["Z", "UW"])], "test": []}
    paths = prepare.write_pairs(parts, tmp_path)
    assert paths["train"].read_text(encoding="utf-8") == "abbey\tAE B IY\nzoo\tZ UW\n"
    assert [(p.source, p.target) for p in read_pairs(paths["train"])] == [
        ("abbey", "AE B IY"),
        ("zoo", "Z UW"),
    ]
    assert paths["test"].read_text(encoding="utf-8") == ""
