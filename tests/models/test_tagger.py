"""Tagger: it learns (overfits one batch), padding and batch neighbours change nothing,
the loss is the masked token mean, and the character encoder sees each word's spelling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rnnkit import GRU, LSTM
from rnnkit.data.vocab import UNK_ID
from rnnkit.models.spec import ModelSpec
from rnnkit.models.tagger import CharEncoder, Tagger, build_tagger

V, C, K = 12, 9, 4


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def batch(seed=0, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 2, 3, 1, T - 1, 4][:B])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    words = torch.randint(4, V, (B, T), generator=g).masked_fill(~mask, 0)
    tags = torch.randint(0, K, (B, T), generator=g).masked_fill(~mask, 0)
    chars = torch.randint(1, C, (B, T, 5), generator=g)
    chars[..., 3:] = 0  # every word has 3 characters
    chars = chars.masked_fill(~mask[..., None], 0)
    return words, tags, mask, chars


def make(char_rnn=False, seed=0, cell=LSTM):
    torch.manual_seed(seed)
    char_encoder = None
    width = 6
    if char_rnn:
        char_encoder = CharEncoder(
            nn.Embedding(C, 4, padding_idx=0), cell(4, 3, bidirectional=True)
        )
        width += char_encoder.output_size
    return Tagger(
        nn.Embedding(V, 6), cell(width, 8, bidirectional=True), nn.Linear(16, K), char_encoder
    ).double()


@pytest.mark.parametrize("char_rnn", [False, True], ids=["words", "words+chars"])
def test_overfits_one_batch(char_rnn):
    words, tags, mask, chars = batch()
    model = make(char_rnn)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    first = None
    for _ in range(60):
        opt.zero_grad()
        out = model.loss(words, tags, mask, chars if char_rnn else None)
        first = first if first is not None else float(out.loss.detach())
        out.loss.backward()
        opt.step()
    final = model.loss(words, tags, mask, chars if char_rnn else None)
    assert float(final.loss.detach()) < 0.05 < first
    assert final.tokens == int(mask.sum())
    pred = model.predict(words, mask, chars if char_rnn else None)
    assert torch.equal(pred[mask], tags[mask])


def test_loss_is_masked_token_mean():
    words, tags, mask, chars = batch(1)
    model = make(True)
    out = model.loss(words, tags, mask, chars)
    logits = model(words, mask, chars)
    expected = F.cross_entropy(logits[mask], tags[mask], reduction="sum")
    assert out.nats == pytest.approx(float(expected.detach()))
    assert float(out.loss.detach()) == pytest.approx(float(expected.detach()) / int(mask.sum()))
    # loss_mask removes positions (e.g. gold tags the model does not know).
    keep = mask.clone()
    keep[0, 0] = False
    part = model.loss(words, tags, mask, chars, loss_mask=keep)
    assert part.tokens == int(mask.sum()) - 1


@pytest.mark.parametrize("char_rnn", [False, True])
def test_padding_and_neighbours_change_nothing(char_rnn):
    words, _, mask, chars = batch(2)
    model = make(char_rnn, cell=GRU)
    logits = model(words, mask, chars if char_rnn else None)
    # Garbage in the padding (real ids, and characters) of every row.
    noisy_words = torch.where(mask, words, 7)
    noisy_chars = torch.where(mask[..., None], chars, 5)
    noisy = model(noisy_words, mask, noisy_chars if char_rnn else None)
    torch.testing.assert_close(noisy[mask], logits[mask], rtol=1e-12, atol=1e-12)
    for i in range(words.shape[0]):
        n = int(mask[i].sum())
        alone = model(words[i : i + 1, :n], None, chars[i : i + 1, :n] if char_rnn else None)
        torch.testing.assert_close(alone[0], logits[i, :n], rtol=1e-12, atol=1e-12)


def test_char_encoder_reads_each_word_alone():
    torch.manual_seed(0)
    enc = CharEncoder(nn.Embedding(C, 4, padding_idx=0), GRU(4, 3, bidirectional=True)).double()
    chars = torch.tensor([[5, 6, 7, 0, 0], [3, 0, 0, 0, 0], [2, 8, 0, 0, 0]])
    both = enc(chars)
    for i, n in enumerate([3, 1, 2]):
        torch.testing.assert_close(enc(chars[i : i + 1, :n])[0], both[i])
    assert both.shape == (3, 6)


def test_unknown_words_differ_only_through_their_characters():
    model = make(True).eval()
    words = torch.tensor([[UNK_ID, UNK_ID]])
    chars = torch.tensor([[[5, 6, 0], [7, 8, 0]]])
    logits = model(words, None, chars)
    assert not torch.allclose(logits[0, 0], logits[0, 1])
    with pytest.raises(ValueError, match="pass chars"):
        model(words)


def test_errors_and_word_dropout():
    words, tags, mask, _ = batch()
    model = make()
    with pytest.raises(ValueError, match="tag sequence of the wrong length"):
        model.loss(words, tags[:, :-1], mask)
    with pytest.raises(ValueError, match="word_dropout"):
        Tagger(nn.Embedding(V, 6), LSTM(6, 8, bidirectional=True), nn.Linear(16, K), None, 0, 1.0)
    dropper = Tagger(
        nn.Embedding(V, 6), LSTM(6, 8, bidirectional=True), nn.Linear(16, K), word_dropout=0.5
    ).double()
    dropper.eval()  # word dropout is a training-time noise only
    torch.testing.assert_close(dropper(words, mask), dropper(words, mask))
    dropper.train()
    torch.manual_seed(0)
    a = dropper(words, mask)
    torch.manual_seed(1)
    assert not torch.allclose(a, dropper(words, mask))


def test_builder_sizes():
    spec = ModelSpec(cell="gru", hidden=5, embedding=4, layers=2, char_rnn=True)
    t = build_tagger(spec, vocab_size=10, num_tags=3, num_chars=7)
    assert t.encoder.bidirectional and t.encoder.num_layers == 2
    assert t.char_encoder is not None and t.char_encoder.encoder.is_lstm is False
    words = torch.tensor([[4, 5]])
    assert t(words, None, torch.tensor([[[4, 0], [5, 6]]])).shape == (1, 2, 3)
    with pytest.raises(ValueError, match="character vocabulary"):
        build_tagger(spec, 10, 3)


def test_word_ids_outside_the_vocabulary_are_named():
    # torch's embedding said "index out of range in self".
    tagger = build_tagger(ModelSpec(hidden=4, embedding=3), 9, 3)
    with pytest.raises(
        ValueError, match=r"^words must hold token ids in \[0, 9\) .*, got 9 at \(1, 2\)$"
    ):
        tagger(torch.tensor([[1, 2, 3], [4, 5, 9]]))
    assert tagger(torch.tensor([[1, 2, 8]])).shape == (1, 3, 3)


def test_char_rnn_without_num_chars_names_the_argument():
    # It said --char-rnn, the command line's option (which always passes the characters).
    with pytest.raises(ValueError, match=r"^char_rnn needs num_chars"):
        build_tagger(ModelSpec(hidden=4, embedding=4, char_rnn=True), 10, 3)
