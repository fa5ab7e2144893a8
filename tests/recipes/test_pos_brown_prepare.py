"""recipes/pos_brown/prepare.py on a tiny generated Brown-format package: tokens split at
the last slash, title/headline/citation markers removed, the split by sample, and files
that the tagger's reader takes as they are."""

from __future__ import annotations

import pytest
from _load import load_prepare

from rnnkit.data.tagged import read_tagged

prepare = load_prepare("pos_brown")


def test_tokens_split_at_the_last_slash_and_markers_go():
    text = (
        "\n\n\tThe/at Grand/jj-tl Jury/nn-tl-hl 1/2/cd ``/`` it's/pps+bez ./.\n\n\tNo/at-nc ./.\n"
    )
    assert prepare.parse_sample(text) == [
        [("The", "at"), ("Grand", "jj"), ("Jury", "nn"), ("1/2", "cd"), ("``", "``"),
         ("it's", "pps+bez"), (".", ".")],
        [("No", "at"), (".", ".")],
    ]  # fmt: skip


def test_a_token_without_a_tag_names_the_sample_and_line():
    with pytest.raises(ValueError, match=r"cb07:3: 'word' is not word/tag"):
        prepare.parse_sample("\n\n\tok/uh word\n", "cb07")


def test_split_by_sample_every_genre_in_every_part():
    names = [f"c{g}{i:02d}" for g in "ab" for i in range(1, 11)]
    parts = prepare.split_samples(reversed(names))  # the order found on disk does not matter
    assert parts["valid"] == ["ca09", "cb09"] and parts["test"] == ["ca10", "cb10"]
    assert len(parts["train"]) == 16 and not set(parts["train"]) & {"ca09", "cb10"}


def test_prepare_writes_token_tab_tag_files_the_tagger_reads(tmp_path):
    package = tmp_path / "package"
    package.mkdir()
    for i in range(1, 11):  # 10 samples: 8 train, 1 valid, 1 test
        (package / f"ca{i:02d}").write_text(
            f"\n\n\tWord{i}/np-tl ran/vbd ./.\n\n\tIt/pps did/dod-hl ./.\n", encoding="utf-8"
        )
    (package / "README").write_text("not a sample\n", encoding="utf-8")
    counts = prepare.prepare(package, tmp_path / "data")
    assert counts == {"train": (8, 16), "valid": (1, 2), "test": (1, 2)}
    sentences, fmt = read_tagged(tmp_path / "data" / "test.tsv")
    assert fmt != "conllu"
    assert [(s.tokens, s.tags) for s in sentences] == [
        (["Word10", "ran", "."], ["np", "vbd", "."]),
        (["It", "did", "."], ["pps", "dod", "."]),
    ]
    with pytest.raises(ValueError, match="no Brown sample files"):
        prepare.prepare(tmp_path / "data", tmp_path / "out")


def test_news_split_is_the_news_section_shuffled_and_cut_80_10_10(tmp_path):
    import random

    package = tmp_path / "package"
    package.mkdir()
    for i in range(1, 6):  # news: 5 samples of 4 sentences each
        (package / f"ca{i:02d}").write_text(
            "".join(f"\n\n\tw{i}_{j}/nn-tl ./.\n" for j in range(4)), encoding="utf-8"
        )
    (package / "cb01").write_text("\n\n\tNot/at news/nn ./.\n", encoding="utf-8")
    counts = prepare.prepare_news(package, tmp_path / "news")
    assert counts == {"train": (5, 16), "valid": (5, 2), "test": (5, 2)}
    # The oracle: the 20 sentences in sample order, shuffled by random.Random(0).
    words = [f"w{i}_{j}" for i in range(1, 6) for j in range(4)]
    random.Random(0).shuffle(words)
    parts = {}
    for part in ("train", "valid", "test"):
        sentences, _ = read_tagged(tmp_path / "news" / f"{part}.tsv")
        assert all(s.tags == ["nn", "."] for s in sentences)  # markers gone, as in prepare()
        parts[part] = [s.tokens[0] for s in sentences]
    assert parts == {"train": words[:16], "valid": words[16:18], "test": words[18:]}
    with pytest.raises(ValueError, match="no news samples"):
        prepare.prepare_news(tmp_path / "news", tmp_path / "out")
