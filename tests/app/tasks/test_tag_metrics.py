"""How a tagger is scored (rnnkit.app.tasks.tag_metrics): a model of fixed logits per word
and the most-frequent-tag baseline, against figures worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from rnnkit.app.tasks.tag_data import TagData, encode_tagged
from rnnkit.app.tasks.tag_metrics import (
    BASELINE_KIND,
    baseline_metrics,
    fit_baseline,
    tag_metrics,
)
from rnnkit.data.labelled import LabelSet
from rnnkit.data.tagged import TaggedSentence
from rnnkit.data.vocab import Vocabulary

# Word ids: <unk> 1, "the" 4, "dog" 5, "New␣York" 6. Tags: DET 0, NOUN 1, PROPN 2.
DATA = TagData(
    Vocabulary(["the", "dog", "New\u2423York"], unit="word"), LabelSet(["DET", "NOUN", "PROPN"])
)
# Scored: S2's "the" is tagged X, a tag the model never saw: left out, counted apart.
EVAL = [
    TaggedSentence(["the", "dog"], ["DET", "NOUN"]),
    TaggedSentence(["cat", "New York", "the"], ["NOUN", "PROPN", "X"]),
]
LOGITS = {  # word id -> logits over (DET, NOUN, PROPN)
    1: [0.5, 0.2, -1.0],  # <unk>: DET
    4: [2.0, 0.0, -1.0],  # the: DET
    5: [0.1, 1.5, 0.3],  # dog: NOUN
    6: [1.0, 0.0, 0.5],  # New York: DET (gold PROPN)
}


class FixedTagger(nn.Module):
    """Logits that depend on the word alone: ``(B, T) -> (B, T, K)``."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.zeros(7, 3)
        for word, row in LOGITS.items():
            table[word] = torch.tensor(row)
        self.register_buffer("table", table)

    def forward(self, words: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        return self.table[words]


def nats(word: int, tag: int) -> float:
    row = LOGITS[word]
    return math.log(sum(math.exp(x) for x in row)) - row[tag]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_tag_metrics_by_hand(batch_size: int) -> None:
    model = FixedTagger().train()
    enc = encode_tagged(EVAL, DATA)
    m = tag_metrics(model, enc, DATA, torch.device("cpu"), batch_size, full=True)
    assert model.training  # put back as it was
    # Scored tokens: the/DET, dog/NOUN, cat(<unk>)/NOUN, New York/PROPN.
    expected = (nats(4, 0) + nats(5, 1) + nats(1, 1) + nats(6, 2)) / 4
    assert m["tokens"] == 4
    assert m["loss_nats"] == pytest.approx(expected, rel=1e-6)
    assert m["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert m["accuracy"] == 2 / 4  # cat → DET and New York → DET are wrong
    assert (m["oov_tokens"], m["oov_accuracy"]) == (1, 0.0)
    assert (m["unknown_labels"], m["unknown_label_counts"]) == (1, {"X": 1})
    # Predicted DET: the, cat, New York (1 right); NOUN: dog (right); PROPN: none.
    assert m["per_tag_precision"] == {"DET": 1 / 3, "NOUN": 1.0, "PROPN": 0.0}
    assert m["per_tag_recall"] == {"DET": 1.0, "NOUN": 1 / 2, "PROPN": 0.0}
    assert m["per_tag_support"] == {"DET": 1, "NOUN": 2, "PROPN": 1}
    assert not any(key.startswith("span_") for key in m)  # not a BIO tag set
    short = tag_metrics(model, enc, DATA, torch.device("cpu"), batch_size, full=False)
    assert "per_tag_f1" not in short and short["accuracy"] == m["accuracy"]


def test_most_frequent_tag_baseline_by_hand() -> None:
    train = encode_tagged(
        [
            TaggedSentence(["the", "dog"], ["DET", "NOUN"]),
            TaggedSentence(["the", "dog"], ["DET", "NOUN"]),
            TaggedSentence(["dog", "rex"], ["NOUN", "PROPN"]),  # rex is <unk>
            TaggedSentence(["dog"], ["PROPN"]),
        ],
        DATA,
    )
    baseline = fit_baseline(train, DATA)
    # the → DET, dog → NOUN (3 to 1); <unk> is no word of it and New York was never seen:
    # both get the most frequent tag overall, NOUN (3 against 2 and 2).
    assert baseline.predict(torch.tensor([4, 5, 1, 6]).numpy()).tolist() == [0, 1, 1, 1]
    figures = baseline_metrics(baseline, encode_tagged(EVAL, DATA), len(DATA.tags))
    assert figures == {
        "kind": BASELINE_KIND,
        "accuracy": 3 / 4,  # New York (PROPN) is the miss; S2's "the" (X) is not scored
        "oov_accuracy": 1.0,
        "oov_tokens": 1,
    }


def _sentences(n: int) -> list[TaggedSentence]:
    """``n`` sentences of 1-5 words (some never seen: ``<unk>``), BIO-tagged, with B-Y a tag
    the model never saw."""
    rng = torch.Generator().manual_seed(n)
    words, tags = ["the", "dog", "cat", "runs", "zz"], ["B-X", "I-X", "O", "B-Y"]
    out = []
    for i in range(n):
        k = int(torch.randint(1, 6, (), generator=rng))
        w = torch.randint(len(words), (k,), generator=rng).tolist()
        t = torch.randint(len(tags), (k,), generator=rng).tolist()
        out.append(TaggedSentence([words[j] for j in w], [tags[j] for j in t], i))
    return out


def test_tag_metrics_read_the_device_once_and_score_each_sentence_as_alone(monkeypatch) -> None:
    """A tagger with a character RNN: the figures equal the model on every sentence alone,
    and on a GPU (reads counted on the CPU, as the device would see them) the device is
    read once whatever the number of batches: the summed loss and all predicted tags with
    the model's checks (before: seven reads a batch)."""
    import sys
    from pathlib import Path

    from rnnkit import deferred as deferred_module
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.app.tasks.tag_data import char_batch
    from rnnkit.bptt.fused import use_fused
    from rnnkit.models.tagger import build_tagger

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    cfg = TrainConfig(train="x", hidden=8, embedding=4, char_rnn=True)
    seen = [TaggedSentence(["the", "dog", "cat", "runs"], ["B-X", "I-X", "O", "B-X"], 0)]
    data = TagData.from_sentences(seen, cfg)
    assert data.chars is not None
    K = len(data.tags)
    torch.manual_seed(0)
    model = build_tagger(model_spec(cfg), len(data.vocab), K, len(data.chars)).eval()
    cpu = torch.device("cpu")
    enc = encode_tagged(_sentences(9), data)
    total, right, scored, oov_right, n_oov = 0.0, 0, 0, 0, 0
    with torch.no_grad():
        for i, (w, g, oov) in enumerate(zip(enc.words, enc.tags, enc.oov, strict=True)):
            words = torch.from_numpy(w)[None]
            chars = char_batch(enc, torch.tensor([i]), len(w))
            logp = torch.log_softmax(model(words, words != 0, chars)[0].double(), -1)
            for t, (gold, unk) in enumerate(zip(g.tolist(), oov.tolist(), strict=True)):
                if gold < K:
                    hit = int(logp[t].argmax()) == gold
                    total, right, scored = total - float(logp[t, gold]), right + hit, scored + 1
                    oov_right, n_oov = oov_right + (hit and unk), n_oov + unk
    eager = tag_metrics(model, enc, data, cpu, 4)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for n in (9, 18):  # 3 and 5 batches
        with use_fused("fused"), HostReads(model) as counted:
            got = tag_metrics(model, encode_tagged(_sentences(n), data), data, cpu, 4)
        reads.append(dict(counted.sites))
        if n == 9:
            for m in (eager, got):
                assert m["tokens"] == scored and m["unknown_labels"] > 0
                assert m["loss_nats"] == pytest.approx(total / scored, rel=1e-5)
                assert m["accuracy"] == right / scored
                assert (m["oov_tokens"], m["oov_accuracy"]) == (n_oov, oov_right / n_oov)
            assert got["span_f1"] == eager["span_f1"]
            assert got["per_tag_f1"] == eager["per_tag_f1"]
    for sites in reads:
        assert sum(sites.values()) == 1 and all(s.startswith("deferred.py:") for s in sites), sites


# A BIO tag set; the file's MISC was never a training tag. Words: a 4, x 5, y 6, p 7, each
# tagged by the fixed model alone: a → O, x → B-LOC, y → I-LOC, p → B-PER (I-PER never).
BIO = TagData(
    Vocabulary(["a", "x", "y", "p"], unit="word"),
    LabelSet(["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]),
)
BIO_PREDICTS = {4: "O", 5: "B-LOC", 6: "I-LOC", 7: "B-PER"}
BIO_EVAL = [
    # MISC span predicted as LOC: with it gone, no gold and no predicted span there
    TaggedSentence(["p", "x", "y", "a"], ["B-PER", "B-MISC", "I-MISC", "O"]),
    TaggedSentence(["x", "y", "a", "x"], ["B-LOC", "I-LOC", "O", "B-LOC"]),  # all right
    # the MISC token parts two LOC spans: they stay two (a deletion would join them)
    TaggedSentence(["x", "a", "y"], ["B-LOC", "B-MISC", "I-LOC"]),
    # a predicted LOC span over the MISC token is cut there: LOC(0,1) right, LOC(2,3) not
    TaggedSentence(["x", "y", "y"], ["B-LOC", "I-MISC", "O"]),
]


class WordTagger(nn.Module):
    """Logits that pick ``BIO_PREDICTS[word]``: ``(B, T) -> (B, T, K)``."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.zeros(8, len(BIO.tags))
        for word, tag in BIO_PREDICTS.items():
            table[word, BIO.tags.labels.index(tag)] = 5.0
        self.register_buffer("table", table)

    def forward(self, words: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        return self.table[words]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_span_figures_leave_out_tokens_of_unseen_tags(batch_size: int) -> None:
    """Span precision, recall and F1 as if the MISC tokens were not in the file, like the
    accuracy: seqeval's (conlleval's) figures on the sentences with those tokens made
    ``O`` on both sides, worked out by hand. Gold spans: PER(0,1); LOC(0,2), LOC(3,4);
    LOC(0,1), LOC(2,3); LOC(0,1) — 6. Predicted: the same 6 and LOC(2,3) of the last
    sentence — 7. They counted the 3 MISC spans as gold (before: P 5/7, R 5/9)."""
    enc = encode_tagged(BIO_EVAL, BIO)
    m = tag_metrics(WordTagger(), enc, BIO, torch.device("cpu"), batch_size, full=True)
    assert (m["unknown_labels"], m["unknown_label_counts"]) == (4, {"B-MISC": 2, "I-MISC": 2})
    assert m["tokens"] == 10 and m["accuracy"] == 9 / 10  # the last y (gold O) is wrong
    assert m["span_precision"] == pytest.approx(6 / 7)
    assert m["span_recall"] == 1.0
    assert m["span_f1"] == pytest.approx(2 * 6 / (6 + 7))


def test_a_tag_with_no_token_and_no_prediction_has_no_figures() -> None:
    """I-PER, neither gold nor predicted: precision, recall and F1 None (they printed 0,
    as for a tag got all wrong), support 0; macro-F1 leaves it out, as scikit-learn's
    ``f1_score(gold, pred, average="macro")`` over the tags present."""
    enc = encode_tagged(BIO_EVAL, BIO)
    m = tag_metrics(WordTagger(), enc, BIO, torch.device("cpu"), 4, full=True)
    for key in ("precision", "recall", "f1"):
        assert m[f"per_tag_{key}"]["I-PER"] is None
    assert m["per_tag_support"] == {"B-LOC": 4, "B-PER": 1, "I-LOC": 2, "I-PER": 0, "O": 3}
    # O: 2 of 3 found, none wrongly (P 1, R 2/3); I-LOC: 3 predicted, 2 right (P 2/3,
    # R 1); B-LOC and B-PER all right
    assert m["per_tag_f1"]["O"] == m["per_tag_f1"]["I-LOC"] == pytest.approx(4 / 5)
    assert m["per_tag_precision"]["I-LOC"] == pytest.approx(2 / 3)
    assert m["macro_f1"] == pytest.approx((1 + 1 + 4 / 5 + 4 / 5) / 4)
