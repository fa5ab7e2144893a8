"""Sequence-length mechanisms (stop output, predicted length) on the LM and the seq2seq
decoder: hand-computed losses, training loss = exact sequence NLL scored step by step,
generation stops where it should, and both mechanisms learn lengths on tiny tasks."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from rnnkit import GRU, LSTM
from rnnkit import deferred as deferred_module
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import to_device
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, Vocabulary
from rnnkit.errors import ConfigError
from rnnkit.generation.search import generate_batch
from rnnkit.layers.attention import Attention
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.length import LengthState, SequenceLength, length_targets
from rnnkit.models.seq2seq import STATE_BATCH_DIM, Seq2Seq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from host_reads import HostReads

V, E, H, R, MAX = 7, 4, 8, 3, 6
A, B_ = 4, 5  # ids of "a" and "b"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def lm_with(mode: str, seed=0, hidden=H, cell=GRU) -> LanguageModel:
    torch.manual_seed(seed)
    length = SequenceLength(mode, hidden, context_size=hidden, max_length=MAX, remaining_size=R)
    enc = cell(E + length.input_size, hidden)
    return LanguageModel(nn.Embedding(V, E), enc, nn.Linear(hidden, V), length=length)


def sentences(seqs):
    """``<s> y`` inputs, ``y </s>`` targets and the mask of token lists."""
    T = max(len(s) for s in seqs) + 1
    inputs = torch.zeros(len(seqs), T, dtype=torch.long)
    targets, mask = torch.zeros_like(inputs), torch.zeros_like(inputs, dtype=torch.bool)
    for i, s in enumerate(seqs):
        inputs[i, : len(s) + 1] = torch.tensor([BOS_ID, *s])
        targets[i, : len(s) + 1] = torch.tensor([*s, EOS_ID])
        mask[i, : len(s) + 1] = True
    return inputs, targets, mask


def test_length_targets():
    _, targets, mask = sentences([[A, B_, A], [B_]])
    lt = length_targets(targets, mask)
    assert lt.lengths.tolist() == [3, 1]
    assert lt.token_mask.tolist() == [[True] * 3 + [False], [True, False, False, False]]
    assert lt.last.nonzero().tolist() == [[0, 2], [1, 0]]
    with pytest.raises(ValueError, match="row 0"):
        length_targets(torch.tensor([[A, B_]]), None)  # no </s>: a stream segment
    with pytest.raises(ValueError, match="row 0"):
        length_targets(torch.tensor([[A, EOS_ID, A, EOS_ID]]), None)
    with pytest.raises(ValueError, match="empty"):
        length_targets(torch.tensor([[EOS_ID]]), None)


def zero_outputs(lm: LanguageModel) -> None:
    """Uniform token head (over the V − 1 non-</s> tokens), s = ½, uniform P(T)."""
    with torch.no_grad():
        for module in (lm.head, lm.length.stop, lm.length.length):
            if module is not None:
                module.weight.zero_()
                module.bias.zero_()


def test_stop_loss_by_hand():
    lm = lm_with("stop")
    zero_outputs(lm)
    inputs, targets, mask = sentences([[A, B_, A], [B_]])
    out = lm.loss(inputs, targets, mask)
    # 4 tokens at 1/6 each (</s> is not a token) and 4 stop bits at ½.
    assert out.tokens == 4
    assert out.nats == pytest.approx(4 * math.log(6) + 4 * math.log(2))
    assert out.loss.item() == pytest.approx(math.log(12))


def test_predict_loss_by_hand():
    lm = lm_with("predict")
    zero_outputs(lm)
    inputs, targets, mask = sentences([[A, B_, A], [B_]])
    out = lm.loss(inputs, targets, mask)
    # 4 tokens at 1/6 each and two lengths at 1/MAX each.
    assert out.nats == pytest.approx(4 * math.log(6) + 2 * math.log(MAX))
    assert out.loss.item() == pytest.approx(math.log(6) + math.log(MAX) / 2)


def score_by_steps(model, seq, state):
    """−Σ log p of ``seq`` then ``</s>`` under ``model.step`` (free-running scoring)."""
    nats, token = 0.0, torch.tensor([BOS_ID])
    for y in [*seq, EOS_ID]:
        lp, state = model.step(token, state)
        nats -= float(lp[0, y])
        token = torch.tensor([y])
    return nats


@pytest.mark.parametrize("mode", ["stop", "predict"])
@pytest.mark.parametrize("cell", [GRU, LSTM])
@torch.no_grad()
def test_training_loss_is_the_sequence_nll_scored_step_by_step(mode, cell):
    lm = lm_with(mode, cell=cell).double().eval()
    seqs = [[A, B_, A, 6], [B_, 6]]
    out = lm.loss(*sentences(seqs))
    total = 0.0
    for seq in seqs:
        if mode == "stop":
            total += score_by_steps(lm, seq, None)
        else:
            context = torch.zeros(1, H, dtype=torch.float64)
            T = torch.tensor([len(seq)])
            total += score_by_steps(lm, seq, LengthState(None, lm.length.start(1, context, T)))
            total -= float(lm.length.length_log_probs(context)[0, len(seq) - 1])
    assert out.nats == pytest.approx(total, rel=1e-10)


def test_stop_generation_stops_on_the_stop_output():
    lm = lm_with("stop").eval()
    for bias, finished in ((30.0, True), (-30.0, False)):
        with torch.no_grad():
            lm.length.stop.bias.fill_(bias)
        hyps = generate_batch(
            lm, [[BOS_ID]] * 3, max_length=6, eos_id=EOS_ID, strategy="sample",
            state_batch_dim=lm.state_batch_dim, generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        for (h,) in hyps:
            assert h.finished is finished
            assert len(h.ids) == (1 if finished else 6)
            assert EOS_ID not in h.ids


def test_predict_generation_draws_exactly_t_tokens():
    lm = lm_with("predict").eval()
    g = torch.Generator().manual_seed(0)
    T = torch.tensor([1, 4, 2])
    state = LengthState(None, lm.length.start(3, torch.zeros(3, H), T))
    hyps = generate_batch(
        lm, None, bos_id=BOS_ID, eos_id=EOS_ID, max_length=MAX + 1, strategy="sample",
        state=state, state_batch_dim=lm.state_batch_dim, generator=g,
    )  # fmt: skip
    assert [len(h[0].ids) for h in hyps] == T.tolist()
    assert all(h[0].finished for h in hyps)
    # Without given lengths the first step chooses T greedily from h_0 = 0.
    (h,) = generate_batch(lm, [[BOS_ID]], max_length=MAX + 1, eos_id=EOS_ID)[0:1][0]
    best = int(lm.length.length_log_probs(torch.zeros(1, H)).argmax()) + 1
    assert len(h.ids) == best and h.finished


def test_lm_step_with_a_mechanism_names_the_state_it_needs():
    # The step's own state is a LengthState; a bare recurrent state is one clear line
    # (it used to be an AttributeError on ``.extra``).
    lm = lm_with("stop").eval()
    token = torch.tensor([A, B_])
    log_probs, state = lm.step(token)
    assert isinstance(state, LengthState) and log_probs.shape == (2, V)
    with pytest.raises(TypeError, match="the generation state is a LengthState"):
        lm.step(token, state.hidden)


def train(model, loss_fn, steps, lr=0.03):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        out = loss_fn()
        out.loss.backward()
        opt.step()
    return out


def test_lm_stop_learns_lengths_from_content():
    # "a a a" and "b b b b b": after the first token, when to stop depends on it.
    lm = lm_with("stop", hidden=16)
    batch = sentences([[A] * 3, [B_] * 5])
    out = train(lm, lambda: lm.loss(*batch), 150)
    assert out.loss.item() < 0.2  # the first token is a coin: ln 2 / 8 = 0.087
    lm.eval()
    hyps = generate_batch(
        lm, [[BOS_ID, A], [BOS_ID, B_]], max_length=10, eos_id=EOS_ID,
        state_batch_dim=lm.state_batch_dim,
    )  # fmt: skip
    assert [h[0].ids for h in hyps] == [[A] * 2, [B_] * 4]
    assert all(h[0].finished for h in hyps)


def test_lm_predict_learns_the_length_and_uses_the_steps_remaining():
    # Lengths 3 (twice as often) and 5; the last token is "b": only the steps remaining
    # tell the model where that is.
    lm = lm_with("predict", hidden=16)
    batch = sentences([[A, A, B_], [A, A, B_], [A] * 4 + [B_]])
    train(lm, lambda: lm.loss(*batch), 150)
    lm.eval()
    (h,) = generate_batch(lm, [[BOS_ID]], max_length=10, eos_id=EOS_ID)[0]
    assert h.ids == [A, A, B_]  # T = 3, the most probable length
    p = lm.length.length_log_probs(torch.zeros(1, 16)).exp()[0]
    assert p[2].item() == pytest.approx(2 / 3, abs=0.05)
    state = LengthState(None, lm.length.start(1, torch.zeros(1, 16), torch.tensor([5])))
    (h,) = generate_batch(
        lm, None, bos_id=BOS_ID, eos_id=EOS_ID, max_length=10, state=state,
        state_batch_dim=lm.state_batch_dim,
    )[0]  # fmt: skip
    assert h.ids == [A] * 4 + [B_]


# ----------------------------------------------------------------------- seq2seq

VOCAB = Vocabulary(list("abcde"))


def seq2seq_with(mode, attention=False, seed=0, hidden=16):
    torch.manual_seed(seed)
    Vs = len(VOCAB)
    features = hidden * (2 if attention else 1)
    length = SequenceLength(mode, features, context_size=hidden, max_length=MAX, remaining_size=R)
    width = E + length.input_size + (hidden if attention else 0)
    return Seq2Seq(
        nn.Embedding(Vs, E), GRU(E, hidden), nn.Embedding(Vs, E), GRU(width, hidden),
        nn.Linear(features, Vs), attention=Attention("dot", hidden, hidden) if attention else None,
        length=length,
    )  # fmt: skip


def count_batch(words):
    """Target: the first letter repeated once per source letter (length from the source)."""
    src, tgt = encode_pairs([Pair(w, w[0] * len(w)) for w in words], VOCAB, VOCAB)
    return make_pair_batch(src, tgt)


WORDS = ["a", "bc", "cde", "dabe", "ebcda", "ba", "ceb"]


@pytest.mark.parametrize("mode", ["stop", "predict"])
def test_seq2seq_learns_lengths_from_the_source(mode):
    model = seq2seq_with(mode)
    batch = count_batch(WORDS)
    out = train(model, lambda: model.loss(batch), 200)
    assert out.loss.item() < 0.05
    model.eval()
    hyps = model.decode(batch.source, batch.source_mask, max_length=10)
    assert [VOCAB.decode(h[0].ids) for h in hyps] == [w[0] * len(w) for w in WORDS]
    assert all(h[0].finished for h in hyps)
    beams = model.decode(batch.source, batch.source_mask, beam=3, max_length=10)
    assert [h[0].ids for h in beams] == [h[0].ids for h in hyps]


@pytest.mark.parametrize("mode", ["stop", "predict"])
@torch.no_grad()
def test_seq2seq_loss_is_the_sequence_nll_scored_step_by_step(mode):
    model = seq2seq_with(mode, attention=True).double().eval()
    batch = count_batch(["abc", "d"])
    out = model.loss(batch)
    total = 0.0
    for i in range(2):
        state, context = model._encode(batch.source[i : i + 1], batch.source_mask[i : i + 1])
        m = int(batch.target_mask[i].sum()) - 1
        seq = batch.target_out[i, :m].tolist()
        if mode == "predict":
            state = state._replace(length=model.length.start(1, context, torch.tensor([m])))
            total -= float(model.length.length_log_probs(context)[0, m - 1])
        total += score_by_steps(model, seq, state)
    assert out.nats == pytest.approx(total, rel=1e-10)
    assert STATE_BATCH_DIM.length == 0


@pytest.mark.parametrize("mode", ["stop", "predict"])
def test_teacher_forced_metrics_leave_the_eos_step_out(mode):
    from rnnkit.app.tasks.seq2seq import teacher_forced_metrics

    model = seq2seq_with(mode, attention=True).eval()
    batch = count_batch(["abc", "d", "bb"])
    logits = model.target_logits(batch)
    # </s> is no token: never the argmax, and its step is not scored.
    assert bool(torch.isneginf(logits[..., EOS_ID]).all())
    mask = model.token_mask(batch)
    assert mask.sum(1).tolist() == [3, 1, 2]
    assert not bool((mask & (batch.target_out == EOS_ID)).any())
    sources = [s[m].numpy() for s, m in zip(batch.source, batch.source_mask, strict=True)]
    targets = [t[m][:-1].numpy() for t, m in zip(batch.target_out, batch.target_mask, strict=True)]
    got = teacher_forced_metrics(model, sources, targets, torch.device("cpu"), batch_size=2)
    hits = ((logits.argmax(-1) == batch.target_out) & mask).sum()
    assert got["tokens"] == 6 and got["token_accuracy"] == pytest.approx(float(hits) / 6)
    # The loss is the training loss: the exact sequence NLL per token step.
    assert got["loss_nats"] == pytest.approx(model.loss(batch).nats / 6, rel=1e-5)


def test_default_decoder_has_no_length_state():
    torch.manual_seed(0)
    m = Seq2Seq(nn.Embedding(9, E), GRU(E, H), nn.Embedding(9, E), GRU(E, H), nn.Linear(H, 9))
    src = torch.tensor([[4, 5]])
    assert m.encode(src, src != 0).length is None


def test_bad_arguments_are_named():
    with pytest.raises(ConfigError, match="length must be one of"):
        SequenceLength("eos", H)
    with pytest.raises(ValueError, match="max_length"):
        SequenceLength("predict", H, context_size=H)
    with pytest.raises(ValueError, match="context_size"):
        SequenceLength("predict", H, max_length=4)
    length = SequenceLength("predict", H, context_size=H, max_length=2, remaining_size=R)
    with pytest.raises(ValueError, match="length input 3"):
        LanguageModel(nn.Embedding(V, E), GRU(E, H), nn.Linear(H, V), length=length)
    lm = lm_with("predict")
    with pytest.raises(ValueError, match="max_length = 6"):
        lm.loss(*sentences([[A] * 7]))
    with pytest.raises(ValueError, match="lengths"):
        lm(torch.tensor([[BOS_ID, A]]))
    with pytest.raises(ValueError, match="features_size"):
        seq2seq_with("stop", attention=False, hidden=16).__class__(
            nn.Embedding(9, E), GRU(E, H), nn.Embedding(9, E), GRU(E, H), nn.Linear(H, 9),
            length=SequenceLength("stop", H + 1),
        )  # fmt: skip
    model = seq2seq_with("stop")
    with pytest.raises(ConfigError, match="scheduled sampling"):
        model.loss(count_batch(["ab"]), sampling_p=0.5)


# A length mechanism's training loss inside rnnkit.deferred.deferring reads nothing from
# the device (on a GPU each read of a flag, a count or a boolean-mask selection waits).


V, E, H, MAX = 7, 4, 8, 6


@pytest.mark.parametrize("mode", ["stop", "predict"])
def test_a_length_loss_leaves_its_reads_to_the_step(monkeypatch, mode: str) -> None:
    lm = lm_with(mode, cell=LSTM)
    inputs, targets, mask = sentences([[4, 5, 4], [5], [6, 6]])
    with use_fused("fused"):
        direct = lm.loss(inputs, targets, mask=mask)
    direct.loss.backward()
    grads = [p.grad.clone() for p in lm.parameters()]
    lm.zero_grad()

    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    # the layers on the path a GPU takes (PyTorch's fused kernels), as tests/training's
    with use_fused("fused"), HostReads(lm) as reads, deferred_module.deferring() as deferred:
        # moved as a task moves a batch (HostReads marks them as on the device)
        here = torch.device("cpu")
        x, y, m = to_device(inputs, here), to_device(targets, here), move_mask(mask, here)
        out = lm.loss(x, y, mask=m)
        out.loss.backward()
        nats, tokens = deferred.read(out.nats, out.tokens)
    assert _one_read(reads.sites), dict(reads.sites)
    assert tokens == direct.tokens and nats == pytest.approx(direct.nats, rel=1e-6)
    assert float(out.loss.detach()) == pytest.approx(float(direct.loss.detach()), rel=1e-6)
    for p, g in zip(lm.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_a_deferred_length_check_still_raises_its_error(monkeypatch) -> None:
    lm = lm_with("stop", cell=LSTM)
    inputs, targets, mask = sentences([[4, 5]])
    targets[0, 2] = 4  # no </s> at the end of the row
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)
    with pytest.raises(ValueError, match="row 0"), deferred_module.deferring() as deferred:
        out = lm.loss(inputs, targets, mask=mask)
        deferred.read(out.nats)


def _one_read(sites) -> bool:
    """One read of the device in all: the step's own, in ``rnnkit.deferred``."""
    return sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites)
