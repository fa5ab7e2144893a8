"""Pretrained word vectors (word2vec / GloVe text) and their copy into an embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.pretrained import load_pretrained_vectors
from rnnkit.data.word_vectors import read_word_vectors
from rnnkit.errors import DataError


def test_glove_and_word2vec_text(tmp_path):
    glove = tmp_path / "g.txt"
    glove.write_text("the 0.5 -1 2\ncat 1 2 3\nthe 9 9 9\n", encoding="utf-8")
    got = read_word_vectors(glove, 3)
    assert sorted(got) == ["cat", "the"]
    np.testing.assert_array_equal(got["the"], [0.5, -1, 2])  # the first occurrence wins
    w2v = tmp_path / "w.txt"
    w2v.write_text("2 3\ndog 1 1 1\ncat 0 0 1\n", encoding="utf-8")
    assert sorted(read_word_vectors(w2v, 3, wanted=["cat", "emu"])) == ["cat"]


@pytest.mark.parametrize(
    ("content", "where", "words"),
    [
        ("a 1 2 3\nb 1 2\n", ":2", "has 2 numbers, the embedding is 3 wide"),
        ("a 1 2 x\n", ":1", "not a number: 'x'"),
        ("a 1 2 inf\n", ":1", "not finite"),
        # finite as a Python float, inf in the float32 embedding: the loss was NaN at step 1
        ("a 1 2 1e39\n", ":1", "the vector of 'a' is out of float32's range (±3.4e38)"),
        ("a 1 2 -3.5e38\n", ":1", "out of float32's range"),
        ("", "", "holds no word vectors"),
        ("2 3\n\n  \n", "", "holds no word vectors"),
    ],
)
def test_bad_vector_files_name_file_and_line(tmp_path, content, where, words):
    path = tmp_path / "v.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_word_vectors(path, 3)
    assert str(err.value).startswith(f"{path}{where}: ") and words in str(err.value)


def test_vectors_found_are_copied_and_counted(tmp_path, capsys):
    path = tmp_path / "v.txt"
    path.write_text("cat 1 2\nzebra 5 5\ndog -1 0.5\n", encoding="utf-8")
    torch.manual_seed(0)
    emb = torch.nn.Embedding(4, 2)
    before = emb.weight.detach().clone()
    cfg = TrainConfig(train="x", pretrained_vectors=str(path))
    info = load_pretrained_vectors(cfg, emb, ["<pad>", "dog", "cow", "cat"])
    assert info == {"file": str(path), "found": 2, "vocabulary": 4}
    torch.testing.assert_close(emb.weight[1], torch.tensor([-1.0, 0.5]))
    torch.testing.assert_close(emb.weight[3], torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(emb.weight[[0, 2]], before[[0, 2]])  # not found: unchanged
    assert "2 of 4 vocabulary words found" in capsys.readouterr().err
    # none found: a warning (shown under --quiet), the embedding as it was
    emb = torch.nn.Embedding(2, 2)
    before = emb.weight.detach().clone()
    info = load_pretrained_vectors(cfg, emb, ["<pad>", "cow"])
    assert info is not None and info["found"] == 0
    assert "warning: pretrained vectors: 0 of 2 vocabulary words found" in capsys.readouterr().err
    torch.testing.assert_close(emb.weight, before)


def test_a_taggers_padding_and_boundary_rows_take_no_vector(tmp_path, capsys):
    """A tagger or classifier reads a word "</s>" as an unknown word: the vectors file's
    "</s>" (a fastText .vec file's first word) went into the boundary row and counted as
    found; "<unk>" still takes the unknown word's vector."""
    path = tmp_path / "v.vec"
    path.write_text("</s> 9 9\n<pad> 5 5\n<unk> 7 7\ncat 1 2\n", encoding="utf-8")
    torch.manual_seed(0)
    emb = torch.nn.Embedding(5, 2)
    before = emb.weight.detach().clone()
    cfg = TrainConfig(train="x", pretrained_vectors=str(path))
    tokens = ["<pad>", "<unk>", "<s>", "</s>", "cat"]
    info = load_pretrained_vectors(cfg, emb, tokens, literal_specials=False)
    assert info is not None and info["found"] == 2
    torch.testing.assert_close(emb.weight[[0, 2, 3]], before[[0, 2, 3]])
    torch.testing.assert_close(emb.weight[[1, 4]], torch.tensor([[7.0, 7.0], [1.0, 2.0]]))
    assert "2 of 5 vocabulary words found" in capsys.readouterr().err


def test_invalid_utf8_names_its_own_line(tmp_path):
    # 1,500 good lines (over 8 KB) first: a text stream reported a bad byte lines early,
    # here without a line at all
    path = tmp_path / "v.txt"
    path.write_bytes(b"1501 3\r\n" + b"cat 1 2 3\r\n" * 1500 + b"d\xffg 1 2 3\r\n")
    with pytest.raises(DataError) as err:
        read_word_vectors(path, 3)
    assert str(err.value) == f"{path}:1502: invalid UTF-8 at byte 2 of the line (byte 0xff)"


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes("\ufeffcafé 1 2\r\nthe 3 4\r\n".encode())
    assert sorted(read_word_vectors(path, 2)) == ["café", "the"]
    path.write_bytes("\ufeff2 2\ncafé 1 2\n".encode())  # and the word2vec header is skipped
    assert list(read_word_vectors(path, 2)) == ["café"]
