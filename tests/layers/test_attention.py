"""Attention: weights sum to 1 over real positions and are exactly 0 on padding; dot and
bilinear agree when ``W_s`` is the identity; padding values never leak in; widths."""

from __future__ import annotations

import pytest
import torch

from rnnkit.errors import ConfigError
from rnnkit.layers.attention import Attention, masked_softmax

MASK = torch.tensor(
    [
        [True, True, True, True, True],
        [True, True, False, False, False],
        [True, False, False, False, False],
    ]
)


@pytest.mark.parametrize("kind", ["dot", "bilinear", "additive"])
def test_weights_sum_to_one_and_padding_is_exactly_zero(kind):
    torch.manual_seed(0)
    att = Attention(kind, 6, 6).double()
    memory = torch.randn(3, 5, 6, dtype=torch.float64)
    memory[~MASK] = 1e6  # huge values in the padding must not matter
    out = att(torch.randn(3, 6, dtype=torch.float64), att.prepare(memory), memory, MASK)
    assert out.weights.shape == (3, 5)
    assert torch.all(out.weights[~MASK] == 0.0)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, dtype=torch.float64))
    # The context only mixes real positions.
    expected = torch.stack([(out.weights[i, :, None] * memory[i]).sum(0) for i in range(2)])
    torch.testing.assert_close(out.context[:2], expected)
    assert out.context[2].abs().max() < 1e5


@pytest.mark.parametrize("kind", ["dot", "bilinear", "additive"])
def test_padding_content_changes_nothing(kind):
    torch.manual_seed(1)
    att = Attention(kind, 4, 4)
    memory = torch.randn(3, 5, 4)
    query = torch.randn(3, 4)
    a = att(query, att.prepare(memory), memory, MASK)
    noisy = memory.clone()
    noisy[~MASK] = torch.randn(int((~MASK).sum()), 4) * 100
    b = att(query, att.prepare(noisy), noisy, MASK)
    assert torch.equal(a.weights, b.weights)
    torch.testing.assert_close(a.context, b.context)


def test_all_padded_row_gives_zero_weights_without_nan_even_in_gradients():
    att = Attention("additive", 3, 3)
    memory = torch.randn(2, 4, 3, requires_grad=True)
    query = torch.randn(2, 3, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    out = att(query, att.prepare(memory), memory, mask)
    assert torch.equal(out.weights[1], torch.zeros(4))
    assert torch.equal(out.context[1], torch.zeros(3))
    (out.context.sum() + out.weights.sum()).backward()
    for t in (memory.grad, query.grad, att.v.grad):
        assert torch.isfinite(t).all()
    assert torch.equal(memory.grad[0, 2:], torch.zeros(2, 3))  # padding gets no gradient


def test_dot_and_bilinear_agree_when_w_is_identity():
    torch.manual_seed(2)
    dot = Attention("dot", 5, 5)
    bil = Attention("bilinear", 5, 5)
    with torch.no_grad():
        bil.weight.copy_(torch.eye(5))
    memory, query = torch.randn(3, 5, 5), torch.randn(3, 5)
    a = dot(query, dot.prepare(memory), memory, MASK)
    b = bil(query, bil.prepare(memory), memory, MASK)
    torch.testing.assert_close(a.weights, b.weights)
    torch.testing.assert_close(a.context, b.context)


def test_bilinear_score_is_hd_w_he_with_different_widths():
    torch.manual_seed(3)
    att = Attention("bilinear", 3, 7)
    memory, query = torch.randn(2, 4, 7), torch.randn(2, 3)
    scores = att.scores(query, att.prepare(memory))
    expected = torch.einsum("bd,de,bse->bs", query, att.weight, memory)
    torch.testing.assert_close(scores, expected)


def test_dot_with_mismatched_widths_names_both():
    with pytest.raises(ConfigError, match=r"32.*64"):
        Attention("dot", 32, 64)
    with pytest.raises(ConfigError, match=r"^attention kind must be one of"):
        Attention("cosine", 3, 3)


def test_masked_softmax_matches_softmax_over_the_real_prefix():
    scores = torch.randn(3, 5)
    w = masked_softmax(scores, MASK)
    torch.testing.assert_close(w[1, :2], torch.softmax(scores[1, :2], -1))
    assert torch.equal(w[2], torch.tensor([1.0, 0, 0, 0, 0]))


def test_a_kind_it_does_not_know_names_the_argument():
    # It said --attention and offered "none", the command line's spelling and choice.
    with pytest.raises(
        ConfigError, match=r"^attention kind must be one of dot, bilinear, additive"
    ):
        Attention("none", 4, 4)
