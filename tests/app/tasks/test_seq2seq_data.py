"""A seq2seq run's data (rnnkit.app.tasks.seq2seq_data): the held-out pairs, the
vocabularies and the length checks, against what the file says by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.seq2seq_data import prepare_data
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import DataError

PAIRS = ["ab\tx", "ba\txy", "abc\tyz", "aab\tzzx", "cab\tw"]  # lines 1-5


def config(tmp_path: Path, lines: list[str], **options) -> TrainConfig:
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return TrainConfig(task="seq2seq", train=str(path), **options)


def test_the_last_pairs_are_held_out_and_the_vocabularies_come_from_the_rest(tmp_path) -> None:
    data = prepare_data(config(tmp_path, PAIRS, valid_fraction=0.2, max_len=8))
    assert [p.line for p in data.train_pairs] == [1, 2, 3, 4]
    assert [(p.source, p.target, p.line) for p in data.valid_pairs] == [("cab", "w", 5)]
    assert data.valid_path.endswith("pairs.tsv")
    # Most frequent first (ties in order of first sight): sources a×5, b×4, c×1.
    assert data.source_vocab.itos[4:] == ["a", "b", "c"]
    assert sorted(data.target_vocab.itos[4:]) == ["x", "y", "z"]  # "w" only in validation
    assert [s.tolist() for s in data.train_src] == [[4, 5], [5, 4], [4, 5, 6], [4, 4, 5]]
    stoi = data.target_vocab.stoi
    assert data.valid_tgt[0].tolist() == [1]  # "w" is <unk>
    assert data.train_tgt[1].tolist() == [stoi["x"], stoi["y"]]


def test_given_vocabularies_are_kept(tmp_path) -> None:
    source, target = Vocabulary(["c", "b", "a"]), Vocabulary(["z", "y", "x", "w"])
    data = prepare_data(config(tmp_path, PAIRS, max_len=8), (source, target))
    assert data.source_vocab is source and data.target_vocab is target
    assert data.valid_tgt[0].tolist() == [7]


def test_a_training_side_longer_than_max_len_names_its_line(tmp_path) -> None:
    with pytest.raises(
        DataError, match=r"pairs.tsv:3: the source has 3 tokens, more than --max-len 2"
    ):
        prepare_data(config(tmp_path, PAIRS, max_len=2, valid_fraction=0.2))


def test_length_predict_refuses_a_validation_target_it_cannot_predict(tmp_path) -> None:
    lines = ["ab\tx", "ba\txy", "abc\tyz", "aab\tz", "cab\twwww"]
    cfg = config(tmp_path, lines, max_len=3, length="predict", valid_fraction=0.2)
    with pytest.raises(DataError, match=r"pairs.tsv:5: the target has 4 tokens.*--length predict"):
        prepare_data(cfg)
    assert len(prepare_data(config(tmp_path, lines, max_len=3)).valid_pairs) == 1


def test_too_few_pairs_to_hold_out(tmp_path) -> None:
    with pytest.raises(DataError, match=r"1 pair\(s\): too few to hold out validation pairs"):
        prepare_data(config(tmp_path, ["ab\tx"]))
