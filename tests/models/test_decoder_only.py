"""Decoder-only translation: ``<s> x <sep> y`` layout, loss on the target part only,
causality, overfitting, batched decoding equal to one source at a time."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rnnkit.app.tasks.seq2seq_data import batch_to
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, Vocabulary
from rnnkit.generation.seq2seq_search import beam_search
from rnnkit.models.decoder_only import build_decoder_only, joint_sequences
from rnnkit.models.spec import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from host_reads import step_reads

SRC = Vocabulary(list("abcde"))
TGT = Vocabulary(list("edcba"))  # other ids for the same letters: the sides are separate
WORDS = ["abcd", "bcae", "dab", "ecdba", "cc"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def batch_of(words=WORDS):
    src, tgt = encode_pairs([Pair(w, w[::-1]) for w in words], SRC, TGT)
    return make_pair_batch(src, tgt)


def model(seed=0, **options):
    torch.manual_seed(seed)
    settings = {"hidden": 32, "embedding": 16, "cell": "lstm", **options}
    return build_decoder_only(ModelSpec(**settings), len(SRC), len(TGT))


def test_joint_layout_is_bos_source_sep_target():
    b = batch_of(["ab", "c"])
    x, mask, pos = joint_sequences(b.source, b.source_mask, b.target_in, b.target_mask, 9)
    sep = 9 + BOS_ID
    a, bb, c = (SRC.stoi[ch] for ch in "abc")
    ta, tb, tc = (9 + TGT.stoi[ch] for ch in "abc")
    assert x[0].tolist() == [BOS_ID, a, bb, sep, tb, ta]
    assert x[1, :4].tolist() == [BOS_ID, c, sep, tc] and mask[1].tolist() == [1, 1, 1, 1, 0, 0]
    # The output at the <sep> position predicts y_1; the last one predicts </s>.
    assert pos[0].tolist() == [3, 4, 5] and pos[1].tolist() == [2, 3, 0]


def test_loss_counts_target_positions_only():
    m = model()
    b = batch_of()
    out = m.loss(b)
    assert out.tokens == int(b.target_mask.sum())
    # Reference: run the LM on each joint row alone and score only y_1..y_m </s>.
    total = 0.0
    for i, w in enumerate(WORDS):
        x, _, pos = joint_sequences(
            b.source[i : i + 1, : len(w)], b.source_mask[i : i + 1, : len(w)],
            b.target_in[i : i + 1, : len(w) + 1], b.target_mask[i : i + 1, : len(w) + 1], len(SRC),
        )  # fmt: skip
        logp = torch.log_softmax(m.lm(x).logits[0], -1)
        targets = b.target_out[i, : len(w) + 1]
        total -= float(logp[pos[0], targets].sum().detach())
    assert out.nats == pytest.approx(total, rel=1e-5)


def test_target_predictions_are_causal_and_ignore_the_source_loss():
    m = model(seed=1)
    b = batch_of()
    base = m.target_logits(b)
    changed = b._replace(target_in=b.target_in.clone())
    changed.target_in[:, 3:] = TGT.stoi["a"]  # change inputs from step 3 on
    after = m.target_logits(changed)
    torch.testing.assert_close(after[:, :3], base[:, :3])


def test_overfits_and_decodes_every_source():
    m = model(hidden=48)
    b = batch_of()
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(100):
        opt.zero_grad()
        out = m.loss(b)
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.05
    m.eval()
    for beam in (1, 3):
        hyps = m.decode(b.source, b.source_mask, beam=beam, max_length=10)
        assert [TGT.decode(h[0].ids) for h in hyps] == [w[::-1] for w in WORDS]


def test_beam_one_equals_greedy_and_batching_changes_nothing():
    m = model(seed=2).eval()
    b = batch_of()
    greedy = [h[0].ids for h in m.decode(b.source, b.source_mask, beam=1, max_length=7)]
    with torch.no_grad():
        state = m.encode_source(b.source, b.source_mask)
        beam1 = beam_search(
            m, state, 2, beam=1, max_length=7, bos_id=BOS_ID, eos_id=EOS_ID, forbid=NEVER_GENERATED
        )
    assert [h[0].ids for h in beam1] == greedy
    beam3 = [h[0].ids for h in m.decode(b.source, b.source_mask, beam=3, max_length=7)]
    for i, w in enumerate(WORDS):
        one = batch_of([w])
        assert m.decode(one.source, one.source_mask, beam=1, max_length=7)[0][0].ids == greedy[i]
        assert m.decode(one.source, one.source_mask, beam=3, max_length=7)[0][0].ids == beam3[i]


def test_scheduled_sampling_is_refused():
    with pytest.raises(ValueError, match="encoder–decoder"):
        model().loss(batch_of(), sampling_p=0.5)


def test_tied_weights_use_the_target_rows_of_the_embedding():
    m = model(tie_weights=True, hidden=16, embedding=16)
    b = batch_of()
    m.loss(b).loss.backward()
    grad = m.lm.embedding.weight.grad
    assert grad[len(SRC) :].abs().sum() > 0
    assert m.lm.head.embedding is m.lm.embedding


# A decoder-only step reads the device once (the step's figures): its joint rows from the
# masks' host copies, not the longest row's length read from the device.


HERE = torch.device("cpu")  # HostReads marks what is moved to a torch.device


def test_a_decoder_only_step_reads_the_device_once(monkeypatch) -> None:
    torch.manual_seed(0)
    model = build_decoder_only(ModelSpec(hidden=8, embedding=4), 9, 7)
    batch = make_pair_batch(
        [np.array([4, 5, 6]), np.array([7])], [np.array([4]), np.array([5, 6, 4])]
    )
    expected = model.loss(batch)
    sites, (nats, tokens) = step_reads(
        model, monkeypatch, lambda: model.loss(batch_to(batch, HERE))
    )
    assert _one_read(sites), sites
    assert tokens == expected.tokens and abs(nats - expected.nats) < 1e-5


def _one_read(sites) -> bool:
    """One read of the device in all: the step's own, in ``rnnkit.deferred``."""
    return sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites)
