"""What a decoding step of an encoder–decoder dispatches, pinned from above.

On a GPU, decoding a small model is bound by kernel launches (one per ATen operation) and
by host syncs (each read of device values, each copy of host data to the device, waits
for the device), neither of which a CPU test can time; :class:`op_counts.OpCounts`
counts both. The bounds are the counts of greedy and beam search (``K = 3``) at a small
size, with the compiled library's inference step (the CPU's), with the inference step of
torch operations (the compiled library off: a GPU's) and with the model's general step,
on a model whose rows all run to the length limit and on one whose rows and sources
mostly end at the first step (rows and sources then leave the batch). An operation or a
host read added to a step fails here; when a change removes some, lower the bounds to
the new counts. And a greedy step of torch operations launches no more kernels than the
plain ``nn.LSTMCell`` loop of the same model.

Before these bounds a step read the host once per ended hypothesis, per source and per
drawn token list, and copied the forbidden ids to the device at every step; greedy search
read the host a second time whenever rows left the batch (the indices of the rows kept),
and selected three tensors of rows there (the tokens, the output rows, the ended flags)
where it now selects one.
"""

from __future__ import annotations

import collections
import contextlib
from unittest import mock

import pytest
import torch
from op_counts import OpCounts, kind
from torch import nn

from rnnkit.bptt.native import use_native
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED
from rnnkit.layers.interop import to_torch
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import ModelSpec

MAX_LENGTH = 8
STEPPERS = (InferenceStep, TorchInferenceStep, Seq2Seq)

# (scenario, step, beam) → (steps, operations from the first step on, host syncs from the
# first step on, operations inside the model's steps). The general step's LSTM cell makes
# its zero hidden bias once, at the first step (rnnkit.cells.fused_lstm_cell): one more.
BOUNDS = {
    ("running", "compiled", 1): (8, 155, 10, 109),
    ("running", "compiled", 3): (8, 289, 9, 109),
    ("running", "torch", 1): (8, 294, 10, 248),
    ("running", "torch", 3): (8, 435, 9, 248),
    ("running", "general", 1): (8, 431, 10, 385),
    ("running", "general", 3): (8, 565, 9, 385),
    ("ending", "compiled", 1): (8, 167, 10, 114),
    ("ending", "compiled", 3): (8, 315, 11, 119),
    ("ending", "torch", 1): (8, 302, 10, 248),
    ("ending", "torch", 3): (8, 451, 11, 248),
    ("ending", "general", 1): (8, 438, 10, 385),
    ("ending", "general", 3): (8, 581, 11, 385),
}


def stepping(step: str) -> contextlib.ExitStack:
    """The block decodes with ``step``: "compiled" (the CPU's default), "torch" (the
    compiled library off) or "general" (neither inference step)."""
    stack = contextlib.ExitStack()
    stack.enter_context(use_native(step == "compiled"))
    if step == "general":
        none = classmethod(lambda cls, m: None)
        stack.enter_context(mock.patch.object(TorchInferenceStep, "build", none))
    return stack


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
@pytest.mark.parametrize("step", ["compiled", "torch", "general"])
@pytest.mark.parametrize("scenario", ["running", "ending"])
def test_decoding_steps_dispatch_no_more_than_pinned(scenario, step, beam):
    m = model(scenario == "ending")
    src, mask = sources()
    with stepping(step), OpCounts(*STEPPERS) as counts:
        out = m.decode(src, mask, beam=beam, max_length=MAX_LENGTH)
    steps, ops, syncs, in_step = BOUNDS[(scenario, step, beam)]
    lengths = [len(h[0].ids) for h in out]
    assert (max(lengths), min(lengths)) == ((8, 8) if scenario == "running" else (8, 0))
    assert counts.steps == steps
    assert counts.in_step <= in_step, counts.by_name()
    assert len(counts.log) - counts.starts[0] <= ops, counts.by_name()
    assert sum(counts.sync_names().values()) <= syncs, counts.sync_names()


class _CellLoop(nn.Module):
    """Greedy decoding as a plain ``nn.LSTMCell`` loop with additive attention before the
    step (``benchmarks/bench_tasks.py``'s ``seq2seq-greedy`` contender), ``model``'s
    weights copied; its encoder is ``model``'s (its operations come before the first
    step, uncounted)."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model
        att = model.attention
        assert att is not None
        self.query_proj, self.v = att.query_proj, att.v
        self.cell = to_torch(model.decoder.cells()[0])
        self.embedding = model.target_embedding
        self.head = nn.Linear(model.head.in_features, model.head.out_features)
        self.head.load_state_dict(model.head.state_dict())

    def step(self, emb, hc, memory, keys, src_mask):
        scores = torch.tanh(keys + self.query_proj(hc[0]).unsqueeze(1)) @ self.v
        weights = torch.softmax(scores.masked_fill(~src_mask, float("-inf")), dim=-1)
        ctx = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
        h, c = self.cell(torch.cat([emb, ctx], dim=-1), hc)
        return torch.cat([h, ctx], dim=-1), (h, c)

    @torch.no_grad()
    def greedy(self, src, src_mask, max_length: int) -> torch.Tensor:
        state = self.model.encode(src, src_mask)
        hc = (state.hidden.h[0, 0], state.hidden.c[0, 0])
        token = torch.full((src.shape[0],), BOS_ID, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        out = []
        for _ in range(max_length):
            f, hc = self.step(self.embedding(token), hc, state.memory, state.keys, src_mask)
            token = self.head(f).argmax(-1)
            out.append(token)
            done |= token == EOS_ID
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)


def test_a_greedy_step_of_torch_operations_launches_no_more_than_the_cell_loop():
    """At the sizes of ``bench_tasks.py``'s ``seq2seq-greedy`` (V 40, E 64, H 128, rows of
    64), every row running to the length limit in both: kernels per step, the search's
    included (the plain loop's search is an ``argmax`` and its stop test)."""
    torch.manual_seed(0)
    spec = ModelSpec(hidden=128, embedding=64, attention="additive")
    m = build_seq2seq(spec, 40, 40).eval()
    with torch.no_grad():
        m.head.bias[EOS_ID] -= 100.0  # no row ends: both run every step
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 40, (64, 12), generator=g)
    mask = torch.arange(12)[None] < torch.randint(4, 13, (64, 1), generator=g)
    loop = _CellLoop(m)
    with stepping("torch"), OpCounts(*STEPPERS) as ours:
        out = m.decode(src, mask, max_length=MAX_LENGTH)
    with OpCounts(loop) as theirs:
        ids = loop.greedy(src, mask, MAX_LENGTH)
    assert ours.steps == theirs.steps == MAX_LENGTH
    # the same decoding (the plain loop draws forbidden ids never: they are unlikely here)
    assert not set(ids.view(-1).tolist()) & set(NEVER_GENERATED)
    assert [h[0].ids for h in out] == ids.tolist()
    assert ours.kernels_per_step() <= theirs.kernels_per_step() - 1, (
        ours.by_name(),
        theirs.by_name(),
    )


def test_a_greedy_step_on_a_gpu_launches_fewer_kernels_than_the_cell_loop_as_rows_end():
    """At the same sizes, rows ending at different steps (rnnkit's leave the batch, the
    plain loop's run on until every row has ended): kernels per step with each LSTM
    cell's gate math counted as the one fused kernel a GPU runs, the search's included."""
    torch.manual_seed(0)
    spec = ModelSpec(hidden=128, embedding=64, attention="additive")
    m = build_seq2seq(spec, 40, 40).eval()
    with torch.no_grad():  # sharper outputs, </s> a little favoured: rows end at 0 to 16
        m.head.weight.mul_(4.0)
        m.head.bias[EOS_ID] += 0.5
        m.head.bias[list(NEVER_GENERATED)] -= 100.0  # never drawn by the plain loop either
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 40, (64, 12), generator=g)
    mask = torch.arange(12)[None] < torch.randint(4, 13, (64, 1), generator=g)
    loop = _CellLoop(m)
    with stepping("torch"), OpCounts(*STEPPERS) as ours:
        out = m.decode(src, mask, max_length=16)
    with OpCounts(loop) as theirs:
        ids = loop.greedy(src, mask, 16)
    lengths = [len(h[0].ids) for h in out]
    assert min(lengths) == 0 and max(lengths) == 16 and len(set(lengths)) > 4
    assert ours.steps == theirs.steps == 16
    # the same decoding up to each row's </s> (the plain loop draws on after it)
    theirs_ids = [row[: row.index(EOS_ID)] if EOS_ID in row else row for row in ids.tolist()]
    assert not {i for row in theirs_ids for i in row} & set(NEVER_GENERATED)
    assert [h[0].ids for h in out] == theirs_ids
    assert ours.by_name()["aten.nonzero_static"] >= 2  # rows left the batch
    assert ours.gpu_kernels_per_step() <= theirs.gpu_kernels_per_step() - 2, (
        ours.by_name(),
        theirs.by_name(),
    )


def test_a_step_reads_the_host_at_most_once():
    """Greedy: the count of ended rows (the stop test and when rows leave), once a step,
    and the draws read at the end; beam: the step's decisions, once a step. The
    forbidden ids go to the device once per search. Rows leaving the batch read nothing
    more in greedy search: the count read is the size of the kept rows' indices."""
    for ending in (False, True):
        m = model(ending)
        src, mask = sources()
        for beam in (1, 3):
            with OpCounts(InferenceStep) as counts:
                out = m.decode(src, mask, beam=beam, max_length=MAX_LENGTH)
            per_kind = collections.Counter(counts.sync_names())
            if ending:  # rows and sources left the batch
                assert min(len(h[0].ids) for h in out) == 0
                if beam == 1:
                    assert counts.by_name()["aten.nonzero_static"] >= 1
            # the forbidden ids; beam: the kept sources' indices each time sources leave
            # (here at two steps: a source's search goes on until K hypotheses have ended)
            assert per_kind.pop("tensor") == (3 if ending and beam > 1 else 1)
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
