"""The mask's reading on the host: answers against a column-by-column check, kept per
mask (one reading for the layers of a call), never read for a changed or another mask."""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import mask_facts
from rnnkit.bptt.fused import use_fused
from rnnkit.bptt.mask_facts import all_real, prefix_lengths


def _column_lengths(mask: torch.Tensor) -> list[int] | None:
    """The oracle: each column's length if its real steps are a prefix, by hand."""
    out = []
    for col in mask.T.tolist():
        n = sum(col)
        if col != [True] * n + [False] * (len(col) - n):
            return None
        out.append(n)
    return out


@pytest.fixture
def host_copies(monkeypatch):
    """``host_copies()`` starts counting the tensors copied to the host with
    ``.to("cpu")`` (mask_facts' one read of a mask) and returns the list they go into."""

    def start() -> list[torch.Tensor]:
        copies: list[torch.Tensor] = []
        real_to = torch.Tensor.to

        def counted_to(self, *args, **kwargs):
            if args[:1] == ("cpu",):
                copies.append(self)
            return real_to(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", counted_to)
        return copies

    return start


@pytest.fixture
def fresh_memo(monkeypatch):
    """This thread's remembered masks, emptied for the test."""
    monkeypatch.setattr(mask_facts._local, "memo", [], raising=False)
    return mask_facts._local


@pytest.mark.parametrize("seed", range(6))
def test_answers_equal_a_check_by_hand(seed, fresh_memo):
    g = torch.Generator().manual_seed(seed)
    T, B = 5, 4
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[:, None] < lengths
    if seed % 2:
        mask[int(torch.randint(0, T, (1,), generator=g)), 0] ^= True  # maybe a hole
    expected = _column_lengths(mask)
    got = prefix_lengths(mask)
    assert (got.tolist() if got is not None else None) == expected
    assert all_real(mask) == bool(mask.all())
    if got is not None:
        assert got.device.type == "cpu" and got.dtype == torch.int64


def test_a_mask_changed_in_place_is_read_again(fresh_memo):
    mask = torch.ones(3, 2, dtype=torch.bool)
    assert all_real(mask) and prefix_lengths(mask).tolist() == [3, 3]
    mask[1, 0] = False  # a hole: the earlier answers no longer hold
    assert not all_real(mask) and prefix_lengths(mask) is None
    mask[1:, 0] = False  # a prefix again
    assert prefix_lengths(mask).tolist() == [1, 3]


def test_another_mask_with_the_same_values_is_its_own(fresh_memo):
    a = torch.tensor([[True, True], [True, False]])
    b = a.clone()
    assert prefix_lengths(a).tolist() == prefix_lengths(b).tolist() == [2, 1]
    b[0, 1] = False
    assert prefix_lengths(a).tolist() == [2, 1] and prefix_lengths(b).tolist() == [2, 0]
    assert len(fresh_memo.memo) == 2


def test_inference_tensors_are_read_without_being_kept(fresh_memo):
    with torch.inference_mode():
        mask = torch.tensor([[True], [False]])
        assert prefix_lengths(mask).tolist() == [1] and not all_real(mask)
    assert fresh_memo.memo == []


@pytest.mark.parametrize("bidirectional, masks", [(False, 1), (True, 1)])
def test_the_layers_of_one_call_read_the_mask_once(host_copies, fresh_memo, bidirectional, masks):
    """A 2-layer stack on the fused path with a lengths mask: the mask is copied to the
    host once for every layer, direction and question (a reversed direction's flipped
    mask is answered from the same copy, transformed on the host; the layers' transposed
    view of it from the same view of the copy), and the result equals the explicit
    loop's."""
    torch.manual_seed(0)
    lstm = rnnkit.LSTM(3, 4, num_layers=2, bidirectional=bidirectional).double()
    x = torch.randn(5, 6, 3, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 0, 5, 6])
    with use_fused("loop"):
        expected = lstm(x, lengths=lengths).outputs
    fresh_memo.memo = []
    copies = host_copies()
    with use_fused("fused"):
        got = lstm(x, lengths=lengths).outputs
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert len(copies) == masks


@pytest.mark.parametrize("seed", range(6))
def test_a_flipped_mask_is_answered_from_its_source_s_one_host_copy(seed, fresh_memo, host_copies):
    from rnnkit.layers.masking import flip_sequences

    g = torch.Generator().manual_seed(seed)
    T, B = 6, 5
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[:, None] < lengths
    if seed % 2:
        mask[int(torch.randint(0, T, (1,), generator=g)), 1] ^= True  # a hole or a gap
    copies = host_copies()
    _, flipped = flip_sequences(torch.zeros(T, B), mask)
    got = prefix_lengths(flipped)  # the source copied once, the flip derived on the host
    expected = _column_lengths(flipped)
    assert (got is None) == (expected is None)
    if expected is not None:
        assert got.tolist() == expected
    assert all_real(flipped) == bool(flipped.all())
    assert [c.data_ptr() == mask.data_ptr() for c in copies] == [True]  # (detached)


def test_a_flipped_mask_whose_source_changed_since_is_read_itself(fresh_memo):
    from rnnkit.layers.masking import flip_sequences

    mask = torch.tensor([[True, True], [True, False], [False, False]])
    _, flipped = flip_sequences(torch.zeros(3, 2), mask)
    mask[2, 0] = True  # the source changed after the flip: its copy no longer describes it
    assert prefix_lengths(flipped).tolist() == [2, 1]  # the flip's own values
    assert prefix_lengths(mask).tolist() == [3, 1]


def test_views_of_a_mask_are_answered_from_its_one_host_copy(fresh_memo, host_copies):
    """Scheduled sampling asks of every step's column, segments of every segment: each a
    view of one mask, answered from the same view of its host copy (one wait, not T)."""
    T = 7
    base = torch.arange(T)[:, None] < torch.tensor([7, 3, 0, 5])  # (T, B) lengths
    copies = host_copies()
    for t in range(T):  # each step's column, in the (B, T) layout a task holds
        column = base.T[:, t : t + 1].T  # a view: (1, B)
        assert prefix_lengths(column).tolist() == base[t].int().tolist()
        assert all_real(column) == bool(base[t].all())
    for lo in range(0, T, 3):  # segments
        part = base[lo : lo + 3]
        expected = _column_lengths(part)
        got = prefix_lengths(part)
        assert (got is None) == (expected is None)
        if got is not None:
            assert got.tolist() == expected
    assert len(copies) == 1  # the base, once
    base[0, 0] = False  # a change to the base is a change to its views: read again
    assert prefix_lengths(base[:2]) is None
    assert len(copies) == 2


def test_host_mask_is_the_shared_copy(fresh_memo):
    mask = torch.tensor([[True, True], [True, False]])
    host = mask_facts.host_mask(mask)
    assert torch.equal(host, mask)
    assert prefix_lengths(mask).tolist() == [2, 1]
    assert mask_facts.host_mask(mask) is host


def test_a_mask_moved_with_its_host_copy_is_never_read_back(fresh_memo, host_copies, monkeypatch):
    """A task's mask, made on the host: its copy on the device (a clone stands in for it
    here) is answered from the host tensor, and so are its views and flipped forms."""
    from rnnkit.layers.masking import flip_sequences

    monkeypatch.setattr(mask_facts, "to_device", lambda t, device: t.clone())
    host = torch.arange(5)[None, :] < torch.tensor([[5], [2], [0]])  # (B, T) lengths
    copies = host_copies()
    moved = mask_facts.move_mask(host, "cuda")
    assert moved is not host and torch.equal(moved, host)
    mask_t = moved.T  # the layers' (T, B) view, held while they run
    assert prefix_lengths(mask_t).tolist() == [5, 2, 0]
    assert prefix_lengths(mask_t[:, :2]).tolist() == [5, 2]
    _, flipped = flip_sequences(torch.zeros(5, 3), mask_t)
    assert prefix_lengths(flipped).tolist() == [5, 2, 0]
    assert copies == []
