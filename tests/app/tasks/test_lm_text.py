"""A trained language model's text: where a prompt starts, as the model saw lines start."""

from __future__ import annotations

import pytest

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm_text import prompt_ids
from rnnkit.data.vocab import BOS_ID, EOS_ID, UNK_ID, Vocabulary


def test_empty_prompt_starts_after_eos_where_lines_end_with_it():
    vocab = Vocabulary(["a", "b"], unit="word")
    for boundary, first in (("none", BOS_ID), ("eos", EOS_ID), ("line", EOS_ID)):
        cfg = TrainConfig(train="x", unit="word", doc_boundary=boundary)
        assert prompt_ids(cfg, vocab, None) == ([first], 0)
        assert prompt_ids(cfg, vocab, "b zz") == ([vocab.stoi["b"], UNK_ID], 1)


def test_samples_never_hold_pad_unk_or_bos():
    import torch

    from rnnkit.app.tasks.lm_text import sample_texts
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.builders import build_lm

    vocab = Vocabulary(["a", "b"], unit="word")
    for bptt in ("full", "segment:4"):
        cfg = TrainConfig(train="x", unit="word", hidden=8, embedding=4, bptt=bptt)
        torch.manual_seed(0)
        model = build_lm(model_spec(cfg), len(vocab)).eval()
        with torch.no_grad():  # <pad>, <unk> and <s> the most probable, </s> the least
            model.head.bias.copy_(torch.tensor([9.0, 9.0, 9.0, -9.0, 0.0, 0.0]))
        for strategy in ("greedy", "sample", "beam"):
            texts = sample_texts(
                cfg, vocab, model, "a", num=2, max_length=5, strategy=strategy, beam_size=2
            )
            # decode() drops specials: a drawn special would leave fewer than 5 words
            for text in texts:
                assert len(text.split()) == 5, (bptt, strategy, texts)
                assert set(text.split()) <= {"a", "b"}, (bptt, strategy, texts)


@pytest.mark.parametrize(
    ("bptt", "boundary", "ends"),
    [("segment:4", "none", False), ("segment:4", "eos", True), ("full", "none", True)],
)
def test_eos_ends_a_sample_only_where_training_held_it(bptt, boundary, ends):
    """A character model of a plain stream (no --doc-boundary eos|line: lines end in
    "\n") never met </s>, yet 28 of 200 samples at temperature 4 ended early on it."""
    import torch

    from rnnkit.app.tasks.lm_text import sample_texts
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.builders import build_lm

    vocab = Vocabulary(["a", "b"], unit="word")
    cfg = TrainConfig(train="x", unit="word", hidden=8, embedding=4, bptt=bptt,
                      doc_boundary=boundary)  # fmt: skip
    torch.manual_seed(0)
    model = build_lm(model_spec(cfg), len(vocab)).eval()
    with torch.no_grad():  # </s> the most probable by far
        model.head.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 9.0, 0.0, 0.0]))
    for strategy in ("greedy", "sample", "beam"):
        texts = sample_texts(
            cfg, vocab, model, "a", num=2, max_length=5, strategy=strategy, beam_size=2
        )
        lengths = {len(text.split()) for text in texts}
        assert max(lengths) < 5 if ends else lengths == {5}, (strategy, texts)


def test_line_scores_are_the_models_and_read_the_device_once_whatever_the_length(monkeypatch):
    """``predict``'s per-token log-probabilities equal each line's own forward pass, and
    on a GPU (reads counted on the CPU, as the device would see them) scoring lines of 4
    or 40 tokens reads the device the same few times: the ids go over once, the scores
    come back once, the model's id checks are read once."""
    import sys
    from pathlib import Path

    import torch

    from rnnkit import deferred as deferred_module
    from rnnkit.app.tasks.lm_text import line_logprobs
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.builders import build_lm

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
    from host_reads import HostReads

    vocab = Vocabulary(list("abc "), unit="char")
    cfg = TrainConfig(train="x", hidden=8, embedding=4, bptt="full")
    torch.manual_seed(0)
    model = build_lm(model_spec(cfg), len(vocab)).eval()
    lines = ["abc", "ca b", ""]
    got = line_logprobs(cfg, vocab, model, lines)
    for line, record in zip(lines, got, strict=True):
        ids = [BOS_ID, *vocab.encode(line)]
        targets = torch.tensor([*ids[1:], EOS_ID])
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        want = torch.log_softmax(logits.double(), -1).gather(1, targets.view(-1, 1)).view(-1)
        got_lp = torch.tensor(record["logprobs"], dtype=torch.float64)
        torch.testing.assert_close(got_lp, want, rtol=0, atol=1e-6)
    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    reads = []
    for n in (4, 40):
        with HostReads(model) as counted:
            line_logprobs(cfg, vocab, model, ["ab c" * (n // 4), "c"])
        reads.append(counted.count)
    assert reads[0] == reads[1] <= 2, reads  # before: 5 and 41 (one a token)


@pytest.mark.parametrize("limit", ["SCORED_LOGITS", "SCORED_STEPS"])
def test_long_lines_are_scored_a_stretch_at_a_time_with_the_state_carried(monkeypatch, limit):
    """A plain model scores lines through its forward, a stretch of steps a call (the
    stretch shortened here to 3 steps): the state carried between stretches, and rows that
    end early, give each line's own forward pass, token by token."""
    import torch

    from rnnkit.app.tasks import lm_text
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.builders import build_lm

    vocab = Vocabulary(list("abc "), unit="char")
    for cell in ("lstm", "gru"):
        cfg = TrainConfig(train="x", hidden=8, embedding=4, bptt="full", cell=cell, layers=2)
        torch.manual_seed(0)
        model = build_lm(model_spec(cfg), len(vocab)).eval()
        lines = ["abc ab cab ba", "c", "", "bbbbbbbb"]
        calls = []
        forward = type(model).forward

        def counted(self, inputs, *args, calls=calls, forward=forward, **kwargs):
            calls.append(inputs.shape)
            return forward(self, inputs, *args, **kwargs)

        monkeypatch.setattr(type(model), "forward", counted)
        # three steps a call, by the logits held or by the steps (a long line's memory)
        three = len(lines) * len(vocab) * 3 if limit == "SCORED_LOGITS" else 3
        monkeypatch.setattr(lm_text, limit, three)
        got = lm_text.line_logprobs(cfg, vocab, model, lines)
        monkeypatch.undo()
        assert calls == [(4, 3)] * 4 + [(4, 2)]  # 14 steps: the longest line and its end
        for line, record in zip(lines, got, strict=True):
            ids = [BOS_ID, *vocab.encode(line)]
            targets = torch.tensor([*ids[1:], EOS_ID])
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0]
            want = torch.log_softmax(logits.double(), -1).gather(1, targets.view(-1, 1))
            got_lp = torch.tensor(record["logprobs"], dtype=torch.float64)
            torch.testing.assert_close(got_lp, want.view(-1), rtol=0, atol=1e-6)
            assert record["nats"] == -sum(record["logprobs"])


def test_a_certain_token_has_surprise_zero_not_minus_zero():
    import math

    import torch

    from rnnkit.app.tasks.lm_text import line_logprobs
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.models.builders import build_lm

    vocab = Vocabulary(list("ab"), unit="char")
    cfg = TrainConfig(train="x", hidden=8, embedding=4, bptt="full")
    model = build_lm(model_spec(cfg), len(vocab)).eval()
    with torch.no_grad():  # "a" certain after every token: log p = 0 exactly
        model.head.weight.zero_()
        model.head.bias.fill_(-1e4)
        model.head.bias[vocab.stoi["a"]] = 1e4
    (record,) = line_logprobs(cfg, vocab, model, ["aa"])
    assert record["logprobs"][:2] == [0.0, 0.0]
    assert [math.copysign(1.0, s) for s in record["surprise"][:2]] == [1.0, 1.0]
