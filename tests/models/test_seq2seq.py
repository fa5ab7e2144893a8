"""Encoder–decoder: overfitting, context modes, attention outputs, scheduled sampling at
p = 0 (teacher forcing) and p = 1 (free running), batched greedy / beam decoding."""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit.app.config import TrainConfig
from rnnkit.data.pairs import Pair, encode_pairs, make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, Vocabulary
from rnnkit.errors import ConfigError
from rnnkit.generation.seq2seq_search import beam_search
from rnnkit.models.seq2seq import STATE_BATCH_DIM, build_seq2seq
from rnnkit.models.seq2seq_decoder import _unstack
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState

WORDS = ["abcd", "bcae", "dab", "ecdba", "cc"]
VOCAB = Vocabulary(list("abcde"))


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def reverse_batch(words=WORDS):
    src, tgt = encode_pairs([Pair(w, w[::-1]) for w in words], VOCAB, VOCAB)
    return make_pair_batch(src, tgt)


def model(seed=0, **options):
    torch.manual_seed(seed)
    settings = {"hidden": 16, "embedding": 8, "cell": "gru", **options}
    spec = ModelSpec(**settings)
    return build_seq2seq(spec, len(VOCAB), len(VOCAB))


def decoded(m, batch, beam=1, max_length=10):
    hyps = m.decode(batch.source, batch.source_mask, beam=beam, max_length=max_length)
    return [h[0].ids for h in hyps]


@pytest.mark.parametrize(
    "options",
    [
        {"attention": "none", "context": "init"},
        {"attention": "additive", "context": "both", "bidirectional": True, "cell": "lstm"},
    ],
    ids=["plain-gru", "additive-bi-lstm"],
)
def test_overfits_reverse_of_five_strings(options):
    m = model(hidden=32, **options)
    batch = reverse_batch()
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(120):
        opt.zero_grad()
        out = m.loss(batch)
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.05
    m.eval()
    assert [VOCAB.decode(ids) for ids in decoded(m, batch)] == [w[::-1] for w in WORDS]
    assert [VOCAB.decode(ids) for ids in decoded(m, batch, beam=3)] == [w[::-1] for w in WORDS]


def test_attention_weights_are_returned_and_zero_on_source_padding():
    m = model(attention="bilinear", bidirectional=True)
    batch = reverse_batch()
    out = m(batch.source, batch.source_mask, batch.target_in, batch.target_mask)
    B, T = batch.target_in.shape
    assert out.attention.shape == (B, T, batch.source.shape[1])
    pad = ~batch.source_mask.unsqueeze(1).expand_as(out.attention)
    assert torch.all(out.attention[pad] == 0.0)
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(B, T))


def test_result_of_a_row_does_not_depend_on_padding_or_neighbours():
    m = model(attention="additive", context="both").eval()
    batch = reverse_batch()
    full = m(batch.source, batch.source_mask, batch.target_in, batch.target_mask).logits
    for i, w in enumerate(WORDS):
        alone = reverse_batch([w])
        row = m(alone.source, alone.source_mask, alone.target_in, alone.target_mask).logits
        n = len(w) + 1
        torch.testing.assert_close(full[i, :n], row[0, :n], atol=1e-6, rtol=1e-5)


def test_init_context_copies_the_encoder_final_state_when_widths_agree():
    m = model(cell="lstm", attention="none", context="init")
    batch = reverse_batch()
    state = m.encode(batch.source, batch.source_mask)
    enc = m.encoder(m.source_embedding(batch.source), mask=batch.source_mask).state
    assert isinstance(state.hidden, LSTMState)
    assert torch.equal(state.hidden.h[:, 0], enc.h[:, 0])
    assert torch.equal(state.hidden.c[:, 0], enc.c[:, 0])


def test_bidirectional_encoder_is_projected_to_the_decoder_width():
    m = model(bidirectional=True, attention="none", context="init", layers=2)
    batch = reverse_batch()
    state = m.encode(batch.source, batch.source_mask)
    assert state.hidden.shape == (2, 1, len(WORDS), 16)
    assert all(isinstance(b, torch.nn.Linear) for b in m.bridge_h)


@pytest.mark.parametrize("kind", ["dot", "additive"])
def test_attention_after_the_step_equals_the_step_loop_in_one_layer_call(kind):
    # "after": the decoder reads no attention context, runs as one layer call, and the
    # attention of all steps at once equals the step-by-step decoder (the decoding path).
    m = model(attention=kind, attention_wiring="after", context="both", cell="lstm").double()
    assert m.decoder.input_size == 8 + 16  # embedding and fixed context only
    batch = reverse_batch()
    out = m(batch.source, batch.source_mask, batch.target_in, batch.target_mask)
    state = m.encode(batch.source, batch.source_mask)
    emb = m.target_embedding(batch.target_in)
    hidden, features, weights = _unstack(state.hidden), [], []
    for t in range(batch.target_in.shape[1]):
        feat, hidden, w = m._step(emb[:, t], hidden, state)
        features.append(feat)
        weights.append(w)
    logits, attention = m.head(torch.stack(features, 1)), torch.stack(weights, 1)
    real = batch.target_mask  # the layer holds its state at padded steps, the loop need not
    torch.testing.assert_close(out.logits[real], logits[real], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out.attention[real], attention[real], atol=1e-12, rtol=1e-10)
    d = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    params = list(m.parameters())
    ga = torch.autograd.grad((out.logits[real] * d[real]).sum(), params, allow_unused=True)
    gb = torch.autograd.grad((logits[real] * d[real]).sum(), params, allow_unused=True)
    for (name, _), a, b in zip(m.named_parameters(), ga, gb, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=name)


def test_attention_wiring_after_needs_attention():
    with pytest.raises(ConfigError, match="--attention-wiring after"):
        TrainConfig(
            train="x", task="seq2seq", attention="none", attention_wiring="after"
        ).validate()
    with pytest.raises(ConfigError, match=r"^ModelSpec: attention_wiring must be one of"):
        model(attention="dot", attention_wiring="sideways")


def test_dot_attention_with_a_bidirectional_encoder_is_a_clear_error(run_cli):
    # From Python the message names the spec's values; the command line names its options
    # (it named them from Python too).
    with pytest.raises(ConfigError, match=r"^attention 'dot' needs.*16.*32.*'bilinear'"):
        model(bidirectional=True, attention="dot")
    argv = ["train", "--task", "seq2seq", "--train", "x.tsv", "--out", "r", "--bidirectional"]
    code, _, err = run_cli(*argv, "--attention", "dot")
    assert code == 2 and "--attention dot needs equal widths" in err and "--bidirectional" in err


def test_a_context_the_model_does_not_know_names_the_argument():
    # ModelSpec let context="bogus" through to the builder, which said --context
    with pytest.raises(ConfigError, match=r"^ModelSpec: context must be one of init, input"):
        model(context="bogus")
    built = model()
    with pytest.raises(ConfigError, match=r"^context must be one of init, input, both"):
        type(built)(
            built.source_embedding, built.encoder, built.target_embedding,
            built.decoder, built.head, context="bogus",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("attention", "wiring"), [("none", "before"), ("dot", "before"), ("dot", "after")]
)
def test_scheduled_sampling_with_p_zero_equals_teacher_forcing(attention, wiring):
    # Teacher forcing runs the decoder as one layer call (explicit BPTT; "none", "after")
    # or one node ("before"), and p = 0 runs the step loop with the sampling code: the two
    # must agree.
    m = model(attention=attention, context="both", attention_wiring=wiring)
    batch = reverse_batch()
    args = (batch.source, batch.source_mask, batch.target_in, batch.target_mask)
    tf = m(*args)
    ss = m(*args, sampling_p=0.0, generator=torch.Generator().manual_seed(0))
    real = batch.target_mask  # the layer holds its state at padded steps, the loop need not
    torch.testing.assert_close(ss.logits[real], tf.logits[real], atol=1e-6, rtol=1e-5)
    assert torch.equal(ss.mask, batch.target_mask)
    gt = torch.autograd.grad(m.loss(batch).loss, list(m.parameters()), allow_unused=True)
    gs = torch.autograd.grad(m.loss(batch, 0.0).loss, list(m.parameters()), allow_unused=True)
    for a, b in zip(gt, gs, strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def _free_running_logits(m, batch, steps):
    """Greedy free running through ``Seq2Seq.step``: the decoding path, one row at a time."""
    rows = []
    for i in range(batch.source.shape[0]):
        state = m.encode(batch.source[i : i + 1], batch.source_mask[i : i + 1])
        token = torch.tensor([BOS_ID])
        logits = []
        for _ in range(steps):
            log_probs, state = m.step(token, state)
            logits.append(log_probs[0])
            # greedy among the tokens generation may produce (not <pad>, <unk>, <s>)
            token = log_probs.index_fill(-1, torch.tensor(NEVER_GENERATED), -math.inf).argmax(-1)
        rows.append(torch.stack(logits))
    return torch.stack(rows)  # (B, steps, V) log-probabilities


@pytest.mark.parametrize("attention", ["none", "additive"])
@pytest.mark.parametrize("specials_first", [False, True])
def test_scheduled_sampling_with_p_one_equals_free_running(attention, specials_first):
    m = model(seed=3, attention=attention, context="init").eval()
    if specials_first:  # the specials the most probable outputs: still never fed
        with torch.no_grad():
            m.head.bias[: len(NEVER_GENERATED)] += 20.0
    batch = reverse_batch()
    out = m(batch.source, batch.source_mask, batch.target_in, batch.target_mask, sampling_p=1.0)
    T = batch.target_in.shape[1]
    free = _free_running_logits(m, batch, T)
    ss = torch.log_softmax(out.logits, -1)
    for i in range(len(WORDS)):
        own = free[i].index_fill(-1, torch.tensor(NEVER_GENERATED), -math.inf).argmax(-1).tolist()
        # Free running stops after its own </s>: steps up to and including it must agree.
        stop = own.index(EOS_ID) + 1 if EOS_ID in own else T
        n = min(stop, int(batch.target_mask[i].sum()))
        torch.testing.assert_close(ss[i, :n], free[i, :n], atol=1e-5, rtol=1e-5)
        assert out.mask[i].tolist() == [t < n for t in range(T)]


def test_a_sequence_fed_its_own_eos_has_ended():
    m = model(attention="dot")
    with torch.no_grad():
        m.head.bias[EOS_ID] = 100.0  # the model always says </s>
    batch = reverse_batch()
    args = (batch.source, batch.source_mask, batch.target_in, batch.target_mask)
    out = m(*args, sampling_p=1.0)
    expected = torch.zeros_like(batch.target_mask)
    expected[:, 0] = True  # only the first step (input <s>) is real; then it has ended
    assert torch.equal(out.mask, expected)
    loss = m.loss(batch, sampling_p=1.0)
    assert loss.tokens == len(WORDS) and torch.isfinite(loss.loss)


@pytest.mark.parametrize(
    ("attention", "wiring"), [("none", "before"), ("additive", "before"), ("additive", "after")]
)
def test_beam_width_one_equals_greedy_and_batching_changes_nothing(attention, wiring):
    m = model(
        seed=5, attention=attention, context="both", cell="lstm", attention_wiring=wiring
    ).eval()
    batch = reverse_batch()
    greedy = decoded(m, batch, beam=1, max_length=8)
    hyps = m.decode(batch.source, batch.source_mask, beam=1, max_length=8)
    with torch.no_grad():
        state = m.encode(batch.source, batch.source_mask)
        beam = beam_search(
            m,
            state,
            STATE_BATCH_DIM,
            beam=1,
            max_length=8,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            forbid=NEVER_GENERATED,
        )
    assert [b[0].ids for b in beam] == greedy
    assert [b[0].logprob for b in beam] == pytest.approx([h[0].logprob for h in hyps], abs=1e-5)
    beam3 = decoded(m, batch, beam=3, max_length=8)
    for i, w in enumerate(WORDS):
        alone = reverse_batch([w])
        assert decoded(m, alone, beam=1, max_length=8)[0] == greedy[i]
        assert decoded(m, alone, beam=3, max_length=8)[0] == beam3[i]


def test_beam_search_reorders_per_source_parts_only_when_sources_leave(monkeypatch):
    # Seq2Seq.decode tells beam search that the encoder side of the state is the same in
    # all beams of a source: the hypotheses equal those of selecting every part each step.
    # Both with the general step, for bit equality (the inference steps' rounding differs;
    # they are compared in test_seq2seq_inference and test_seq2seq_torch_step).
    monkeypatch.setattr(InferenceStep, "build", classmethod(lambda cls, m: None))
    monkeypatch.setattr(TorchInferenceStep, "build", classmethod(lambda cls, m: None))
    m = model(seed=7, attention="additive", context="both", cell="lstm")
    batch = reverse_batch()
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(20):  # enough for the sources to end at different steps
        opt.zero_grad()
        m.loss(batch).loss.backward()
        opt.step()
    m.eval()
    got = m.decode(batch.source, batch.source_mask, beam=3, max_length=9, num=2)
    with torch.no_grad():
        state = m.encode(batch.source, batch.source_mask)
        want = beam_search(
            m,
            state,
            STATE_BATCH_DIM,
            beam=3,
            max_length=9,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num=2,
            forbid=NEVER_GENERATED,
        )
    assert len({len(h[0].ids) for h in got}) > 1
    assert got == want


def test_beam_search_keeps_going_until_the_top_beam_ends():
    # A model sure of one long answer whose other beams prefer </s> at once: stopping as
    # soon as K hypotheses have ended would return a short, improbable one.
    answer = [4, 5, 4, 5, 4]

    class Scripted:
        vocab_size = 6

        def step(self, token, state):  # state (B, 2): [steps done, still on the answer]
            t = int(state[0, 0])
            on = state[:, 1] > 0
            if t > 0:
                on = on & (token == answer[t - 1])
            want = answer[t] if t < len(answer) else EOS_ID
            lp = torch.full((token.shape[0], 6), -20.0)
            lp[:, EOS_ID] = torch.where(on, -9.0, -5.0)
            lp[on, want] = -0.001
            return torch.log_softmax(lp, -1), torch.stack([state[:, 0] + 1, on.float()], 1)

    state = torch.tensor([[0.0, 1.0]])
    out = beam_search(Scripted(), state, 0, beam=3, max_length=10, bos_id=BOS_ID, eos_id=EOS_ID)
    assert out[0][0].ids == answer and out[0][0].finished


def test_source_and_target_ids_outside_their_vocabularies_are_named():
    # torch's embedding said "index out of range in self", in forward and in decode.
    model = build_seq2seq(ModelSpec(hidden=4, embedding=3), 9, 7).eval()
    src, mask = torch.randint(4, 9, (2, 4)), torch.ones(2, 4, dtype=torch.bool)
    tgt = torch.randint(4, 7, (2, 3))
    with pytest.raises(ValueError, match=r"^source must hold token ids in \[0, 9\) .*, got 9"):
        model.decode(torch.full((2, 4), 9), mask)
    with pytest.raises(ValueError, match=r"^target_in must hold token ids in \[0, 7\) .*, got 8"):
        model(src, mask, torch.full((2, 3), 8), torch.ones(2, 3, dtype=torch.bool))
    assert model(src, mask, tgt, torch.ones(2, 3, dtype=torch.bool)).logits.shape == (2, 3, 7)


@pytest.mark.parametrize("length", ["eos", "stop", "predict"])
def test_scored_is_the_loss_and_the_target_logits_of_one_pass(length):
    """``scored`` returns what ``loss`` and ``target_logits`` return, running the model once."""
    m = model(length=length, max_len=8, attention="additive").eval()
    batch = reverse_batch()
    runs = []
    m.register_forward_hook(lambda *_: runs.append(1))
    loss, logits = m.scored(batch)
    assert len(runs) == 1
    torch.testing.assert_close(loss.loss, m.loss(batch).loss, rtol=0, atol=0)
    torch.testing.assert_close(logits, m.target_logits(batch), rtol=0, atol=0)
    assert loss.tokens == m.loss(batch).tokens


def test_the_best_hypothesis_does_not_depend_on_how_many_are_asked_for():
    """``--beam 5`` answered ``ebjfaacdaaj`` where ``--beam 5 --num 5`` listed
    ``ebjfaaacdaaj`` first: the search stopped once the top candidate was ``</s>`` and
    ``num`` hypotheses had ended, so with one asked for, a longer hypothesis of a better
    length-normalised score was never finished. It stops at ``K`` ended, whatever ``num``.
    Here ``</s>`` at once (log-probability ln 0.6, score -0.51) against ``4 5 </s>``
    (ln 0.35 then near-certain steps: score -1.05 / 3 = -0.35)."""

    class Scripted:
        vocab_size = 6

        def step(self, token, state):  # state (B, 2): [steps done, on the path 4 5]
            t = int(state[0, 0])
            on = state[:, 1] > 0
            if t > 0:
                on = on & (token == (4, 5)[t - 1])
            lp = torch.full((token.shape[0], 6), -30.0)
            if t == 0:
                lp[:, EOS_ID], lp[:, 4], lp[:, 5] = math.log(0.6), math.log(0.35), math.log(0.05)
            else:  # every beam goes on with 5, unlikely to end; the path ends after 4 5
                lp[:, EOS_ID], lp[:, 5] = -9.0, -0.001
                if t == 2:
                    lp[on, 5], lp[on, EOS_ID] = -30.0, -0.001
            return torch.log_softmax(lp, -1), torch.stack([state[:, 0] + 1, on.float()], 1)

    state = torch.tensor([[0.0, 1.0]])
    args = dict(beam=3, max_length=10, bos_id=BOS_ID, eos_id=EOS_ID, length_penalty=1.0)
    one = beam_search(Scripted(), state, 0, num=1, **args)
    three = beam_search(Scripted(), state, 0, num=3, **args)
    assert one[0][0] == three[0][0]
    assert one[0][0].ids == [4, 5] and one[0][0].score == pytest.approx(
        (math.log(0.35) - 0.002) / 3, abs=1e-3
    )
