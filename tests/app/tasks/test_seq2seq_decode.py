"""How a transducer is scored under teacher forcing (rnnkit.app.tasks.seq2seq_decode): the
figures of every pair alone, and one read of the device for a whole evaluation."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit import deferred as deferred_module
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.seq2seq_data import build_model
from rnnkit.app.tasks.seq2seq_decode import teacher_forced_metrics
from rnnkit.bptt.fused import use_fused
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import Vocabulary
from rnnkit.metrics.losses import sequence_cross_entropy
from rnnkit.models.seq2seq import Seq2Seq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
from host_reads import HostReads

VOCAB = Vocabulary(list("abcde"), unit="char")


def pairs(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n`` words of 1-4 letters, each to its reverse."""
    rng = np.random.default_rng(n)
    words = ["".join(rng.choice(list("abcde"), int(rng.integers(1, 5)))) for _ in range(n)]
    return encode_pairs([Pair(w, w[::-1]) for w in words], VOCAB, VOCAB)


@pytest.mark.parametrize(
    ("length", "decoder_only"),
    [("eos", False), ("stop", False), ("predict", False), ("eos", True)],
)
def test_teacher_forced_metrics_read_the_device_once_and_score_each_pair_as_alone(
    monkeypatch, length: str, decoder_only: bool
) -> None:
    """The loss and token accuracy equal the model's on every pair alone, and on a GPU
    (reads counted on the CPU, as the device would see them) the device is read once
    whatever the number of batches: the float64 loss sum and the two counts with the
    model's checks (before: eight or nine reads a batch, sixteen or seventeen with a
    length mechanism). The model runs once a batch (before: twice with a length mechanism,
    once for the loss, once for the logits)."""
    cfg = TrainConfig(
        train="x",
        task="seq2seq",
        hidden=8,
        embedding=4,
        length=length,
        decoder_only=decoder_only,
        max_len=8,
    )
    torch.manual_seed(0)
    model = build_model(cfg, len(VOCAB), len(VOCAB)).train()
    cpu = torch.device("cpu")
    sources, targets = pairs(9)
    nats, hits, tokens = 0.0, 0, 0
    with torch.no_grad():
        model.eval()
        for s, t in zip(sources, targets, strict=True):
            batch = make_pair_batch([s], [t])
            logits = model.target_logits(batch)
            if isinstance(model, Seq2Seq) and model.length is not None:
                mask = model.token_mask(batch)
                nats += float(model.loss(batch).nats)
            else:
                mask = batch.target_mask
                each = sequence_cross_entropy(logits.double(), batch.target_out, mask, "sum")
                nats += float(each)
            hits += int(((logits.argmax(-1) == batch.target_out) & mask).sum())
            tokens += int(mask.sum())
        model.train()
    runs = []
    hook = model.register_forward_hook(lambda *_: runs.append(1))
    eager = teacher_forced_metrics(model, sources, targets, cpu, batch_size=4)
    hook.remove()
    if isinstance(model, Seq2Seq):  # one teacher-forced pass a batch, loss and logits from it
        assert len(runs) == 3
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for n in (9, 18):  # 3 and 5 batches
        with use_fused("fused"), HostReads(model) as counted:
            got = teacher_forced_metrics(model, *pairs(n), cpu, batch_size=4)
        reads.append(dict(counted.sites))
        if n == 9:
            for m in (eager, got):
                assert m["tokens"] == tokens
                assert m["loss_nats"] == pytest.approx(nats / tokens, rel=1e-5)
                assert m["token_accuracy"] == hits / tokens
    assert model.training  # put back as it was
    for sites in reads:
        assert sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites), sites
