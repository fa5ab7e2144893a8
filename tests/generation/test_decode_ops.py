"""What a decoding step of an encoder–decoder dispatches, pinned from above.

On a GPU, decoding a small model is bound by kernel launches (one per ATen operation) and
by host syncs (each read of device values, each copy of host data to the device, waits
for the device), neither of which a CPU test can time; :class:`op_counts.OpCounts`
counts both. The bounds are the counts of greedy and beam search (``K = 3``) at a small
size, with the inference step (the compiled library's, on the CPU) and with the model's
general step (the one a GPU runs), on a model whose rows all run to the length limit and
on one whose rows and sources mostly end at the first step (rows and sources then leave
the batch). An operation or a host read added to a step fails here; when a change
removes some, lower the bounds to the new counts.

Before these bounds a step read the host once per ended hypothesis, per source and per
drawn token list, and copied the forbidden ids to the device at every step.
"""

from __future__ import annotations

import collections

import pytest
import torch
from op_counts import OpCounts, kind

from rnnkit.bptt.native import use_native
from rnnkit.data.vocab import EOS_ID
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.spec import ModelSpec

MAX_LENGTH = 8

# (scenario, inference step, beam) → (steps, operations from the first step on, host
# syncs from the first step on, operations inside the model's steps)
BOUNDS = {
    ("running", True, 1): (8, 158, 10, 109),
    ("running", True, 3): (8, 289, 9, 109),
    ("running", False, 1): (8, 433, 10, 384),
    ("running", False, 3): (8, 564, 9, 384),
    ("ending", True, 1): (8, 174, 11, 114),
    ("ending", True, 3): (8, 302, 10, 114),
    ("ending", False, 1): (8, 444, 11, 384),
    ("ending", False, 3): (8, 572, 10, 384),
}


def model(ending: bool) -> Seq2Seq:
    torch.manual_seed(0)
    m = build_seq2seq(ModelSpec(hidden=16, embedding=8, attention="additive"), 12, 12).eval()
    if ending:  # sharper outputs, </s> favoured: most rows and sources end at once
        with torch.no_grad():
            m.head.weight.mul_(8.0)
            m.head.bias[EOS_ID] += 1.0
    return m


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 12, (6, 5), generator=g)
    mask = torch.arange(5)[None] < torch.tensor([5, 3, 4, 5, 1, 2])[:, None]
    return src, mask


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("fast", [True, False], ids=["inference-step", "general-step"])
@pytest.mark.parametrize("scenario", ["running", "ending"])
def test_decoding_steps_dispatch_no_more_than_pinned(scenario, fast, beam):
    m = model(scenario == "ending")
    src, mask = sources()
    with use_native(fast), OpCounts(InferenceStep, Seq2Seq) as counts:
        out = m.decode(src, mask, beam=beam, max_length=MAX_LENGTH)
    steps, ops, syncs, in_step = BOUNDS[(scenario, fast, beam)]
    lengths = [len(h[0].ids) for h in out]
    assert (max(lengths), min(lengths)) == ((8, 8) if scenario == "running" else (8, 0))
    assert counts.steps == steps
    assert counts.in_step <= in_step
    assert len(counts.log) - counts.starts[0] <= ops, counts.by_name()
    assert sum(counts.sync_names().values()) <= syncs, counts.sync_names()


def test_a_step_reads_the_host_at_most_once():
    """Greedy: the count of ended rows (the stop test and when rows leave), once a step,
    and the draws read at the end; beam: the step's decisions, once a step. The
    forbidden ids go to the device once per search."""
    m = model(ending=False)
    src, mask = sources()
    for beam in (1, 3):
        with OpCounts(InferenceStep) as counts:
            m.decode(src, mask, beam=beam, max_length=MAX_LENGTH)
        per_kind = collections.Counter(counts.sync_names())
        assert per_kind.pop("tensor") == 1  # the forbidden ids
        if beam == 1:
            assert per_kind == {"__int__": MAX_LENGTH - 1, "tolist": 2}
        else:
            assert per_kind == {"tolist": MAX_LENGTH}


class _Toy:
    """A step of two known operations and one host read."""

    def __init__(self) -> None:
        self.w = torch.randn(3, 3)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.log_softmax(torch.mm(x, self.w), dim=-1)
        float(y.sum())
        return y


def test_op_counts_counts_by_name_from_the_first_step():
    toy = _Toy()
    x = torch.randn(2, 3)
    with OpCounts(toy) as counts:
        torch.mm(x, toy.w)  # before the first step: left out
        for _ in range(3):
            toy.step(x)
    assert "step" not in vars(toy)  # the wrapper is gone
    assert counts.steps == 3
    want = {"aten.mm": 3, "aten._log_softmax": 3, "aten.sum": 3, "aten._local_scalar_dense": 3}
    assert dict(counts.by_name()) == want
    assert counts.per_step() == counts.model_per_step() == 4
    assert dict(counts.sync_names()) == {"__float__": 3}
    assert counts.by_kind() == {"product": 1.0, "math": 1.0, "choice": 0.0, "bookkeeping": 2.0}
    assert [kind(n) for n in ("aten.addmm", "aten.add_", "aten.add[int]", "aten.topk")] == [
        "product",
        "math",
        "bookkeeping",
        "choice",
    ]
