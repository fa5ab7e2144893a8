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
