"""The decoding step of torch operations against the general step (the definition): equal
log-probabilities and states in float64 over the model's options (every cell and its
forms, every attention kind and wiring, every context mode, one and two layers, sources
that end early and one without any real position), the same decodings (greedy, beam,
rows that end early, forbidden ids), where decoding takes it, and on a CUDA device
against the CPU's general step in float64."""

from __future__ import annotations

import itertools

import pytest
import torch

from rnnkit.bptt.native import available, use_native
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, Vocabulary
from rnnkit.models import seq2seq_torch_step as torch_step
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState

VOCAB = Vocabulary(list("abcdefg"))
WORDS = ["abcd", "gfe", "a", "bcdefga", "ddc", "eab"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def batch(words=WORDS):
    src, tgt = encode_pairs([Pair(w, w[::-1]) for w in words], VOCAB, VOCAB)
    return make_pair_batch(src, tgt)


def model(dtype=torch.float64, seed=0, **options) -> Seq2Seq:
    torch.manual_seed(seed)
    spec = ModelSpec(**{"hidden": 12, "embedding": 6, "cell": "lstm", **options})
    if spec.attention == "dot" and spec.bidirectional:
        spec = ModelSpec(**{**spec.__dict__, "attention": "bilinear"})
    m = build_seq2seq(spec, len(VOCAB), len(VOCAB)).to(dtype).eval()
    with torch.no_grad():  # larger weights than the initialisation: sharper distributions
        for p in m.parameters():
            p.mul_(3)
    return m


CELLS = [
    {"cell": "lstm"},
    {"cell": "gru"},  # update candidate, reset before
    {"cell": "gru", "update": "keep", "reset": "after"},  # torch's fused kernel's form
    {"cell": "gru", "update": "candidate", "reset": "after"},
    {"cell": "gru", "update": "keep", "reset": "before"},
    {"cell": "rnn"},
    {"cell": "rnn", "nonlinearity": "relu"},
]
WIRINGS = [
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
# Every wiring with an LSTM decoder; every cell form with a few wirings.
OPTIONS = (
    [dict(cell="lstm", **o) for o in WIRINGS]
    + [
        {**c, **o}
        for c in CELLS[1:]
        for o in (
            dict(attention="additive", context="both", layers=2, bidirectional=True),
            dict(attention="dot", attention_wiring="after", context="input", layers=1),
            dict(attention="none", context="init", layers=2),
        )
    ]
    + [dict(attention="bilinear", tie_weights=True, embedding=12)]
)  # a head not Linear


def _ids(options):
    return "-".join(f"{v}" for v in options.values())


def sources_ending_early():
    """The batch's sources, one of them cut to no real position at all."""
    b = batch()
    mask = b.source_mask.clone()
    mask[2] = False  # its attention weights are all zero: a zero context
    return b.source, mask


def hidden_of(state):
    """The general step's decoder state as per-layer tensors, to compare."""
    hidden = state.hidden
    return list(hidden) if isinstance(hidden, LSTMState) else [hidden]


@pytest.mark.parametrize("options", OPTIONS, ids=_ids)
def test_step_equals_the_general_step_in_float64(options):
    m = model(**options)
    source, mask = sources_ending_early()
    with torch.no_grad():
        state = m.encode(source, mask)
        step = TorchInferenceStep.build(m)
        assert step is not None
        fast_state = step.prepare(state)
        assert fast_state is not None
        token = torch.full((len(WORDS),), BOS_ID)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):  # a few steps: the states carried are compared too
            lp_general, state = m.step(token, state)
            lp_fast, fast_state = step.step(token, fast_state)
            torch.testing.assert_close(lp_fast, lp_general, rtol=0, atol=1e-12)
            fast_hidden = step.hidden_state(fast_state)
            fast_hidden = list(fast_hidden) if isinstance(fast_hidden, LSTMState) else [fast_hidden]
            for f, g in zip(fast_hidden, hidden_of(state), strict=True):
                torch.testing.assert_close(f, g, rtol=0, atol=1e-12)
            token = torch.multinomial(lp_general.exp(), 1, generator=gen).view(-1)


def general_only(monkeypatch):
    monkeypatch.setattr(TorchInferenceStep, "build", classmethod(lambda cls, m: None))


def torch_step_counted(monkeypatch) -> list[int]:
    """A list that grows at every step of this step (to see that decoding took it)."""
    used: list[int] = []
    real = TorchInferenceStep.step
    monkeypatch.setattr(
        TorchInferenceStep, "step", lambda self, t, s: used.append(1) or real(self, t, s)
    )
    return used


def decodings(m, source, mask, beam):
    return m.decode(source, mask, beam=beam, max_length=9, num=beam)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize(
    "options",
    [
        dict(cell="lstm", attention="additive", bidirectional=True, context="both"),
        dict(cell="lstm", attention="dot", attention_wiring="after", layers=2),
        dict(cell="gru", attention="bilinear", context="input"),
        dict(cell="gru", update="keep", reset="after", attention="additive", layers=2),
        dict(cell="rnn", attention="none", context="both"),
    ],
    ids=_ids,
)
def test_decode_gives_the_general_steps_hypotheses(options, beam, monkeypatch):
    """Greedy and beam search, a source without real positions, the forbidden ids (the
    models never draw <pad>, <unk>, <s>: their log-probabilities are raised here so that
    they would win were they not forbidden)."""
    m = model(**options)
    with torch.no_grad():
        m.head.bias[list(NEVER_GENERATED)] += 4.0
    source, mask = sources_ending_early()
    used = torch_step_counted(monkeypatch)
    with use_native(False):
        fast = decodings(m, source, mask, beam)
        assert used
        general_only(monkeypatch)
        general = decodings(m, source, mask, beam)
    for f_hyps, g_hyps in zip(fast, general, strict=True):
        assert [h.ids for h in f_hyps] == [h.ids for h in g_hyps]
        assert [h.finished for h in f_hyps] == [h.finished for h in g_hyps]
        for f, g in zip(f_hyps, g_hyps, strict=True):
            assert f.logprob == pytest.approx(g.logprob, abs=1e-9)
            assert not set(f.ids) & set(NEVER_GENERATED)


@pytest.mark.parametrize("beam", [1, 3])
def test_rows_that_end_early_end_as_in_the_general_step(beam, monkeypatch):
    """</s> favoured: most rows end at their first steps and leave the batch."""
    m = model(cell="gru", attention="additive", context="both")
    with torch.no_grad():
        m.head.bias[EOS_ID] += 2.5
    source, mask = sources_ending_early()
    with use_native(False):
        fast = decodings(m, source, mask, beam)
        general_only(monkeypatch)
        general = decodings(m, source, mask, beam)
    lengths = [len(h[0].ids) for h in fast]
    assert min(lengths) <= 1 < max(lengths)  # some rows ended early, some ran on
    for f_hyps, g_hyps in zip(fast, general, strict=True):
        assert [h.ids for h in f_hyps] == [h.ids for h in g_hyps]
        assert [h.logprob for h in f_hyps] == pytest.approx([h.logprob for h in g_hyps])


def test_sample_draws_the_same_with_the_same_generator(monkeypatch):
    m = model(cell="gru", attention="dot")
    b = batch()
    with use_native(False):
        fast = m.sample(
            b.source, b.source_mask, num=3, max_length=8, generator=torch.Generator().manual_seed(5)
        )
        general_only(monkeypatch)
        general = m.sample(
            b.source, b.source_mask, num=3, max_length=8, generator=torch.Generator().manual_seed(5)
        )
    assert [[h.ids for h in hs] for hs in fast] == [[h.ids for h in hs] for hs in general]


def test_the_general_step_where_this_one_does_not_apply():
    with torch.no_grad():
        assert TorchInferenceStep.build(model()) is not None
        assert TorchInferenceStep.build(model(cell="gru")) is not None
        assert TorchInferenceStep.build(model().train()) is None  # training mode
        assert TorchInferenceStep.build(model(length="stop")) is None
        mixed = model()
        mixed.head.float()  # weights of two dtypes
        assert TorchInferenceStep.build(mixed) is None
        m = model()
        step = TorchInferenceStep.build(m)
        assert step is not None
        b = batch()
        state = m.encode(b.source, b.source_mask)
        # a state of another dtype than the weights
        assert step.prepare(state._replace(memory=state.memory.float())) is None
    assert TorchInferenceStep.build(model()) is None  # gradients recorded


def test_decoding_takes_it_where_the_compiled_step_does_not_apply():
    """The compiled step for an LSTM decoder on the CPU; this one with the compiled
    library off, for other decoders, and for a source without real positions."""
    b = batch()
    source, empty = sources_ending_early()
    with torch.no_grad():
        lstm, gru = model(), model(cell="gru")
        lstm_state, gru_state = (
            lstm.encode(b.source, b.source_mask),
            gru.encode(b.source, b.source_mask),
        )
        assert isinstance(gru._decoding(gru_state)[0], TorchInferenceStep)
        assert isinstance(lstm._decoding(lstm.encode(source, empty))[0], TorchInferenceStep)
        if available():
            assert isinstance(lstm._decoding(lstm_state)[0], InferenceStep)
        with use_native(False):
            assert isinstance(lstm._decoding(lstm_state)[0], TorchInferenceStep)
        assert lstm.train()._decoding(lstm_state)[0] is lstm  # training mode: the general step


def test_the_embedding_table_follows_weight_updates(monkeypatch):
    m = model(cell="gru", attention="bilinear")
    b = batch()
    with use_native(False):
        first = m.decode(b.source, b.source_mask, max_length=8)
        table = m.__dict__["_torch_inference_table"][1]
        again = m.decode(b.source, b.source_mask, max_length=8)
        assert m.__dict__["_torch_inference_table"][1] is table  # unchanged weights: kept
        assert [h[0].ids for h in again] == [h[0].ids for h in first]
        with torch.no_grad():  # in-place updates, as an optimizer step makes
            m.target_embedding.weight.mul_(-2.0)
            m.decoder.cells()[0].bias.add_(0.5)
        fast = m.decode(b.source, b.source_mask, max_length=8)
        assert m.__dict__["_torch_inference_table"][1] is not table
        general_only(monkeypatch)
        general = m.decode(b.source, b.source_mask, max_length=8)
    assert [h[0].ids for h in fast] == [h[0].ids for h in general]
    for f, g in zip(fast, general, strict=True):
        assert f[0].logprob == pytest.approx(g[0].logprob, abs=1e-9)


@pytest.mark.parametrize(
    "options",
    [
        dict(cell="lstm", attention="additive", context="both", layers=2),
        dict(cell="gru", update="candidate", attention="dot", attention_wiring="after"),
        dict(cell="rnn", attention="none", context="input"),
    ],
    ids=_ids,
)
def test_past_the_table_bound_each_step_multiplies_the_embedding(options, monkeypatch):
    """A vocabulary or layer too large for the embedding table: no table is made (nor one
    kept from before), and the step still equals the general step."""
    m = model(**options)
    b = batch()
    with use_native(False):
        m.decode(b.source, b.source_mask, max_length=4)  # keeps a table: under the bound
    assert "_torch_inference_table" in m.__dict__
    monkeypatch.setattr(torch_step, "TABLE_MAX_ELEMENTS", 0)
    source, mask = sources_ending_early()
    with torch.no_grad():
        state = m.encode(source, mask)
        step = TorchInferenceStep.build(m)
        assert step is not None and step.table is None
        assert "_torch_inference_table" not in m.__dict__
        fast_state = step.prepare(state)
        assert fast_state is not None
        token = torch.full((len(WORDS),), BOS_ID)
        for _ in range(4):
            lp_general, state = m.step(token, state)
            lp_fast, fast_state = step.step(token, fast_state)
            torch.testing.assert_close(lp_fast, lp_general, rtol=0, atol=1e-12)
            token = lp_general.argmax(dim=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "options",
    [
        dict(cell="lstm", attention="additive", context="both", layers=2),
        dict(cell="lstm", attention="dot", attention_wiring="after"),
        dict(cell="gru", update="keep", reset="after", attention="bilinear", layers=2),
        dict(cell="gru", attention="additive", bidirectional=True),
        dict(cell="rnn", attention="additive", context="input"),
    ],
    ids=_ids,
)
def test_on_cuda_the_step_equals_the_cpu_general_step(options):
    """On a CUDA device (its fused cell kernels, float32 and float64) against the CPU's
    general step in float64, step by step, and (float64) the CPU's decodings."""
    cpu = model(**options)
    source, mask = sources_ending_early()
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-3)):
        gpu = model(**options).to("cuda", dtype)
        with torch.no_grad():
            state = cpu.encode(source, mask)
            step = TorchInferenceStep.build(gpu)
            assert step is not None
            fast_state = step.prepare(gpu.encode(source.cuda(), mask.cuda()))
            assert fast_state is not None
            token = torch.full((len(WORDS),), BOS_ID)
            for _ in range(4):
                lp, state = cpu.step(token, state)
                lp_gpu, fast_state = step.step(token.cuda(), fast_state)
                torch.testing.assert_close(lp_gpu.cpu().double(), lp, rtol=0, atol=tol)
                token = lp.argmax(-1)
        if dtype == torch.float64:  # float32's rounding may reorder close beams
            decoded = gpu.decode(source.cuda(), mask.cuda(), beam=3, max_length=8)
            reference = cpu.decode(source, mask, beam=3, max_length=8)
            assert [h[0].ids for h in decoded] == [h[0].ids for h in reference]
