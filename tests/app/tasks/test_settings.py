"""What a run's configuration sets up before training (rnnkit.app.tasks.settings)."""

from __future__ import annotations

import random

import numpy as np
import torch

from rnnkit.app.tasks.settings import seed_everything


def test_seeding_a_run_leaves_the_programs_own_generators_alone() -> None:
    """Training reseeded Python's ``random`` and NumPy's global generator, which rnnkit
    never draws from: a calling program's streams changed for nothing."""
    random.seed(123)
    np.random.seed(123)
    a, b = random.random(), np.random.rand()
    random.seed(123)
    np.random.seed(123)
    seed_everything(7)
    assert (random.random(), np.random.rand()) == (a, b)
    first = torch.rand(3)
    seed_everything(7)
    assert torch.equal(torch.rand(3), first)  # torch's own: seeded
