"""JordanLM (output-to-hidden, Fig. 10.4): teacher forcing equals an explicit loop over
one-hot fed-back targets, each step's loss reaches only its own step (no recurrence in
the graph, no time loop), and generation feeds back the model's own tokens in O(n)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit import GRU
from rnnkit.data.vocab import BOS_ID
from rnnkit.generation.search import generate
from rnnkit.models.jordan import JordanLM, jordan_lm
from rnnkit.models.language_model import LanguageModel

V, H, I = 9, 6, 3


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    yield


def make(input_size=I, seed=0, nonlinearity="tanh") -> JordanLM:
    torch.manual_seed(seed)
    return jordan_lm(V, H, input_size=input_size, nonlinearity=nonlinearity).double()


def data(B=3, T=7, seed=1) -> tuple[Tensor, Tensor, Tensor]:
    """Targets, teacher-forced inputs ``<s> y_1 … y_{T−1}``, and per-step ``x_t``."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(4, V, (B, T), generator=g)
    prev = torch.cat([torch.full((B, 1), BOS_ID), targets[:, :-1]], dim=1)
    x = torch.randn(B, T, I, generator=g, dtype=torch.float64)
    return targets, prev, x


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu", "sigmoid"])
def test_teacher_forcing_equals_a_step_by_step_loop_over_true_targets(nonlinearity):
    lm = make(nonlinearity=nonlinearity)
    targets, prev, x = data()
    W_o = lm.feedback.weight.T  # (H, V): the fed-back one-hot picks a column
    W_x = lm.input_weight.weight
    phi = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid}[nonlinearity]
    o_prev = F.one_hot(torch.full((3,), BOS_ID), V).double()  # o_0 = e_<s>
    steps = []
    for t in range(targets.shape[1]):
        h = phi(x[:, t] @ W_x.T + o_prev @ W_o.T + lm.bias)
        steps.append(lm.head(h))
        o_prev = F.one_hot(targets[:, t], V).double()  # teacher forcing: the TRUE y_t
    torch.testing.assert_close(lm(prev, x), torch.stack(steps, 1), rtol=1e-12, atol=1e-12)


def test_step_loss_gradient_reaches_only_its_own_step():
    lm = make()
    targets, prev, x = data()
    x.requires_grad_(True)
    h = lm.hidden(prev, x)  # (B, T, H)
    logits = lm.head(h)
    T = targets.shape[1]
    for t in range(T):
        loss_t = F.cross_entropy(logits[:, t], targets[:, t])
        d_x, d_h, d_wo = torch.autograd.grad(loss_t, [x, h, lm.feedback.weight], retain_graph=True)
        others = [s for s in range(T) if s != t]
        assert torch.count_nonzero(d_x[:, others]) == 0
        assert torch.count_nonzero(d_h[:, others]) == 0
        assert torch.count_nonzero(d_x[:, t]) > 0 and torch.count_nonzero(d_h[:, t]) > 0
        # W_o gets gradient only in the columns of the tokens fed at step t (y_{t−1}).
        touched = set(torch.nonzero(d_wo.abs().sum(1)).view(-1).tolist())
        assert touched == set(prev[:, t].tolist())


def test_the_same_check_fails_for_the_hidden_to_hidden_wiring():
    # The contrast that shows the check above can fail: with W_h, step t's loss reaches
    # the inputs of every earlier step.
    torch.manual_seed(0)
    lm = LanguageModel(nn.Embedding(V, 4), GRU(4, H), nn.Linear(H, V)).double()
    targets, prev, _ = data()
    emb = lm.embedding(prev).detach().requires_grad_(True)
    out = lm.encoder(emb)
    loss_t = F.cross_entropy(lm.head(out.outputs[:, -1]), targets[:, -1])
    (d_emb,) = torch.autograd.grad(loss_t, [emb])
    assert torch.count_nonzero(d_emb[:, 0]) > 0


def test_step_output_depends_only_on_x_t_and_y_t_minus_1():
    lm = make()
    targets, prev, x = data()
    T, t = targets.shape[1], 4
    g = torch.Generator().manual_seed(9)
    prev2 = torch.randint(4, V, prev.shape, generator=g)
    x2 = torch.randn(x.shape, generator=g, dtype=torch.float64)
    prev2[:, t], x2[:, t] = prev[:, t], x[:, t]  # everything else differs
    assert bool((prev2[:, :t] != prev[:, :t]).any())
    with torch.no_grad():
        a, b = lm(prev, x), lm(prev2, x2)
        assert torch.equal(a[:, t], b[:, t])
        assert not torch.allclose(
            a[:, [s for s in range(T) if s != t]], b[:, [s for s in range(T) if s != t]]
        )
        prev3 = prev.clone()
        prev3[:, t] = (prev[:, t] - 3) % (V - 4) + 4
        assert not torch.allclose(lm(prev3, x)[:, t], a[:, t])


def graph_size(root) -> int:
    """Nodes of the autograd graph below ``root`` (a tensor's ``grad_fn``)."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
    return len(seen)


def test_training_graph_does_not_grow_with_time():
    # No time loop: the graph of the whole loss is the same few batched ops for 4 steps
    # as for 64 (a loop over steps would add nodes per step).
    lm = make()
    sizes = []
    for T in (4, 64):
        targets, prev, x = data(T=T)
        sizes.append(graph_size(lm.loss(prev, targets, inputs=x).loss.grad_fn))
    assert sizes[0] == sizes[1] < 25


class Counting(nn.Module):
    """Counts the ``step`` calls of a wrapped model."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def step(self, token, state):
        self.calls += 1
        return self.model.step(token, state)


def test_generation_feeds_back_its_own_tokens_one_step_each():
    lm = make(input_size=0).eval()
    n = 12
    counting = Counting(lm)
    (result,) = generate(counting, [BOS_ID], max_length=n, strategy="greedy")
    assert counting.calls == n  # the prompt step plus n − 1 fed-back tokens: O(n)
    # Oracle: an explicit free-running loop, feeding back the argmax.
    token, ids = torch.tensor([BOS_ID]), []
    with torch.no_grad():
        for _ in range(n):
            token = lm(token.view(1, 1))[0, -1].argmax().view(1)
            ids.append(int(token))
    assert result.ids == ids
    # Scoring the generated sequence under teacher forcing (all steps at once) gives the
    # same log-probability as the free run: both wirings of the one model agree.
    seq = torch.tensor([[BOS_ID, *ids]])
    with torch.no_grad():
        lp = torch.log_softmax(lm(seq[:, :-1]), -1).gather(2, seq[:, 1:, None]).sum()
    assert result.logprob == pytest.approx(float(lp), abs=1e-9)


def test_generation_holds_the_per_row_input_fixed():
    lm = make().eval()
    x = torch.randn(2, I, dtype=torch.float64)
    lp, state = lm.step(torch.tensor([BOS_ID, 5]), x)
    assert state is x
    expected = torch.log_softmax(lm(torch.tensor([[BOS_ID], [5]]), x[:, None])[:, 0], -1)
    torch.testing.assert_close(lp, expected)


def test_learns_a_cycle_and_generates_it():
    torch.manual_seed(0)
    lm = jordan_lm(V, 16, input_size=0)
    cycle = [4, 6, 5, 8, 7]
    seq = torch.tensor([(cycle * 4)[s : s + 10] for s in range(5)])  # (5, 10)
    prev = torch.cat([torch.full((5, 1), BOS_ID), seq[:, :-1]], 1)
    opt = torch.optim.Adam(lm.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        out = lm.loss(prev, seq)
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.4  # the first token is uniform over 5 starts: ln 5 / 10 = 0.16
    lm.eval()
    (result,) = generate(lm, [BOS_ID, 6], max_length=8, strategy="greedy")
    assert result.ids == [5, 8, 7, 4, 6, 5, 8, 7]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="nonlinearity"):
        jordan_lm(V, H, nonlinearity="softsign")
    with pytest.raises(ValueError, match="input_size"):
        jordan_lm(V, H, input_size=-1)
    lm = make()
    _, prev, x = data()
    with pytest.raises(ValueError, match="inputs must have shape"):
        lm(prev, x[:, :, :2])
    with pytest.raises(ValueError, match="inputs must have shape"):
        lm(prev)
    with pytest.raises(ValueError, match="input_size = 0"):
        make(input_size=0)(prev, x)
