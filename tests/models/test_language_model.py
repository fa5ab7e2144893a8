"""LanguageModel: it learns, it is causal, truncation is exact, resets and tying work.

Every check compares the model with an independent computation (a run on a sliced input,
autograd of an explicitly built graph, an untied twin), never with itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit import GRU, LSTM, RNN
from rnnkit.models.builders import build_language_model
from rnnkit.models.heads import TiedHead
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.spec import ModelSpec
from rnnkit.types import LSTMState

V, E, H = 11, 6, 8


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    # Tiny models: threads only add contention (and time) on a shared machine.
    yield


def make_lm(kind="lstm", layers=1, dtype=torch.float64, seed=0, hidden=H, dropout=0.0):
    torch.manual_seed(seed)
    between = dropout if layers > 1 else 0.0  # one layer has no "between layers"
    enc = {"lstm": LSTM, "gru": GRU, "rnn": RNN}[kind](
        E, hidden, num_layers=layers, dropout=between
    )
    lm = LanguageModel(nn.Embedding(V, E), enc, nn.Linear(hidden, V), dropout=dropout)
    return lm.to(dtype)


def tokens(B, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g)


def detach(state):
    if isinstance(state, LSTMState):
        return LSTMState(state.h.detach(), state.c.detach())
    return state.detach()


def row(state, b):
    """The state of batch row ``b`` alone, shape ``(L, D, 1, H)``."""
    if isinstance(state, LSTMState):
        return LSTMState(state.h[:, :, b : b + 1], state.c[:, :, b : b + 1])
    return state[:, :, b : b + 1]


def random_state(lm, B, seed=5):
    g = torch.Generator().manual_seed(seed)
    enc = lm.encoder
    shape = (enc.num_layers, 1, B, enc.hidden_size)
    h = torch.randn(shape, generator=g, dtype=torch.float64)
    return LSTMState(h, torch.randn(shape, generator=g, dtype=torch.float64)) if enc.is_lstm else h


def keep_embeddings(lm, retain=False):
    """Record every embedding output (the LM's inputs as vectors), optionally keeping grads."""
    kept = []

    def hook(module, inputs, output):
        if retain:
            output.retain_grad()
        kept.append(output)

    lm.embedding.register_forward_hook(hook)
    return kept


CASES = [("lstm", 1), ("gru", 1), ("lstm", 2), ("gru", 2)]
CASE_IDS = [f"{k}-L{n}" for k, n in CASES]


# -- 1. it learns ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_overfits_one_batch(kind):
    lm = make_lm(kind, dtype=torch.float32, hidden=16)
    x, y = tokens(4, 12, seed=2), tokens(4, 12, seed=3)  # random targets: pure memorisation
    opt = torch.optim.Adam(lm.parameters(), lr=0.05)
    first = None
    for _ in range(120):
        opt.zero_grad()
        out = lm.loss(x, y)
        out.loss.backward()
        opt.step()
        first = float(out.loss.detach()) if first is None else first
    final = float(lm.loss(x, y).loss.detach())
    assert first > 2.0  # ≈ ln 11 at the start
    assert final < 0.15, f"{kind} did not memorise one batch: loss {final:.3f}"


def test_loss_is_masked_token_mean_in_nats():
    lm = make_lm()
    x, y = tokens(3, 5), tokens(3, 5, seed=4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    out = lm.loss(x, y, mask=mask)
    logits = lm(x, mask=mask).logits
    per_token = F.cross_entropy(logits[mask], y[mask], reduction="none")
    assert out.tokens == 11
    torch.testing.assert_close(out.loss, per_token.mean(), rtol=1e-12, atol=0)
    assert out.nats == pytest.approx(float(per_token.sum().detach()), rel=1e-12)


# -- 2. teacher forcing is causal ------------------------------------------------------------
@pytest.mark.parametrize(("kind", "layers"), CASES, ids=CASE_IDS)
def test_prediction_at_t_never_sees_input_t_or_later(kind, layers):
    lm = make_lm(kind, layers)
    B, T = 3, 9
    x = tokens(B, T)
    base = lm(x).logits
    for t in range(T):
        changed = x.clone()
        changed[:, t:] = (changed[:, t:] + 1 + torch.arange(T - t)) % V
        logits = lm(changed).logits
        assert torch.equal(logits[:, :t], base[:, :t]), f"logits before {t} moved"
        assert not torch.allclose(logits[:, t], base[:, t])  # the change is seen from t on


def test_gradient_of_step_t_reaches_no_later_input():
    lm = make_lm("lstm", 2)
    kept = keep_embeddings(lm, retain=True)
    x = tokens(2, 8)
    t = 4
    lm(x).logits[:, t].sum().backward()
    g = kept[0].grad.abs().sum(-1)  # (B, T)
    assert torch.all(g[:, t + 1 :] == 0)
    assert torch.all(g[:, : t + 1] > 0)


def test_targets_never_enter_the_forward():
    lm = make_lm("gru")
    seen = []

    def hook(module, inputs, output):
        seen.append(output.detach().clone())

    lm.head.register_forward_hook(hook)
    x = tokens(2, 7)
    a = lm.loss(x, tokens(2, 7, seed=8))
    b = lm.loss(x, tokens(2, 7, seed=9))
    assert torch.equal(seen[0], seen[1])
    assert torch.equal(a.state, b.state)
    assert a.nats != b.nats


# -- 3. segment truncation -------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "layers"), CASES, ids=CASE_IDS)
def test_segments_with_carried_state_equal_one_unbroken_run(kind, layers):
    lm = make_lm(kind, layers)
    x = tokens(3, 25)
    whole = lm(x)
    pieces, state = [], None
    for lo in range(0, 25, 7):  # 7, 7, 7, 4: the last segment is shorter
        out = lm(x[:, lo : lo + 7], state=state)
        pieces.append(out.logits)
        state = detach(out.state)
    torch.testing.assert_close(torch.cat(pieces, 1), whole.logits, rtol=0, atol=1e-12)
    for a, b in zip(
        state if kind == "lstm" else [state],
        whole.state if kind == "lstm" else [whole.state],
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_gradient_does_not_cross_the_segment_cut():
    lm = make_lm("lstm", 2)
    kept = keep_embeddings(lm)
    x, y = tokens(2, 12), tokens(2, 12, seed=6)
    first = lm.loss(x[:, :6], y[:, :6])
    second = lm.loss(x[:, 6:], y[:, 6:], state=detach(first.state))
    (g,) = torch.autograd.grad(second.loss, kept[0], allow_unused=True)
    assert g is None  # segment 1's inputs are not in segment 2's graph
    # Control: without the cut the gradient does reach segment 1.
    third = lm.loss(x[:, 6:], y[:, 6:], state=first.state)
    (g,) = torch.autograd.grad(third.loss, kept[0])
    assert g.abs().sum() > 0


# -- 4. window truncation BPTT(τ) ------------------------------------------------------------
def truncated_graph_loss(lm, x, y, mask, tau, starts=None):
    """Σ_t ℓ_t / N where ℓ_t is recomputed over steps t−τ … t, in every layer, from the
    DETACHED state before step t−τ (documents starting inside the batch reset their rows:
    the state before t−τ is that of the run with the same starts)."""
    total = x.new_zeros((), dtype=torch.float64)
    T = x.shape[1]

    def cut(a, lo, hi):
        return None if a is None else a[:, lo:hi]

    for t in range(T):
        lo = max(t - tau, 0)
        state = None
        if lo > 0:
            with torch.no_grad():
                state = lm(x[:, :lo], mask=mask[:, :lo], starts=cut(starts, 0, lo)).state
        logits = lm(
            x[:, lo : t + 1], mask=mask[:, lo : t + 1], state=state, starts=cut(starts, lo, t + 1)
        ).logits[:, -1]
        ce = F.cross_entropy(logits, y[:, t], reduction="none")
        total = total + torch.where(mask[:, t], ce, 0.0).sum()
    return total / mask.sum()


def grads(lm, loss):
    lm.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in lm.named_parameters()}


PADDED = torch.tensor(
    [[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7], dtype=torch.bool
)  # (3, 9) padded sequences as the SequenceBatcher makes them


STARTS = torch.zeros(3, 9, dtype=torch.bool)
STARTS[0, 4] = True  # row 0: a document starts at 4
STARTS[1, 0] = STARTS[1, 3] = True  # row 1: a fresh start, and another at 3
# row 2 runs straight through (and is padded after 2 steps)

WINDOW_CASES = [
    ("lstm", 1, 1),
    ("gru", 1, 3),
    ("rnn", 1, 2),
    ("lstm", 2, 2),
    ("gru", 2, 1),
    ("rnn", 2, 3),
    ("lstm", 3, 2),
    ("gru", 3, 2),
    ("rnn", 3, 1),
]


@pytest.mark.parametrize("with_starts", [False, True], ids=["nostarts", "starts"])
@pytest.mark.parametrize(
    ("kind", "layers", "tau"), WINDOW_CASES, ids=[f"{k}-L{n}-tau{t}" for k, n, t in WINDOW_CASES]
)
def test_window_gradients_equal_autograd_of_the_truncated_graph(kind, layers, tau, with_starts):
    lm = make_lm(kind, layers)
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    starts = STARTS if with_starts else None
    windowed = grads(lm, lm.loss(x, y, mask=PADDED, starts=starts, window=tau).loss)
    reference = grads(lm, truncated_graph_loss(lm, x, y, PADDED, tau, starts))
    full = grads(lm, lm.loss(x, y, mask=PADDED, starts=starts).loss)
    for name in reference:
        torch.testing.assert_close(windowed[name], reference[name], rtol=1e-9, atol=1e-12)
    assert not torch.allclose(windowed["embedding.weight"], full["embedding.weight"])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_window_at_least_sequence_length_is_full_bptt(kind):
    lm = make_lm(kind, 2)
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    full = grads(lm, lm.loss(x, y, mask=PADDED).loss)
    for tau in (9, 30):
        windowed = grads(lm, lm.loss(x, y, mask=PADDED, window=tau).loss)
        for name in full:
            torch.testing.assert_close(windowed[name], full[name], rtol=1e-10, atol=1e-13)


def test_window_in_a_stack_equals_the_truncated_graph_of_the_stack():
    lm = make_lm("gru", 2)
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    windowed = grads(lm, lm.loss(x, y, mask=PADDED, window=2).loss)
    reference = grads(lm, truncated_graph_loss(lm, x, y, PADDED, 2))
    for name in reference:
        torch.testing.assert_close(windowed[name], reference[name], rtol=1e-9, atol=1e-12)


def test_window_with_starts_reaches_back_at_most_tau_steps():
    lm = make_lm("gru", 1)
    kept = keep_embeddings(lm, retain=True)
    x = tokens(2, 8)
    starts = torch.zeros(2, 8, dtype=torch.bool)
    starts[0, 4] = True  # row 0 starts a document at 4; row 1 runs straight through
    lm(x, starts=starts, window=2).logits[1, 5].sum().backward()
    g = kept[0].grad[1].abs().sum(-1)
    assert torch.all(g[:3] == 0), g  # window 2 from step 5: steps 3, 4 and 5 only


# -- 5. document starts reset the state ------------------------------------------------------
@pytest.mark.parametrize(("kind", "layers"), CASES, ids=CASE_IDS)
def test_starts_reset_rows_to_the_zero_state(kind, layers):
    lm = make_lm(kind, layers)
    B, T = 3, 10
    x = tokens(B, T)
    carried = random_state(lm, B)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[0, 4] = True  # row 0: the carried document ends at 3, a new one starts at 4
    starts[1, 0] = starts[1, 7] = True  # row 1: fresh start, and another document at 7
    out = lm(x, state=carried, starts=starts)

    def alone(b, lo, hi, state=None):
        return lm(x[b : b + 1, lo:hi], state=state).logits[0]

    expected = {
        (0, 0, 4): alone(0, 0, 4, row(carried, 0)),
        (0, 4, T): alone(0, 4, T),
        (1, 0, 7): alone(1, 0, 7),
        (1, 7, T): alone(1, 7, T),
        (2, 0, T): alone(2, 0, T, row(carried, 2)),
    }
    for (b, lo, hi), logits in expected.items():
        torch.testing.assert_close(out.logits[b, lo:hi], logits, rtol=0, atol=1e-12)
    # The final state of row 0 is that of its new document alone.
    final_alone = lm(x[0:1, 4:]).state
    got = out.state.h[:, :, 0:1] if kind == "lstm" else out.state[:, :, 0:1]
    want = final_alone.h if kind == "lstm" else final_alone
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_step_by_step_generation_matches_the_forward():
    lm = make_lm("lstm", 2)
    x = tokens(2, 6)
    logp = torch.log_softmax(lm(x).logits, -1)
    state = None
    for t in range(6):
        step_logp, state = lm.step(x[:, t], state)
        torch.testing.assert_close(step_logp, logp[:, t], rtol=0, atol=1e-12)


def _parts(state):
    return tuple(state) if isinstance(state, LSTMState) else (state,)


STEP_MODELS = {
    "lstm-L2": lambda: make_lm("lstm", 2, torch.float32).eval(),
    "gru-dropout": lambda: make_lm("gru", 1, torch.float32, dropout=0.3).eval(),
    # embeddings 64 wide: a batch of more ids than the vocabulary reads the input table
    "table": lambda: build_language_model(ModelSpec(hidden=16, embedding=64), V).eval(),
    "training": lambda: make_lm("lstm", 2, torch.float32, dropout=0.3).train(),
}


@pytest.mark.parametrize("name", list(STEP_MODELS))
@pytest.mark.parametrize("batch", [1, 3, 40])
def test_a_step_is_the_forward_of_one_token_to_the_last_bit(name, batch):
    # The step leaves out the forward's wrapping (the module call, LMOutput, the head
    # on (B, 1, H)); its log-probabilities and state are the forward's, in float32, and
    # in training its dropout draws the forward's masks from the same seed.
    lm = STEP_MODELS[name]()
    state = None
    for t in range(4):
        token = tokens(batch, 1, seed=t).view(-1)
        torch.manual_seed(t)
        with torch.no_grad():
            want = lm(token.view(-1, 1), state=state)
        torch.manual_seed(t)
        log_probs, new = lm.step(token, state)
        assert torch.equal(log_probs, torch.log_softmax(want.logits[:, 0], dim=-1)), t
        assert all(map(torch.equal, _parts(new), _parts(want.state))), t
        state = new


def test_a_step_runs_without_gradients_and_leaves_the_mode_as_it_was():
    lm = make_lm("lstm", 1, torch.float32)
    log_probs, state = lm.step(torch.tensor([1, 2]))
    assert not log_probs.requires_grad and not state.h.requires_grad
    assert torch.is_grad_enabled()


def test_a_hook_on_the_dropout_sees_a_step_call_it():
    # The step skips the dropout module where it does nothing, unless a hook would see it.
    lm = make_lm("lstm", 1, torch.float32).eval()
    seen = []
    lm.drop.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    lm.step(torch.tensor([1, 2]))
    assert seen == [(2, 1, E), (2, H)]


def test_a_step_goes_through_a_hooked_or_subclassed_forward():
    # The step computes forward's function without calling it, unless a hook on the model
    # or a subclass's own forward should see the call.
    lm = make_lm("lstm", 1, torch.float32).eval()
    seen = []
    handle = lm.register_forward_hook(lambda module, args, out: seen.append(out.logits.shape))
    hooked, _ = lm.step(torch.tensor([1, 2]))
    handle.remove()
    assert seen == [(2, 1, lm.head.out_features)]
    plain, _ = lm.step(torch.tensor([1, 2]))
    assert torch.equal(hooked, plain)

    class Louder(type(lm)):
        def forward(self, inputs, mask=None, state=None, **kw):
            out = super().forward(inputs, mask, state, **kw)
            return out._replace(logits=2 * out.logits)

    logits = lm(torch.tensor([[1], [2]])).logits[:, 0]
    lm.__class__ = Louder
    louder, _ = lm.step(torch.tensor([1, 2]))
    assert torch.equal(louder, torch.log_softmax(2 * logits, dim=-1))


@pytest.mark.parametrize("rows", [1, 64, 65, 300])
def test_the_id_check_names_the_first_bad_id_read_on_the_host_or_not(rows):
    # Up to 64 ids on the CPU are read on the host, more by tensor operations: the same
    # answer either way, on contiguous ids and on a transposed view.
    from rnnkit.models.language_model import check_token_ids

    ids = torch.arange(2 * rows).view(2, rows).T % 9  # (rows, 2), not contiguous
    assert check_token_ids(ids, 9) is ids
    for bad in (9, -1, 1000):
        wrong = ids.clone()
        wrong[rows // 2, 1] = bad
        message = rf"token ids in \[0, 9\) .*, got {bad} at \({rows // 2}, 1\)$"
        with pytest.raises(ValueError, match=message):
            check_token_ids(wrong, 9)
        with pytest.raises(ValueError, match=message):
            check_token_ids(wrong.T.contiguous().T, 9)


def test_a_step_names_a_token_outside_the_vocabulary():
    lm = make_lm("gru", 1, torch.float32)
    message = rf"^inputs must hold token ids in \[0, {V}\) .*, got {V} at \(1, 0\)$"
    with pytest.raises(ValueError, match=message):
        lm.step(torch.tensor([3, V]))
    with pytest.raises(TypeError, match="integer token ids"):
        lm.step(torch.tensor([1.0]))


def test_rejects_bidirectional_encoder_and_width_mismatch():
    with pytest.raises(ValueError, match="unidirectional"):
        LanguageModel(nn.Embedding(V, E), LSTM(E, H, bidirectional=True), nn.Linear(2 * H, V))
    with pytest.raises(ValueError, match="embedding_dim"):
        LanguageModel(nn.Embedding(V, E + 1), LSTM(E, H), nn.Linear(H, V))


# -- 6. weight tying -------------------------------------------------------------------------
def build(hidden, embedding, tie, cell="lstm"):
    torch.manual_seed(0)
    spec = ModelSpec(cell=cell, hidden=hidden, embedding=embedding, tie_weights=tie)
    return build_language_model(spec, V).double()


def n_params(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(("hidden", "embedding"), [(6, 6), (8, 6)])
def test_tied_head_shares_the_embedding_parameter(hidden, embedding):
    tied, untied = build(hidden, embedding, True), build(hidden, embedding, False)
    assert isinstance(tied.head, TiedHead)
    assert tied.head.weight is tied.embedding.weight
    params = list(tied.parameters())
    assert sum(p is tied.embedding.weight for p in params) == 1
    projection = hidden * embedding if hidden != embedding else 0
    assert (tied.head.projection is None) == (hidden == embedding)
    # The head's V×H matrix is gone; a projection H×E comes in when widths differ.
    assert n_params(untied) - n_params(tied) == V * hidden - projection


def test_tied_weight_gradient_sums_both_uses():
    tied = build(8, 6, True)
    # The untied twin: the same numbers, the embedding matrix copied into two Parameters.
    twin_head = nn.Linear(6, V).double()
    with torch.no_grad():
        twin_head.weight.copy_(tied.embedding.weight)
        twin_head.bias.copy_(tied.head.bias)

    def twin_head_fn(h: Tensor) -> Tensor:
        return twin_head(tied.head.projection(h))

    x, y = tokens(2, 7), tokens(2, 7, seed=3)
    tied.zero_grad()
    tied.loss(x, y).loss.backward()
    g_tied = tied.embedding.weight.grad.clone()
    tied.zero_grad()
    out = tied.encoder(tied.embedding(x)).outputs
    F.cross_entropy(twin_head_fn(out).reshape(-1, V), y.reshape(-1)).backward()
    g_input, g_output = tied.embedding.weight.grad, twin_head.weight.grad
    assert g_input.abs().sum() > 0 and g_output.abs().sum() > 0
    torch.testing.assert_close(g_tied, g_input + g_output, rtol=1e-10, atol=1e-13)


def test_tied_head_logits_use_the_embedding_matrix():
    tied = build(6, 6, True)
    h = torch.randn(2, 3, 6, dtype=torch.float64)
    expected = h @ tied.embedding.weight.T + tied.head.bias
    torch.testing.assert_close(tied.head(h), expected, rtol=0, atol=1e-12)


# -- scheduled sampling ------------------------------------------------------------------------
def free_running_reference(lm, x, y, mask, coins, p):
    """Autograd oracle: the cells' own differentiable step (no explicit BPTT), one token at
    a time; at step t ≥ 1 a row feeds argmax of its previous logits (``<pad>``, ``<unk>``,
    ``<s>`` left out) where ``coins[:, t] < p`` and the step is real."""
    cells = lm.encoder.cells()
    B, T = x.shape
    hs = [torch.zeros(B, H, dtype=torch.float64) for _ in cells]
    cs = [torch.zeros(B, H, dtype=torch.float64) for _ in cells]
    total = x.new_zeros((), dtype=torch.float64)
    prev = None
    for t in range(T):
        token = x[:, t]
        if t > 0:
            # the greedy choice among the tokens generation may produce (not 0, 1, 2)
            own = prev.detach().index_fill(-1, torch.tensor([0, 1, 2]), -math.inf).argmax(-1)
            token = torch.where((coins[:, t] < p) & mask[:, t], own, token)
        inp = lm.embedding(token)
        for k, cell in enumerate(cells):
            if cell.is_lstm:
                h, c = cell(inp, LSTMState(hs[k], cs[k]))
                cs[k] = torch.where(mask[:, t : t + 1], c, cs[k])
            else:
                h = cell(inp, hs[k])
            hs[k] = torch.where(mask[:, t : t + 1], h, hs[k])
            inp = hs[k]
        prev = lm.head(inp)
        ce = F.cross_entropy(prev, y[:, t], reduction="none")
        total = total + torch.where(mask[:, t], ce, 0.0).sum()
    return total / mask.sum()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_scheduled_sampling_p0_is_teacher_forcing(kind):
    lm = make_lm(kind, 2)
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    got = grads(lm, lm.scheduled_loss(x, y, PADDED, sampling_p=0.0).loss)
    want = grads(lm, lm.loss(x, y, mask=PADDED).loss)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("p", [1.0, 0.5])
@pytest.mark.parametrize("specials_first", [False, True])
def test_scheduled_sampling_equals_autograd_of_the_sampled_graph(kind, p, specials_first):
    """Loss and every gradient equal autograd through the cells' plain step functions fed
    the same choices (the coins drawn from the same seeded generator); with the specials
    made the most probable outputs, the fed choice is still never one of them."""
    lm = make_lm(kind, 2)
    if specials_first:
        with torch.no_grad():
            lm.head.bias[:3] += 20.0
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    out = lm.scheduled_loss(x, y, PADDED, sampling_p=p, generator=torch.Generator().manual_seed(3))
    got = grads(lm, out.loss)
    g = torch.Generator().manual_seed(3)
    coins = torch.stack([torch.zeros(3)] + [torch.rand(3, generator=g) for _ in range(8)], 1)
    ref_loss = free_running_reference(lm, x, y, PADDED, coins, p)
    want = grads(lm, ref_loss)
    torch.testing.assert_close(out.loss.detach(), ref_loss.detach(), rtol=1e-10, atol=1e-12)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12)
    if p == 1.0:  # free running differs from teacher forcing
        assert not torch.allclose(out.loss, lm.loss(x, y, mask=PADDED).loss)


def test_sequence_loss_reduction_weighs_every_sequence_the_same():
    lm = make_lm("gru", 1)
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    lm.loss_reduction = "sequence"
    out = lm.loss(x, y, mask=PADDED)
    logits = lm(x, mask=PADDED).logits
    per_row = [F.cross_entropy(logits[b][PADDED[b]], y[b][PADDED[b]]) for b in range(3)]
    torch.testing.assert_close(out.loss, torch.stack(per_row).mean(), rtol=1e-12, atol=1e-12)
    lm.loss_reduction = "token"
    token = lm.loss(x, y, mask=PADDED)
    assert out.tokens == token.tokens == int(PADDED.sum())
    assert out.nats == pytest.approx(token.nats, rel=1e-12)  # the figures stay per token
    assert not torch.allclose(out.loss, token.loss)


# ------------------------------------------------- the first layer's input from a table
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("layers", [1, 2])
def test_table_input_equals_the_product(cell, layers):
    """Reading x W_ihᵀ from the table E W_ihᵀ gives the same logits, final state and every
    gradient as the product of the embeddings (float64)."""
    from rnnkit.bptt.native import available, use_native

    if not available():
        pytest.skip("no compiled loop here")
    torch.manual_seed(0)
    lm = build_language_model(ModelSpec(cell=cell, hidden=8, embedding=64, layers=layers), 11)
    lm = lm.double()
    x = torch.randint(0, 11, (4, 9))
    with torch.no_grad():
        state = lm(x[:, :3]).state  # a carried state, as stream batches have
    assert lm._reads_table(x, None, None, None)
    out = lm(x, state=state)
    got = torch.autograd.grad(out.logits.pow(2).sum(), list(lm.parameters()))
    with use_native(False):
        assert not lm._reads_table(x, None, None, None)
        ref = lm(x, state=state)
        want = torch.autograd.grad(ref.logits.pow(2).sum(), list(lm.parameters()))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-13, rtol=1e-11)
    ref_state = ref.state if isinstance(ref.state, tuple) else (ref.state,)
    out_state = out.state if isinstance(out.state, tuple) else (out.state,)
    for a, b in zip(out_state, ref_state, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-11)
    for (name, _), a, b in zip(lm.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_table_input_with_recurrent_dropout_and_zoneout_equals_the_product(cell):
    """In training with recurrent dropout, zoneout and weight drop (masks drawn from the
    same seed), the table's rows give the same logits and gradients as the product."""
    from rnnkit.bptt.native import available, use_native

    if not available():
        pytest.skip("no compiled loop here")
    torch.manual_seed(0)
    spec = ModelSpec(
        cell=cell, hidden=8, embedding=64, recurrent_dropout=0.3, zoneout=0.2, weight_drop=0.2
    )
    lm = build_language_model(spec, 11).double().train()
    x = torch.randint(0, 11, (4, 9))
    assert lm._reads_table(x, None, None, None)
    torch.manual_seed(1)
    out = lm(x)
    got = torch.autograd.grad(out.logits.pow(2).sum(), list(lm.parameters()))
    with use_native(False):
        assert not lm._reads_table(x, None, None, None)
        torch.manual_seed(1)
        ref = lm(x)
        want = torch.autograd.grad(ref.logits.pow(2).sum(), list(lm.parameters()))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-13, rtol=1e-11)
    for (name, _), a, b in zip(lm.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=name)


def test_table_input_only_where_it_is_the_same_model_and_faster():
    from rnnkit.bptt.native import available

    if not available():
        pytest.skip("no compiled loop here")
    lm = build_language_model(ModelSpec(hidden=8, embedding=64, dropout=0.3), 11)
    x = torch.randint(0, 11, (4, 9))
    none = (None, None, None)
    assert not lm.train()._reads_table(x, *none)  # dropout on the embeddings
    assert lm.eval()._reads_table(x, *none)  # no dropout in evaluation
    assert not lm._reads_table(x[:2, :2], *none)  # fewer tokens than the vocabulary
    assert not lm._reads_table(x, None, None, 4)  # windowed BPTT
    assert not lm._reads_table(x, None, torch.zeros(4, 9, dtype=torch.bool), None)  # starts
    assert not lm._reads_table(x, torch.ones(4, 9, dtype=torch.bool), None, None)  # padded
    handle = lm.embedding.register_forward_hook(lambda *a: None)
    assert not lm._reads_table(x, *none)  # a hook expects the embedding to run
    handle.remove()
    lm.encoder.recompute = 2
    assert not lm._reads_table(x, *none)
    narrow = build_language_model(ModelSpec(hidden=8, embedding=32), 11)
    assert not narrow._reads_table(x, *none)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_scheduled_sampling_p0_keeps_one_mask_per_sequence(kind):
    """With every regularizer on, the step-by-step loss at p = 0 draws the same masks as
    the teacher-forced loss (one per sequence, the embedding's rows once, zoneout's step
    t at step t): equal losses and gradients from the same seed."""
    spec = ModelSpec(
        cell=kind,
        hidden=6,
        embedding=5,
        layers=2,
        input_dropout=0.3,
        locked_dropout=0.3,
        output_dropout=0.3,
        recurrent_dropout=0.3,
        weight_drop=0.3,
        zoneout=0.3,
        embedding_dropout=0.3,
    )
    torch.manual_seed(0)
    lm = build_language_model(spec, V).double().train()
    x, y = tokens(3, 9), tokens(3, 9, seed=7)
    torch.manual_seed(5)
    got = grads(lm, lm.scheduled_loss(x, y, PADDED, sampling_p=0.0).loss)
    torch.manual_seed(5)
    want = grads(lm, lm.loss(x, y, mask=PADDED).loss)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12)


def test_table_input_with_weight_drop_and_the_regularizers_that_forbid_it():
    """Weight drop keeps the table read (the masked W_hh goes to the loop): the same
    logits and gradients as the product with the same masks; input dropout and embedding
    dropout (in training) do not read it (recurrent dropout and zoneout do: the test
    above)."""
    from rnnkit.bptt.native import available, use_native

    if not available():
        pytest.skip("no compiled loop here")
    torch.manual_seed(0)
    spec = ModelSpec(hidden=8, embedding=64, layers=2, weight_drop=0.5, locked_dropout=0.3)
    lm = build_language_model(spec, 11).double().train()
    x = torch.randint(0, 11, (4, 9))
    assert lm._reads_table(x, None, None, None)
    masks = lm.encoder.draw_masks(4, 9, lm.embedding.weight)
    table = lm.encoder.input_table(lm.embedding.weight)
    xp = torch.nn.functional.embedding(x, table)
    h = lm.encoder(xp, masks=masks, projected=True).outputs
    got = torch.autograd.grad(lm.head(h).pow(2).sum(), list(lm.parameters()))
    with use_native(False):
        ref = lm.encoder(lm.embedding(x), masks=masks).outputs
        want = torch.autograd.grad(lm.head(ref).pow(2).sum(), list(lm.parameters()))
    torch.testing.assert_close(h, ref)
    for (name, _), a, b in zip(lm.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(a, b, msg=name)
    none = (None, None, None)
    for field in ("input_dropout", "embedding_dropout"):
        other = build_language_model(ModelSpec(hidden=8, embedding=64, **{field: 0.2}), 11)
        assert not other.train()._reads_table(x, *none), field
    assert (
        build_language_model(ModelSpec(hidden=8, embedding=64, input_dropout=0.2), 11)
        .eval()
        ._reads_table(x, *none)
    )


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        (torch.tensor([[4, 9]]), ValueError, r"token ids in \[0, 9\) .*, got 9 at \(0, 1\)"),
        (torch.tensor([[-1, 2]]), ValueError, r"token ids in \[0, 9\) .*, got -1 at \(0, 0\)"),
        (torch.tensor([[1.0, 2.0]]), TypeError, "integer token ids, got dtype torch.float32"),
        (torch.tensor([1, 2]), ValueError, r"shape \(B, T\), got \(2,\)"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_named(ids, error, message):
    # torch's embedding said "index out of range in self" (or failed on the dtype).
    lm = build_language_model(ModelSpec(hidden=4, embedding=3), 9)
    with pytest.raises(error, match=f"^inputs must .*{message}"):
        lm(ids)
    with pytest.raises(error, match=r"^inputs must"):
        lm.loss(ids, torch.zeros_like(ids, dtype=torch.long))
    assert lm(torch.tensor([[0, 8]])).logits.shape == (1, 2, 9)


def test_lengths_without_a_length_mechanism_is_refused_not_ignored():
    # lengths=(B,) reads like padding; it was ignored and the padded steps read as
    # tokens, so the result differed from the masked one without a word
    torch.manual_seed(0)
    lm = build_language_model(ModelSpec(cell="gru", hidden=8, embedding=4), 11)
    ids = torch.randint(0, 11, (2, 5))
    with pytest.raises(ValueError, match=r"^lengths is read by a model with a length mechanism"):
        lm(ids, lengths=torch.tensor([5, 3]))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    assert lm(ids, mask=mask).logits.shape == (2, 5, 11)


def test_a_language_model_exports_with_a_dynamic_batch():
    """The output layer's and the embedding table's speed choices compare sizes: a traced
    graph makes none (they would guard the batch), so the batch stays dynamic; the
    program equals eager at other batch sizes (64-wide embeddings: the table path)."""
    from torch.export import Dim

    torch.manual_seed(0)
    lm = build_language_model(ModelSpec(hidden=16, embedding=64, layers=1), V).eval()
    batch = Dim("B", min=1, max=64)
    program = torch.export.export(
        lm, (torch.randint(0, V, (3, 6)),), dynamic_shapes={"inputs": {0: batch}}
    )
    for rows in (1, 20):
        ids = torch.randint(0, V, (rows, 6))
        torch.testing.assert_close(program.module()(ids).logits, lm(ids).logits)
