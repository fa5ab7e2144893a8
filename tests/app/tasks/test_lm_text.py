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
