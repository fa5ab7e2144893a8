"""The decoding step in fewer operations against the general step (the definition):
equal log-probabilities and states in float64 over the model's options, the same
decodings, and another step wherever the fast one does not apply."""

from __future__ import annotations

import itertools

import pytest
import torch

from rnnkit.bptt.native import available, use_native
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, Vocabulary
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec

pytestmark = pytest.mark.skipif(not available(), reason="needs the compiled time loop")

VOCAB = Vocabulary(list("abcdefg"))
WORDS = ["abcd", "gfe", "a", "bcdefga", "ddc", "eab"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def batch(words=WORDS):
    src, tgt = encode_pairs([Pair(w, w[::-1]) for w in words], VOCAB, VOCAB)
    return make_pair_batch(src, tgt)


def model(dtype=torch.float64, seed=0, **options):
    torch.manual_seed(seed)
    spec = ModelSpec(**{"hidden": 12, "embedding": 6, "cell": "lstm", **options})
    if spec.attention == "dot" and spec.bidirectional:
        spec = ModelSpec(**{**spec.__dict__, "attention": "bilinear"})
    m = build_seq2seq(spec, len(VOCAB), len(VOCAB)).to(dtype).eval()
    with torch.no_grad():  # larger weights than the initialisation: sharper distributions
        for p in m.parameters():
            p.mul_(3)
    return m


OPTIONS = [
    dict(attention=a, attention_wiring=w, context=c, layers=l, bidirectional=b)
    for a, w, c, l, b in itertools.product(
        ["none", "dot", "bilinear", "additive"],
        ["before", "after"],
        ["init", "input", "both"],
        [1, 2],
        [False, True],
    )
    if not (a == "none" and w == "after")
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_step_equals_the_general_step_in_float64(options):
    m = model(**options)
    b = batch()
    with torch.no_grad():
        state = m.encode(b.source, b.source_mask)
        fast = InferenceStep.build(m)
        assert fast is not None
        fast_state = fast.prepare(state)
        assert fast_state is not None
        token = torch.full((len(WORDS),), BOS_ID)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):  # a few steps: the states carried are compared too
            lp_general, state = m.step(token, state)
            lp_fast, fast_state = fast.step(token, fast_state)
            torch.testing.assert_close(lp_fast, lp_general, rtol=0, atol=1e-12)
            hidden = fast.hidden_state(fast_state)
            torch.testing.assert_close(hidden.h, state.hidden.h, rtol=0, atol=1e-12)
            torch.testing.assert_close(hidden.c, state.hidden.c, rtol=0, atol=1e-12)
            token = torch.multinomial(lp_general.exp(), 1, generator=gen).view(-1)


def general_only(monkeypatch):
    monkeypatch.setattr(InferenceStep, "build", classmethod(lambda cls, m: None))
    monkeypatch.setattr(TorchInferenceStep, "build", classmethod(lambda cls, m: None))


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decode_gives_the_general_steps_hypotheses(beam, dtype, monkeypatch):
    m = model(dtype=dtype, attention="additive", bidirectional=True, context="both")
    b = batch()
    fast = m.decode(b.source, b.source_mask, beam=beam, max_length=9, num=beam)
    general_only(monkeypatch)
    general = m.decode(b.source, b.source_mask, beam=beam, max_length=9, num=beam)
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    for f_hyps, g_hyps in zip(fast, general, strict=True):
        assert [h.ids for h in f_hyps] == [h.ids for h in g_hyps]
        assert [h.finished for h in f_hyps] == [h.finished for h in g_hyps]
        for f, g in zip(f_hyps, g_hyps, strict=True):
            assert f.logprob == pytest.approx(g.logprob, abs=tol)


def test_sample_draws_the_same_with_the_same_generator(monkeypatch):
    m = model(attention="dot")
    b = batch()
    fast = m.sample(
        b.source, b.source_mask, num=3, max_length=8, generator=torch.Generator().manual_seed(5)
    )
    general_only(monkeypatch)
    general = m.sample(
        b.source, b.source_mask, num=3, max_length=8, generator=torch.Generator().manual_seed(5)
    )
    assert [[h.ids for h in hs] for hs in fast] == [[h.ids for h in hs] for hs in general]


def test_the_general_step_where_the_fast_one_does_not_apply():
    with torch.no_grad():
        assert InferenceStep.build(model()) is not None
        assert InferenceStep.build(model().train()) is None  # dropout, training mode
        assert InferenceStep.build(model(cell="gru")) is None
        assert InferenceStep.build(model(length="stop")) is None
        with use_native(False):
            assert InferenceStep.build(model()) is None
    assert InferenceStep.build(model()) is None  # gradients recorded


def test_a_source_without_real_positions_takes_the_torch_step(monkeypatch):
    m = model(attention="additive")
    b = batch()
    mask = b.source_mask.clone()
    mask[2] = False  # a row with nothing to attend to: its attention weights are all zero
    used: list[str] = []
    for cls in (InferenceStep, TorchInferenceStep):
        real = cls.step
        monkeypatch.setattr(
            cls,
            "step",
            lambda self, t, s, real=real: used.append(type(self).__name__) or real(self, t, s),
        )
    with torch.no_grad():
        assert InferenceStep.build(m).prepare(m.encode(b.source, mask)) is None
    out = m.decode(b.source, mask, beam=2, max_length=6)
    assert set(used) == {"TorchInferenceStep"} and len(out) == len(WORDS)
    assert all(torch.isfinite(torch.tensor(h[0].logprob)) for h in out)


def test_the_embedding_table_follows_weight_updates(monkeypatch):
    m = model(attention="bilinear")
    b = batch()
    first = m.decode(b.source, b.source_mask, max_length=8)
    table = m.__dict__["_inference_table"][1]
    again = m.decode(b.source, b.source_mask, max_length=8)
    assert m.__dict__["_inference_table"][1] is table  # unchanged weights: kept
    assert [h[0].ids for h in again] == [h[0].ids for h in first]
    with torch.no_grad():  # an in-place update, as an optimizer step makes
        m.target_embedding.weight.mul_(-2.0)
    fast = m.decode(b.source, b.source_mask, max_length=8)
    assert m.__dict__["_inference_table"][1] is not table
    general_only(monkeypatch)
    general = m.decode(b.source, b.source_mask, max_length=8)
    assert [h[0].ids for h in fast] == [h[0].ids for h in general]
    for f, g in zip(fast, general, strict=True):
        assert f[0].logprob == pytest.approx(g[0].logprob, abs=1e-9)
