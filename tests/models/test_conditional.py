"""ConditionalLM (fixed context c, Fig. 10.9): each context mode equals its explicit
construction (state from tanh(W_c c + b_c), inputs concatenated with c, or both), and
each mode learns a class-conditional task with exact answers."""

from __future__ import annotations

import pytest
import torch

from rnnkit.data.vocab import BOS_ID, EOS_ID
from rnnkit.errors import ConfigError
from rnnkit.generation.search import generate_batch
from rnnkit.models.conditional import (
    CONDITIONAL_STATE_DIM,
    ConditionalLM,
    class_conditional_lm,
)
from rnnkit.types import LSTMState

V, K, E, H = 8, 3, 4, 6
A, B_ = 4, 5  # token ids of "a" and "b"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def make(context, cell="gru", layers=2, seed=0) -> ConditionalLM:
    torch.manual_seed(seed)
    lm = class_conditional_lm(V, K, E, H, context=context, cell=cell, num_layers=layers)
    return lm.double()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor([0, 2, 1])
    inputs = torch.randint(4, V, (3, 5), generator=g)
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]], dtype=torch.bool)
    return labels, inputs, mask


def explicit_h0(lm: ConditionalLM, c):
    """``h^l_0 = tanh(W^l_c c + b^l_c)``, each layer's rows of the bridge by hand."""
    W, b = lm.bridge.weight, lm.bridge.bias  # (L·H, C), (L·H,)
    layers = [torch.tanh(c @ W[l * H : (l + 1) * H].T + b[l * H : (l + 1) * H]) for l in range(2)]
    return torch.stack(layers).unsqueeze(1)  # (L, 1, B, H)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_init_mode_is_the_encoder_run_from_tanh_of_the_projected_context(cell):
    lm = make("init", cell)
    labels, inputs, mask = batch()
    c = lm.conditioner(labels)
    h0 = explicit_h0(lm, c)
    state = LSTMState(h0, torch.zeros_like(h0)) if cell == "lstm" else h0
    out = lm.encoder(lm.embedding(inputs), mask=mask, state=state)
    torch.testing.assert_close(lm(labels, inputs, mask).logits, lm.head(out.outputs))
    # Changing c changes the run only through h_0: same h_0, same outputs.
    c2 = c + 1.0
    lm2 = make("init", cell)
    with torch.no_grad():
        lm2.conditioner.weight.add_(1.0)
    torch.testing.assert_close(
        lm2(labels, inputs, mask).logits,
        lm.head(lm.encoder(lm.embedding(inputs), mask=mask, state=_state(lm, c2, cell)).outputs),
    )


def _state(lm, c, cell):
    h0 = explicit_h0(lm, c)
    return LSTMState(h0, torch.zeros_like(h0)) if cell == "lstm" else h0


def test_input_mode_is_the_encoder_on_inputs_concatenated_with_c():
    lm = make("input")
    labels, inputs, mask = batch()
    c = lm.conditioner(labels)
    x = torch.cat([lm.embedding(inputs), c[:, None].expand(-1, 5, -1)], dim=-1)
    out = lm.encoder(x, mask=mask)  # zero initial state
    torch.testing.assert_close(lm(labels, inputs, mask).logits, lm.head(out.outputs))
    assert lm.bridge is None


def test_input_mode_is_plus_r_c_in_the_first_pre_activation():
    # W_x [e; c] = W_e e + R c: the first layer's input product splits exactly.
    lm = make("input", cell="rnn", layers=1)
    labels, inputs, _ = batch()
    c = lm.conditioner(labels)
    cell = lm.encoder.cells()[0]
    W_e, R = cell.weight_ih[:, :E], cell.weight_ih[:, E:]
    e = lm.embedding(inputs[:, 0])
    h1 = torch.tanh(e @ W_e.T + c @ R.T + cell.bias)  # h_0 = 0
    torch.testing.assert_close(lm(labels, inputs).logits[:, 0], lm.head(h1))


def test_both_mode_combines_the_two():
    lm = make("both", "lstm")
    labels, inputs, mask = batch()
    c = lm.conditioner(labels)
    x = torch.cat([lm.embedding(inputs), c[:, None].expand(-1, 5, -1)], dim=-1)
    out = lm.encoder(x, mask=mask, state=_state(lm, c, "lstm"))
    torch.testing.assert_close(lm(labels, inputs, mask).logits, lm.head(out.outputs))


def test_step_by_step_generation_state_matches_teacher_forcing():
    lm = make("both").eval()
    labels, inputs, _ = batch()
    full = torch.log_softmax(lm(labels, inputs).logits, -1)
    state = lm.start(labels)
    for t in range(inputs.shape[1]):
        lp, state = lm.step(inputs[:, t], state)
        torch.testing.assert_close(lp, full[:, t])


# class 0 → "aaa", class 1 → "bbbbb", class 2 → "ab"
TARGETS = {0: [A] * 3, 1: [B_] * 5, 2: [A, B_]}


def conditional_batch():
    labels = torch.tensor(list(TARGETS))
    T = max(len(v) for v in TARGETS.values()) + 1
    inputs = torch.zeros(len(labels), T, dtype=torch.long)
    targets = torch.zeros_like(inputs)
    mask = torch.zeros_like(inputs, dtype=torch.bool)
    for i, k in enumerate(labels.tolist()):
        y = TARGETS[k]
        inputs[i, : len(y) + 1] = torch.tensor([BOS_ID, *y])
        targets[i, : len(y) + 1] = torch.tensor([*y, EOS_ID])
        mask[i, : len(y) + 1] = True
    return labels, inputs, targets, mask


@pytest.mark.parametrize("context", ["init", "input", "both"])
def test_each_mode_learns_to_generate_the_requested_class(context):
    torch.manual_seed(0)
    lm = class_conditional_lm(V, K, E, 16, context=context)
    labels, inputs, targets, mask = conditional_batch()
    opt = torch.optim.Adam(lm.parameters(), lr=0.03)
    for _ in range(120):
        opt.zero_grad()
        out = lm.loss(labels, inputs, targets, mask)
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.05
    lm.eval()
    hyps = lm.generate(labels, max_length=10)
    assert [h[0].ids for h in hyps] == [TARGETS[k] for k in labels.tolist()]
    assert all(h[0].finished for h in hyps)
    # Sampling through generate_batch with the documented state layout agrees.
    g = torch.Generator().manual_seed(3)
    samples = generate_batch(
        lm,
        None,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        max_length=10,
        strategy="sample",
        num=2,
        generator=g,
        state=lm.start(labels),
        state_batch_dim=CONDITIONAL_STATE_DIM,
    )
    for k, rows in zip(labels.tolist(), samples, strict=True):
        assert [r.ids for r in rows] == [TARGETS[k]] * 2


def test_bad_arguments_are_named():
    with pytest.raises(ConfigError, match="context"):
        class_conditional_lm(V, K, E, H, context="every")
    with pytest.raises(ConfigError, match="cell"):
        class_conditional_lm(V, K, E, H, cell="elman")
    lm = make("input")
    with pytest.raises(ValueError, match="input_size must be embedding_dim \\+ context_size"):
        ConditionalLM(lm.embedding, make("init").encoder, lm.head, lm.conditioner, E, "input")
    with pytest.raises(ValueError, match="conditioner must give"):
        ConditionalLM(lm.embedding, lm.encoder, lm.head, torch.nn.Embedding(K, 3), E, "input")(
            torch.tensor([0]), torch.tensor([[BOS_ID]])
        )


def test_ids_out_of_the_vocabulary_are_one_error_naming_them():
    """As a LanguageModel's: on a GPU the embedding lookup would otherwise stop the
    process with a device-side assert (and on the CPU raise an IndexError from inside)."""
    lm = class_conditional_lm(6, 2, 4, 5)
    with pytest.raises(ValueError, match=r"token ids in \[0, 6\).*got 9 at \(1, 1\)"):
        lm(torch.tensor([0, 1]), torch.tensor([[1, 2], [3, 9]]))
    state = lm.start(torch.tensor([0]))
    with pytest.raises(ValueError, match=r"token ids in \[0, 6\).*got 7"):
        lm.step(torch.tensor([7]), state)
