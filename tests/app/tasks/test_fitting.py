"""What ``--resume`` may change, and the optimizer every task builds the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.fitting import check_unchanged, make_optimizer
from rnnkit.errors import CheckpointError


def test_resume_may_change_the_budget_and_the_files_never_the_model(tmp_path: Path) -> None:
    saved = TrainConfig(train="a.txt", out="old", hidden=16, epochs=2)
    moved = TrainConfig(train="b.txt", valid="v.txt", out="new", hidden=16, epochs=5)
    check_unchanged(moved, saved, tmp_path)  # budget, data paths and place: allowed
    wider = TrainConfig(train="a.txt", out="old", hidden=32, layers=2, epochs=2)
    with pytest.raises(CheckpointError, match=r"different options \['hidden', 'layers'\]") as e:
        check_unchanged(wider, saved, tmp_path)
    assert str(e.value).startswith(str(tmp_path / "config.json"))


def test_resume_passes_over_options_the_run_does_not_read(tmp_path: Path) -> None:
    """An older tagger's config.json holds ``bidirectional`` (true where it was given), an
    option the task does not read: a configuration without it resumes the run. A
    classifier reads it: there it is another model."""
    saved = TrainConfig(train="a.txt", task="tag", bidirectional=True, pooling="mean")
    check_unchanged(TrainConfig(train="a.txt", task="tag"), saved, tmp_path)
    two_way = TrainConfig(train="a.txt", task="classify", bidirectional=True)
    with pytest.raises(CheckpointError, match=r"different options \['bidirectional'\]"):
        check_unchanged(TrainConfig(train="a.txt", task="classify"), two_way, tmp_path)


@pytest.mark.parametrize(("name", "kind"), [("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_the_optimizer_is_the_one_asked_for_at_the_given_rate(name: str, kind: type) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = make_optimizer(TrainConfig(train="x", optimizer=name, lr=0.25), model)
    assert type(optimizer) is kind and optimizer.param_groups[0]["lr"] == 0.25
