"""label<TAB>text reader, label sets and the seeded hold-out split."""

from __future__ import annotations

import pytest

from rnnkit.data.labelled import LabelledExample, LabelSet, read_labelled, split_holdout
from rnnkit.errors import DataError


def test_reads_examples_with_line_numbers(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("pos\tgood film\n\n neg \tbad, very bad\n", encoding="utf-8")
    assert read_labelled(p) == [
        LabelledExample("pos", "good film", 1),
        LabelledExample("neg", "bad, very bad", 3),
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("pos good", "line has no tab (expected label<TAB>text)"),
        ("\tgood", "empty label (expected label<TAB>text)"),
        ("  \tgood", "empty label (expected label<TAB>text)"),
        ("pos\t", "empty text (expected label<TAB>text)"),
        ("pos\t   ", "empty text (expected label<TAB>text)"),
        # An id<TAB>label<TAB>text file trained on the ids as labels, silently.
        (
            "7\tpos\tgood",
            "3 tab-separated columns, expected 2 (label<TAB>text; a tab inside "
            "the text: write a space)",
        ),
        (
            "pos\tgood\t\tx",
            "4 tab-separated columns, expected 2 (label<TAB>text; a tab "
            "inside the text: write a space)",
        ),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad, message):
    p = tmp_path / "c.tsv"
    p.write_text(f"pos\tfine\nneg\tfine\n{bad}\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_labelled(p)
    assert str(info.value) == f"{p}:3: {message}"


def test_empty_and_missing_files(tmp_path):
    p = tmp_path / "e.tsv"
    p.write_text("\n \n", encoding="utf-8")
    with pytest.raises(DataError, match="empty corpus"):
        read_labelled(p)
    with pytest.raises(DataError, match="file not found"):
        read_labelled(tmp_path / "nope.tsv")


def test_label_set_roundtrip_and_errors(tmp_path):
    ls = LabelSet.from_data(["b", "a", "c", "a"])
    assert ls.labels == ["a", "b", "c"] and ls.index("c") == 2 and "zz" not in ls
    ls.save(tmp_path / "labels.json")
    assert LabelSet.load(tmp_path / "labels.json") == ls
    (tmp_path / "bad.json").write_text('{"format": "other"}', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.json: not a label set"):
        LabelSet.load(tmp_path / "bad.json")
    with pytest.raises(DataError, match="duplicate"):
        LabelSet(["a", "a"])


def test_split_holdout_is_seeded_and_disjoint():
    items = list(range(50))
    train, held = split_holdout(items, 0.2, seed=3)
    assert len(held) == 10 and sorted(train + held) == items
    assert split_holdout(items, 0.2, seed=3) == (train, held)
    assert split_holdout(items, 0.2, seed=4) != (train, held)
    with pytest.raises(DataError, match="too few"):
        split_holdout([1], 0.1)
    with pytest.raises(DataError) as info:  # the file is named (it was not)
        split_holdout([1, 2], 0.9, path="train.tsv")
    assert str(info.value) == (
        "train.tsv: 2 examples are too few to hold out 90% for validation; pass --valid"
    )


def test_a_negative_seed_splits_as_its_64_bit_twin():
    items = list(range(20))
    assert split_holdout(items, 0.25, seed=-1) == split_holdout(items, 0.25, seed=2**64 - 1)
    assert split_holdout(items, 0.25, seed=-1) != split_holdout(items, 0.25, seed=0)
