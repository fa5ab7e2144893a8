"""recipes/ptb_lm/prepare.py on a tiny generated corpus: the files written, the final
newline, and the MD5 check that guards against a different corpus."""

from __future__ import annotations

import hashlib

import pytest
from _load import load_prepare

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm import prepare_lm_data
from rnnkit.data.vocab import EOS_ID, UNK_ID

prepare = load_prepare("ptb_lm")

TEXTS = {
    "train": " the cat <unk> sat \n a dog sat \n\n",  # the package's train text ends "\n\n"
    "valid": " the dog sat \n",
    "test": " a cat \n",
}


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def test_writes_each_part_with_one_final_newline(tmp_path):
    expected = {
        "train": " the cat <unk> sat \n a dog sat \n",
        **{p: TEXTS[p] for p in ("valid", "test")},
    }
    paths = prepare.write_corpus(TEXTS, tmp_path / "data", {p: md5(t) for p, t in expected.items()})
    for part, text in expected.items():
        assert paths[part] == tmp_path / "data" / f"ptb.{part}.txt"
        assert paths[part].read_text(encoding="utf-8") == text


def test_a_different_corpus_is_refused_naming_the_file(tmp_path):
    sums = {p: md5(t) for p, t in TEXTS.items()}  # train's sum is of the text before the fix
    with pytest.raises(ValueError, match=r"ptb\.train\.txt: MD5 [0-9a-f]{32} is not"):
        prepare.write_corpus(TEXTS, tmp_path, sums)
    with pytest.raises(ValueError, match="no 'test' text"):
        prepare.write_corpus({"train": "a\n", "valid": "a\n"}, tmp_path)


def test_the_written_corpus_reads_as_sentences_ending_with_eos(tmp_path):
    paths = prepare.write_corpus(TEXTS, tmp_path)
    cfg = TrainConfig(
        train=str(paths["train"]),
        valid=str(paths["valid"]),
        unit="word",
        doc_boundary="eos",
        bptt="segment:2",
        batch_size=1,
    ).validate()
    data = prepare_lm_data(cfg)
    words = [data.vocab.itos[i] if i >= 4 else i for i in data.train_stream.tolist()]
    assert words == ["the", "cat", UNK_ID, "sat", EOS_ID, "a", "dog", "sat", EOS_ID]
