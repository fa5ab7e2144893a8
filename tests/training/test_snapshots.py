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


# Under torchrun on CUDA each rank draws its dropout masks from its own device's
# generator (rank r: cuda:r). Only rank 0 writes the snapshot, so the snapshot carries
# rank 0's own device generator, and every rank restores it into its own device: all
# ranks seed alike and draw the same shapes, so rank 0's generator is every rank's.


class _FakeCudaProcess:
    """torch.cuda's per-device default generators as one process sees them (no GPU)."""

    def __init__(self, devices: int, fill: int) -> None:
        self.states = {i: torch.full((16,), fill, dtype=torch.uint8) for i in range(devices)}

    def install(self, monkeypatch) -> None:
        n = len(self.states)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(
            torch.cuda, "get_rng_state_all", lambda: [self.states[i] for i in range(n)]
        )

        def get(device="cuda"):
            return self.states[torch.device(device).index].clone()

        def set_one(state, device="cuda"):
            self.states[torch.device(device).index] = state.clone()

        def set_all(states):
            for i, s in enumerate(states):
                set_one(s, torch.device("cuda", i))

        monkeypatch.setattr(torch.cuda, "get_rng_state", get)
        monkeypatch.setattr(torch.cuda, "set_rng_state", set_one)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)


def test_every_rank_resumes_the_generator_its_own_gpu_draws_from(monkeypatch):
    # rank 0's process at the snapshot: cuda:0 advanced by training (7), cuda:1 untouched
    # in THIS process (0: the seed's state; rank 1 advanced cuda:1 in ITS process)
    rank0 = _FakeCudaProcess(2, fill=0)
    rank0.states[0] = torch.full((16,), 7, dtype=torch.uint8)
    rank0.install(monkeypatch)
    extra = snapshots._rng_states(torch.device("cuda", 0))

    # rank 1 resumes on cuda:1: it must continue from the advanced state, not the seed's
    rank1 = _FakeCudaProcess(2, fill=0)
    rank1.install(monkeypatch)
    snapshots._restore_rng(extra, torch.device("cuda", 1))
    assert rank1.states[1].tolist() == [7] * 16

    # one process resuming on cuda:0 (the usual case) is unchanged
    single = _FakeCudaProcess(2, fill=0)
    single.install(monkeypatch)
    snapshots._restore_rng(extra, torch.device("cuda", 0))
    assert single.states[0].tolist() == [7] * 16
