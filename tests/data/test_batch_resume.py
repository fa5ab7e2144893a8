"""Any re-iterable with a length as a resumable batcher (``IterableBatches``): an epoch is
one pass, and a restored one goes on with the batches an uninterrupted pass gives."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from rnnkit.data.batch_resume import IterableBatches, resumable_batches
from rnnkit.data.streams import StreamBatcher
from rnnkit.errors import CheckpointError, ConfigError, DataError


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(10)), batch_size=3, shuffle=True)


def test_a_shuffling_loader_resumed_mid_epoch_gives_the_rest_of_the_same_order():
    torch.manual_seed(0)
    straight = IterableBatches(loader())
    whole = [b[0].tolist() for _ in range(2) for b in straight]  # two epochs
    torch.manual_seed(0)
    first = IterableBatches(loader())
    it = iter(first)
    seen = [next(it)[0].tolist(), next(it)[0].tolist()]
    state, rng = first.state_dict(), torch.get_rng_state()
    assert (state["epoch"], state["position"]) == (0, 2)
    torch.manual_seed(99)  # another process: another random state until it is restored
    resumed = IterableBatches(loader())
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # the Trainer restores the random state of the snapshot
    rest = [b[0].tolist() for b in resumed] + [b[0].tolist() for b in resumed]
    assert seen + rest == whole
    assert resumed.epoch == 2 and whole[:4] != whole[4:]  # the second epoch: a new order


def test_state_saved_after_the_last_batch_starts_the_next_epoch():
    done = IterableBatches([[1], [2]])
    it = iter(done)
    assert [next(it), next(it)] == [[1], [2]]
    state = done.state_dict()  # the pass not yet closed: epoch 0, both batches out
    assert (state["epoch"], state["position"]) == (0, 2)
    again = IterableBatches([[1], [2]])
    again.load_state_dict(state)
    assert list(again) == [[1], [2]] and again.epoch == 2


def test_what_cannot_be_a_batcher_is_one_clear_error():
    class Endless(IterableDataset):
        def __iter__(self):
            yield from range(5)

    with pytest.raises(ConfigError, match=r"batches \(DataLoader\) has no length"):
        IterableBatches(DataLoader(Endless(), batch_size=2))
    with pytest.raises(ConfigError, match="is empty"):
        IterableBatches([])

    class Liar:
        def __len__(self):
            return 1

        def __iter__(self):
            yield from ([1], [2])

    with pytest.raises(DataError, match="more than its length, 1"):
        list(IterableBatches(Liar()))
    good = IterableBatches([[1], [2]])
    with pytest.raises(CheckpointError, match="batches"):
        good.load_state_dict({**good.state_dict(), "batches": 3})
    with pytest.raises(CheckpointError, match="epoch_rng"):
        good.load_state_dict({**good.state_dict(), "epoch_rng": [300]})


def test_rnnkits_own_batchers_are_used_as_they_are():
    own = StreamBatcher(list(range(40)), 2, 5)
    assert resumable_batches(own) is own
    wrapped = resumable_batches([[1]])
    assert isinstance(wrapped, IterableBatches) and len(wrapped) == 1


def test_a_distributed_sampler_is_given_each_epoch():
    """Without ``set_epoch`` a DistributedSampler shuffles every epoch the same way."""
    from torch.utils.data.distributed import DistributedSampler

    data = TensorDataset(torch.arange(12))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
    batches = IterableBatches(DataLoader(data, batch_size=3, sampler=sampler))
    got = [[b[0].tolist() for b in batches] for _ in range(3)]
    want = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        want.append([int(i) for i in sampler])
    assert [[i for b in e for i in b] for e in got] == want and want[0] != want[1]
