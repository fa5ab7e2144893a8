"""``--pretrained-vectors FILE``: word vectors copied into a model's embedding."""

from __future__ import annotations

from typing import Any

import torch

from rnnkit import messages
from rnnkit.app.config import TrainConfig

__all__ = [
    "load_pretrained_vectors",
]


def load_pretrained_vectors(
    cfg: TrainConfig, embedding: torch.nn.Embedding, tokens: list[str]
) -> dict[str, Any] | None:
    """``--pretrained-vectors FILE``: copy the vector of every token of ``tokens`` (the
    vocabulary, index order) found in the file into its row of ``embedding``; the other
    rows keep their initialisation. Returns ``{"file", "found", "vocabulary"}`` (None
    without the option) and says it on stderr."""
    if cfg.pretrained_vectors is None:
        return None
    from rnnkit.data.word_vectors import read_word_vectors

    dim = embedding.embedding_dim
    vectors = read_word_vectors(cfg.pretrained_vectors, dim, tokens)
    found = 0
    with torch.no_grad():
        for index, token in enumerate(tokens):
            vector = vectors.get(token)
            if vector is not None:
                embedding.weight[index] = torch.from_numpy(vector).to(embedding.weight)
                found += 1
    said = (
        f"pretrained vectors: {found} of {len(tokens)} vocabulary words found in "
        f"{cfg.pretrained_vectors}"
    )
    if found:
        messages.info(said)
    else:  # another tokenization (words for a character model), or another language
        messages.warning(f"{said}: the embedding keeps its initialisation")
    return {"file": cfg.pretrained_vectors, "found": found, "vocabulary": len(tokens)}
