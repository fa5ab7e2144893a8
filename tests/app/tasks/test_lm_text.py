"""A trained language model's text: where a prompt starts, as the model saw lines start."""

from __future__ import annotations

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


def test_on_a_device_whose_reads_wait_the_steps_read_no_token_check(monkeypatch):
    """Where a host read waits for the device (a GPU; emulated here), generating text
    reads the model's check of each step's token ids once at the end, not inside every
    step (the search's own read of the rows still going is the one a step keeps); the
    same texts as with the CPU's direct checks. A bad id is still refused."""
    import pytest
    import torch
    from torch.overrides import TorchFunctionMode

    from host_syncs import READS
    from rnnkit.app.tasks.lm_text import sample_texts
    from rnnkit.app.tasks.settings import model_spec
    from rnnkit.metrics import deferred
    from rnnkit.models.builders import build_lm
    from rnnkit.models.language_model import LanguageModel

    inside = {"step": False, "steps": 0, "reads": 0}

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if inside["step"] and getattr(func, "__name__", "") in READS:
                inside["reads"] += 1
            return func(*args, **(kwargs or {}))

    step = LanguageModel.step

    def counted(self, *args, **kwargs):
        inside["step"], inside["steps"] = True, inside["steps"] + 1
        try:
            return step(self, *args, **kwargs)
        finally:
            inside["step"] = False

    vocab = Vocabulary(["a", "b", "c"], unit="word")
    cfg = TrainConfig(train="x", unit="word", hidden=8, embedding=4)
    torch.manual_seed(0)
    model = build_lm(model_spec(cfg), len(vocab)).eval()
    with torch.no_grad():  # </s> never drawn: every text runs to max_length
        model.head.bias[EOS_ID] = -50.0
    monkeypatch.setattr(LanguageModel, "step", counted)
    with Reads():
        direct = sample_texts(cfg, vocab, model, "a", num=3, max_length=12, seed=1)
    assert inside["reads"] == inside["steps"] > 10  # on the CPU: the check reads the ids
    monkeypatch.setattr(deferred, "waits", lambda tensor: True)
    inside.update(steps=0, reads=0)
    with Reads():
        emulated = sample_texts(cfg, vocab, model, "a", num=3, max_length=12, seed=1)
    assert emulated == direct
    assert inside["steps"] > 0 and inside["reads"] == 0
    with pytest.raises(ValueError, match="token ids in"), deferred.deferring():
        model.step(torch.tensor([len(vocab) + 7]))
