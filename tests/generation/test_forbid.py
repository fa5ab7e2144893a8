"""Special symbols are never generated: ``forbid`` masks them out of greedy, sampling
(top-k, top-p) and beam search, and every model of the library passes ``<pad>``,
``<unk>`` and ``<s>``; ``</s>`` still ends a sequence."""

from __future__ import annotations

import pytest
import torch
from step_models import TableModel
from torch import nn

from rnnkit import GRU
from rnnkit.data.pairs import make_pair_batch
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, PAD_ID, UNK_ID
from rnnkit.generation import beam_search, generate, generate_batch
from rnnkit.models.builders import ModelSpec
from rnnkit.models.conditional import class_conditional_lm
from rnnkit.models.decoder_only import build_decoder_only
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq

V = 7


def specials_first_table() -> torch.Tensor:
    """Every row puts most of its mass on <pad>, <unk> and <s>; </s> (3) and 4-6 share
    the rest, so an unmasked search would emit the specials."""
    table = torch.tensor([0.3, 0.25, 0.2, 0.05, 0.1, 0.06, 0.04]).repeat(V, 1)
    return table / table.sum(1, keepdim=True)


STRATEGIES = [
    {"strategy": "greedy"},
    {"strategy": "sample"},
    {"strategy": "sample", "top_k": 4},
    {"strategy": "sample", "top_p": 0.6},
    {"strategy": "sample", "temperature": 3.0},
    {"strategy": "beam", "beam_size": 3},
]


@pytest.mark.parametrize("options", STRATEGIES, ids=lambda o: "-".join(map(str, o.values())))
def test_forbidden_tokens_are_never_drawn(options) -> None:
    table = specials_first_table()
    model = TableModel(table)
    g = torch.Generator().manual_seed(0)
    unmasked = generate(
        TableModel(table), [4], max_length=12, eos_id=EOS_ID, num=3, generator=g, **options
    )
    assert any(set(r.ids) & set(NEVER_GENERATED) for r in unmasked)  # the table does emit them
    g.manual_seed(0)
    out = generate(
        model,
        [4],
        max_length=12,
        eos_id=EOS_ID,
        num=3,
        generator=g,
        forbid=NEVER_GENERATED,
        **options,
    )
    for r in out:
        assert not set(r.ids) & set(NEVER_GENERATED), r.ids
        # logprob stays the model's own: the sum of the table's log-probs of what was drawn
        drawn = [*r.ids, EOS_ID] if r.finished else r.ids
        prev = [4, *drawn[:-1]]
        expected = sum(float(table[p, t].log()) for p, t in zip(prev, drawn, strict=True))
        assert r.logprob == pytest.approx(expected, rel=1e-5)


def test_greedy_with_forbidden_specials_takes_the_best_allowed_token() -> None:
    out = generate(
        TableModel(specials_first_table()),
        [4],
        max_length=3,
        eos_id=EOS_ID,
        strategy="greedy",
        forbid=NEVER_GENERATED,
    )[0]
    # Allowed: </s> 0.05, 4: 0.1, 5: 0.06, 6: 0.04 → token 4 every step
    assert out.ids == [4, 4, 4] and not out.finished


def test_eos_cannot_be_forbidden_and_ids_must_exist() -> None:
    model = TableModel(specials_first_table())
    with pytest.raises(ValueError, match="eos_id"):
        generate(model, [4], max_length=3, eos_id=EOS_ID, forbid=(EOS_ID,))
    with pytest.raises(ValueError, match="outside"):
        generate(model, [4], max_length=3, eos_id=EOS_ID, forbid=(V,))


def test_seq2seq_search_masks_forbidden_tokens() -> None:
    torch.manual_seed(0)
    lm = LanguageModel(nn.Embedding(V, 4), GRU(4, 8), nn.Linear(8, V)).eval()
    with torch.no_grad():  # a bias that makes the specials the most probable outputs
        lm.head.bias.copy_(torch.tensor([6.0, 6.0, 6.0, -1.0, 0.0, 0.0, 0.0]))
    start = torch.zeros(1, 1, 2, 8)
    plain = beam_search(lm, start, 2, beam=2, max_length=5, bos_id=BOS_ID, eos_id=EOS_ID)
    assert any(set(h[0].ids) & set(NEVER_GENERATED) for h in plain)
    for beam in (1, 2):
        hyps = beam_search(
            lm,
            start,
            2,
            beam=beam,
            max_length=5,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            forbid=NEVER_GENERATED,
        )
        assert all(not set(h[0].ids) & set(NEVER_GENERATED) for h in hyps)


def _favour_specials(head: nn.Module) -> None:
    with torch.no_grad():
        head.bias.add_(torch.tensor([8.0, 8.0, 8.0] + [0.0] * (head.bias.numel() - 3)))


def test_the_models_never_generate_pad_unk_or_bos() -> None:
    torch.manual_seed(0)
    spec = ModelSpec(hidden=8, embedding=4)
    source = make_pair_batch([torch.tensor([4, 5, 6]).numpy()], None)
    g = torch.Generator().manual_seed(0)
    for model in (build_seq2seq(spec, 8, V), build_decoder_only(spec, 8, V)):
        model.eval()
        head = model.head if isinstance(model, Seq2Seq) else model.lm.head
        _favour_specials(head)
        outs = [
            *model.decode(source.source, source.source_mask, beam=1, max_length=6),
            *model.decode(source.source, source.source_mask, beam=3, max_length=6, num=3),
            *model.sample(source.source, source.source_mask, num=4, max_length=6, generator=g),
        ]
        ids = {t for row in outs for r in row for t in r.ids}
        assert ids and not ids & {PAD_ID, UNK_ID, BOS_ID}, (type(model).__name__, ids)
    conditional = class_conditional_lm(V, 2, 4, 8).eval()
    _favour_specials(conditional.head)
    rows = conditional.generate(torch.tensor([0, 1]), max_length=6)
    assert all(not set(r.ids) & set(NEVER_GENERATED) for row in rows for r in row)


def test_generate_batch_checks_forbid_once() -> None:
    with pytest.raises(ValueError, match="not a token id"):
        generate_batch(TableModel(specials_first_table()), [[4]], max_length=2, forbid=(-1,))
