"""``--pretrained-vectors FILE``: word vectors copied into a model's embedding."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rnnkit import messages
from rnnkit.app.config import TrainConfig

__all__ = [
    "load_pretrained_vectors",
]


def load_pretrained_vectors(
    cfg: TrainConfig,
    embedding: torch.nn.Embedding,
    tokens: list[str],
    *,
    literal_specials: bool = True,
) -> dict[str, Any] | None:
    """``--pretrained-vectors FILE``: copy the vector of every token of ``tokens`` (the
    vocabulary, index order) found in the file into its row of ``embedding``; the other
    rows keep their initialisation. Returns ``{"file", "found", "vocabulary"}`` (None
    without the option) and says it on stderr. ``literal_specials=False`` (a tagger, a
    classifier: a word ``<pad>``, ``<s>``, ``</s>`` of their text is an unknown word) takes
    no vector for those rows: the padding and boundary rows stand for no word of the file
    (a fastText ``.vec`` file's first word is ``</s>``)."""
    if cfg.pretrained_vectors is None:
        return None
    from rnnkit.data.vocab import NOT_TEXT
    from rnnkit.data.word_vectors import read_word_vectors

    dim = embedding.embedding_dim
    vectors = read_word_vectors(cfg.pretrained_vectors, dim, tokens)
    skip = frozenset() if literal_specials else NOT_TEXT
    rows = [
        i for i, token in enumerate(tokens) if vectors.get(token) is not None and token not in skip
    ]
    found = len(rows)
    if rows:  # gathered on the host, one copy to the embedding's device
        table = torch.from_numpy(np.stack([vectors[tokens[i]] for i in rows]))
        with torch.no_grad():
            index = torch.tensor(rows, device=embedding.weight.device)
            embedding.weight[index] = table.to(embedding.weight)
    said = (
        f"pretrained vectors: {found} of {len(tokens)} vocabulary words found in "
        f"{cfg.pretrained_vectors}"
    )
    if found:
        messages.info(said)
    else:  # another tokenization (words for a character model), or another language
        messages.warning(f"{said}: the embedding keeps its initialisation")
    return {"file": cfg.pretrained_vectors, "found": found, "vocabulary": len(tokens)}
