"""A snapshot's carried state: to named tensors and back, for each kind of state; the random
generators it keeps."""

from __future__ import annotations

import torch

from rnnkit.training import snapshots
from rnnkit.training.snapshots import carry_from, carry_tensors
from rnnkit.types import LSTMState


def test_carried_states_round_trip():
    h, c = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    back = carry_from(carry_tensors(LSTMState(h, c)), torch.device("cpu"))
    assert isinstance(back, LSTMState) and torch.equal(back.h, h) and torch.equal(back.c, c)
    assert torch.equal(carry_from(carry_tensors(h), torch.device("cpu")), h)
    assert carry_tensors(None) == {} and carry_from({"rng/torch": h}, torch.device("cpu")) is None


class _FakeCuda:
    """Two CUDA devices' generators, as ``torch.cuda`` shows them (no GPU here)."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.states = [torch.full((16,), k, dtype=torch.uint8) for k in range(devices)]
        self.restored: list[torch.Tensor] | None = None

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self._set)

    def _set(self, states) -> None:
        self.restored = [s.clone() for s in states]


def test_a_snapshot_keeps_each_cuda_generator_and_resume_restores_it(monkeypatch):
    """Dropout on a GPU draws from the device's generator: without its state a resumed
    run draws other masks than the run it continues."""
    saved = _FakeCuda(2)
    saved.install(monkeypatch)
    states = snapshots._rng_states()
    assert torch.equal(states["rng/torch"], torch.get_rng_state())
    assert states["rng/cuda"].shape == (2, 16)
    resumed = _FakeCuda(2)
    resumed.install(monkeypatch)
    snapshots._restore_rng(states)
    assert resumed.restored is not None
    assert [s.tolist() for s in resumed.restored] == [s.tolist() for s in saved.states]
    fewer = _FakeCuda(1)  # resumed on a machine with one device: that one is restored
    fewer.install(monkeypatch)
    snapshots._restore_rng(states)
    assert fewer.restored is not None and len(fewer.restored) == 1
    assert fewer.restored[0].tolist() == saved.states[0].tolist()


def test_without_cuda_in_use_no_cuda_generator_is_saved(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert set(snapshots._rng_states()) == {"rng/torch"}
