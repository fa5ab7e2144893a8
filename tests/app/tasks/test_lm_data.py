"""A language model's data: streams and sequences as ``--bptt`` reads them, the
document boundaries, the held-out validation text and the training batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm_data import prepare_lm_data, train_batches
from rnnkit.data.vocab import EOS_ID, UNK_ID
from rnnkit.errors import DataError

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "hat"]


def corpus(lines=80, seed=0):
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + "\n" for _ in range(lines)
    )


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "train.txt").write_text(corpus(80, 0), encoding="utf-8")
    (d / "valid.txt").write_text(corpus(12, 1), encoding="utf-8")
    return d


def tiny(texts, **changes):
    values = dict(train=str(texts / "train.txt"), batch_size=4, bptt="segment:16")
    return TrainConfig(**{**values, **changes}).validate()


def test_stream_split_keeps_every_character_and_cuts_at_a_line(texts):
    data = prepare_lm_data(tiny(texts, valid_fraction=0.2))
    text = (texts / "train.txt").read_text()
    train, valid = data.vocab.decode(data.train_stream), data.vocab.decode(data.valid_stream)
    assert train + valid == text
    assert train.endswith("\n") and 0.15 < len(valid) / len(text) < 0.25
    assert data.train_stream.dtype == np.int64 and UNK_ID not in data.train_stream


def test_lines_ending_in_a_lone_cr_are_held_out_whole(tmp_path):
    """A corpus of old-Mac line ends: the held-out validation text starts at a line, and
    every line is a sequence, as predict reads them."""
    lines = corpus(40, 3).splitlines()
    (tmp_path / "train.txt").write_text("\r".join(lines) + "\r", encoding="utf-8", newline="")
    data = prepare_lm_data(tiny(tmp_path, bptt="full", valid_fraction=0.2))
    assert data.train_seqs is not None and data.valid_seqs is not None
    read = [data.vocab.decode(s) for s in data.train_seqs + data.valid_seqs]
    assert read == lines and "\r" not in data.vocab.itos


def test_line_documents_end_with_eos(texts):
    data = prepare_lm_data(tiny(texts, doc_boundary="line"))
    lines = (texts / "train.txt").read_text().splitlines()
    eos = int((data.train_stream == EOS_ID).sum() + (data.valid_stream == EOS_ID).sum())
    assert eos == len(lines) and data.train_stream[-1] == EOS_ID
    newline = data.vocab.stoi.get("\n", -1)
    assert newline not in data.train_stream and newline not in data.valid_stream


def test_eos_lines_end_with_eos_and_carry_the_state(tmp_path):
    # Penn Treebank style: one sentence per line, a literal <unk>, spaces around words.
    (tmp_path / "ptb.txt").write_text(" a <unk> b \n b a \n\n a <unk> \n", encoding="utf-8")
    cfg = TrainConfig(
        train=str(tmp_path / "ptb.txt"),
        valid=str(tmp_path / "ptb.txt"),
        unit="word",
        doc_boundary="eos",
        bptt="segment:3",
        batch_size=1,
    ).validate()
    data = prepare_lm_data(cfg)
    assert data.vocab.itos[4:] == ["a", "b"]  # <unk> is the special, not a word
    a, b = data.vocab.stoi["a"], data.vocab.stoi["b"]
    expected = [a, UNK_ID, b, EOS_ID, b, a, EOS_ID, a, UNK_ID, EOS_ID]
    assert data.train_stream.tolist() == data.valid_stream.tolist() == expected
    # eos: the state is reset only where an epoch starts; line: after every </s> as well.
    eos_starts = torch.cat([batch.starts for batch in train_batches(cfg, data)], dim=1)
    assert eos_starts[0].nonzero().view(-1).tolist() == [0]
    line = TrainConfig(**{**cfg.to_dict(), "doc_boundary": "line"}).validate()
    line_data = prepare_lm_data(line)
    assert line_data.train_stream.tolist() == expected
    line_starts = torch.cat([batch.starts for batch in train_batches(line, line_data)], dim=1)
    assert line_starts[0].nonzero().view(-1).tolist() == [0, 3, 6]


def test_sequence_mode_has_one_sequence_per_line_cut_at_max_len(texts):
    data = prepare_lm_data(tiny(texts, bptt="full", valid=str(texts / "valid.txt")))
    lines = (texts / "train.txt").read_text().splitlines()
    assert [data.vocab.decode(s) for s in data.train_seqs] == lines
    short = prepare_lm_data(tiny(texts, bptt="window:4", max_len=5, unit="word"))
    assert max(len(s) for s in short.train_seqs) == 5
    n_words = sum(len(s) for s in short.train_seqs + short.valid_seqs)
    assert n_words == len((texts / "train.txt").read_text().split())


def test_corpus_too_small_to_hold_out_validation(tmp_path):
    (tmp_path / "one.txt").write_text("just one line\n")
    cfg = TrainConfig(train=str(tmp_path / "one.txt")).validate()
    with pytest.raises(DataError, match=r"one\.txt: corpus too small.*--valid"):
        prepare_lm_data(cfg)


@pytest.mark.parametrize(
    "options, newline",
    [
        ({"bptt": "segment:16"}, True),
        ({"bptt": "segment:16", "doc_boundary": "eos"}, False),
        ({"bptt": "segment:16", "doc_boundary": "line"}, False),
        ({"bptt": "full"}, False),
        ({"bptt": "window:4"}, False),
        ({"bptt": "full", "condition": "init"}, False),
    ],
)
def test_the_char_vocabulary_holds_a_newline_only_where_a_sequence_does(tmp_path, options, newline):
    text = "a\tab ba\nb\tbb a\na\tba\nb\taab\n" * 3
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    cfg = TrainConfig(train=str(tmp_path / "train.txt"), batch_size=2, valid_fraction=0.3)
    data = prepare_lm_data(TrainConfig(**{**cfg.to_dict(), **options}).validate())
    newline_id = data.vocab.stoi.get("\n")
    assert (newline_id is not None) == newline, data.vocab.itos
    held = np.concatenate(
        [*(data.train_seqs or []), *([] if data.train_stream is None else [data.train_stream])]
    )
    # what the vocabulary holds is what the training data holds: every regular token occurs
    assert set(range(4, len(data.vocab))) <= set(held.tolist()), data.vocab.itos


def test_a_corpus_over_max_corpus_bytes_is_refused_before_it_is_read(tmp_path, monkeypatch):
    # A 2 GB sparse file under the 4 GiB file limit grew to 15 GiB of ids; the corpus has
    # its own limit (1 GiB), checked from the file's size before a byte is read.
    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as f:
        f.truncate((1 << 30) + 1)
    cfg = TrainConfig(train=str(sparse), batch_size=4, bptt="segment:16").validate()
    words = r"file of more than 1,073,741,824 bytes, .*RNNKIT_MAX_CORPUS_BYTES"
    with pytest.raises(DataError, match=words):
        prepare_lm_data(cfg)
    small = tmp_path / "c.txt"
    small.write_text(corpus(40, 2), encoding="utf-8")
    monkeypatch.setenv("RNNKIT_MAX_CORPUS_BYTES", str(small.stat().st_size - 1))
    cfg = TrainConfig(train=str(small), batch_size=4, bptt="segment:16").validate()
    with pytest.raises(DataError, match="RNNKIT_MAX_CORPUS_BYTES"):
        prepare_lm_data(cfg)
    monkeypatch.setenv("RNNKIT_MAX_CORPUS_BYTES", str(small.stat().st_size))
    assert len(prepare_lm_data(cfg).train_stream) > 0


def test_too_few_tokens_for_the_streams_names_the_file_and_the_option(tmp_path):
    """A training text shorter than ``--batch-size`` + 1 tokens was "token stream too short:
    12 tokens cannot fill 32 streams", naming neither the file nor the option to change."""
    (tmp_path / "small.txt").write_text("hello world\n")  # 12 characters
    cfg = TrainConfig(
        train=str(tmp_path / "small.txt"), valid=str(tmp_path / "small.txt"), batch_size=32
    ).validate()
    with pytest.raises(DataError) as info:
        train_batches(cfg, prepare_lm_data(cfg))
    assert str(info.value) == (
        f"{tmp_path / 'small.txt'}: 12 tokens of training text, too few for --batch-size 32 "
        "(that many parallel streams need at least 33 tokens); lower --batch-size"
    )
    cfg = TrainConfig(
        train=str(tmp_path / "small.txt"), valid=str(tmp_path / "small.txt"), batch_size=11
    ).validate()
    assert len(train_batches(cfg, prepare_lm_data(cfg))) == 1  # 11 streams of 1 step


def test_a_validation_text_of_one_token_names_its_file(tmp_path):
    (tmp_path / "train.txt").write_text(corpus(20))
    (tmp_path / "one.txt").write_text("a")
    cfg = TrainConfig(train=str(tmp_path / "train.txt"), valid=str(tmp_path / "one.txt"))
    with pytest.raises(DataError, match=r"one\.txt: 1 token: too short to score"):
        prepare_lm_data(cfg.validate())


@pytest.mark.parametrize("bptt", ["segment:4", "full"])
def test_the_unknown_validation_tokens_are_counted(tmp_path, bptt):
    (tmp_path / "train.txt").write_text("the cat sat\n" * 20, encoding="utf-8")
    # x, y, z and q were never in training: five unknown characters in all
    (tmp_path / "valid.txt").write_text("the xyz\nzq cat\n", encoding="utf-8")
    cfg = TrainConfig(
        train=str(tmp_path / "train.txt"), valid=str(tmp_path / "valid.txt"), bptt=bptt
    ).validate()
    data = prepare_lm_data(cfg)
    assert data.unknown_valid_tokens() == 5


def test_a_large_word_vocabulary_of_every_word_says_what_min_freq_2_keeps(monkeypatch, caplog):
    """75,133 words at --min-freq 1 trained at 296 tokens/s in 2.7 GB, with nothing said
    before; the note says how many were seen once and what --min-freq 2 keeps."""
    from rnnkit.app.tasks import lm_data

    monkeypatch.setattr(lm_data, "LARGE_VOCABULARY", 10)
    words = [f"w{i}" for i in range(30)]
    text = " ".join(words[:8] * 3 + words[8:]) + "\n"  # 8 words thrice, 22 once
    with caplog.at_level("INFO", logger="rnnkit"):
        vocab = lm_data._vocabulary(TrainConfig(train="t", unit="word"), text, newline=False)
    assert len(vocab) > 30
    assert (
        "holds 30 words, 22 of them seen once" in caplog.text
        and "--min-freq 2 keeps 8 " in caplog.text
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="rnnkit"):
        lm_data._vocabulary(TrainConfig(train="t", unit="word", min_freq=2), text, newline=False)
        lm_data._vocabulary(TrainConfig(train="t", unit="char"), text, newline=False)
    assert caplog.text == ""
