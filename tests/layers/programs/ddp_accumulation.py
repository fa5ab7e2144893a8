"""Data-parallel training written as people write it in their own script, without a
trainer: ``torch.multiprocessing.spawn`` starts two CPU processes, each joins a gloo
process group through a file, builds two models (a sequence regressor over an
``nn.LSTM`` with ``batch_first=True``, and a classifier over a bidirectional two-layer
``nn.GRU`` fed a ``PackedSequence``), wraps each in ``DistributedDataParallel`` (its
default ``find_unused_parameters=False``), reads its share of the data through a
``DistributedSampler`` reshuffled each epoch with ``set_epoch``, and accumulates the
gradients of several micro-batches, the non-final ones under ``model.no_sync()``, before
each optimizer step; some micro-batches hold one sequence of a single step. Rank 0
writes its losses and final weights to a file; every rank writes the lengths it saw and
whether each parameter had a gradient at each step. The drop-in tests run it twice (as
``python ddp_accumulation.py OUT``), changing only the import line."""

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD = 2
DTYPE = torch.float64


class Regressor(nn.Module):
    def __init__(self, features=3, hidden=8):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x, lengths):
        out, _ = self.lstm(x)  # (B, T, H)
        last = out[torch.arange(x.shape[0]), lengths - 1]  # each sequence's last real step
        return self.head(last).squeeze(1)


class Classifier(nn.Module):
    def __init__(self, features=3, hidden=6, classes=3):
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=2, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, h_n = self.gru(packed)  # (L·D, B, H)
        return self.head(torch.cat((h_n[-2], h_n[-1]), dim=1))


def make_data(n=18, max_length=6):
    """``n`` series of random lengths (the first two of a single step), a regression
    target and a class for each."""
    generator = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, max_length + 1, (n,), generator=generator)
    lengths[:2] = 1
    x = torch.randn(n, max_length, 3, generator=generator, dtype=DTYPE)
    x = x * (torch.arange(max_length) < lengths.unsqueeze(1)).unsqueeze(2)
    target = x.sum(dim=(1, 2)) * 0.1
    labels = (x[:, 0, 0] > 0).long() + (x[:, 0, 1] > 0).long()
    return TensorDataset(x, lengths, target, labels)


def train(model, loss_of, loader, sampler, epochs=2, micro=3, lr=0.05):
    """Gradient accumulation over ``micro`` micro-batches per step: the gradient is
    all-reduced once, on the last one (``no_sync`` on the others)."""
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, lengths_seen, all_grads = [], [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), micro):
            group = batches[start : start + micro]
            optimizer.zero_grad()
            total = 0.0
            for i, batch in enumerate(group):
                lengths_seen.append(batch[1].tolist())
                last = i == len(group) - 1
                with model.no_sync() if not last else contextlib.nullcontext():
                    loss = loss_of(model, batch) / len(group)
                    loss.backward()
                total += loss.item()
            all_grads.append(all(p.grad is not None for p in model.parameters()))
            optimizer.step()
            losses.append(total)
    return model.module, losses, lengths_seen, all_grads


def worker(rank, out):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=WORLD
    )
    data = make_data()
    sampler = DistributedSampler(data, num_replicas=WORLD, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    torch.manual_seed(0)  # the same initial weights in every process (DDP broadcasts rank 0's)
    regressor = Regressor().to(DTYPE)
    classifier = Classifier().to(DTYPE)
    mse, cross_entropy = nn.MSELoss(), nn.CrossEntropyLoss()
    report = {}
    for name, model, loss_of in (
        ("regressor", regressor, lambda m, b: mse(m(b[0], b[1]), b[2])),
        ("classifier", classifier, lambda m, b: cross_entropy(m(b[0], b[1]), b[3])),
    ):
        model, losses, seen, grads = train(model, loss_of, loader, sampler)
        report[name] = {"losses": losses, "lengths": seen, "all_grads": grads}
        if rank == 0:
            torch.save(model.state_dict(), out / f"{name}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(out,), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main(sys.argv[1])
