"""Output layers that turn top hidden states into vocabulary logits."""

from __future__ import annotations

import torch  # noqa: F401  (the doctest namespace)
from torch import Tensor, nn

from rnnkit.layers.linear import linear

__all__ = ["TiedHead"]


class TiedHead(nn.Module):
    """Output layer sharing the embedding matrix: ``z = E (P h) + b`` (weight tying).

    ``V = E`` requires the top state width to equal the embedding width; otherwise a
    projection ``P: H → embedding_dim`` is inserted.

    Args:
        embedding: the model's ``nn.Embedding(V, E)``; its weight is shared, not copied.
        in_features: ``H``, the width of the states fed to the head.

    >>> emb = nn.Embedding(10, 4)
    >>> head = TiedHead(emb, 6)
    >>> head(torch.zeros(2, 3, 6)).shape, head.weight is emb.weight
    (torch.Size([2, 3, 10]), True)
    """

    def __init__(self, embedding: nn.Embedding, in_features: int) -> None:
        super().__init__()
        self.embedding = embedding
        E = embedding.embedding_dim
        self.projection = nn.Linear(in_features, E, bias=False) if in_features != E else None
        self.bias = nn.Parameter(embedding.weight.new_zeros(embedding.num_embeddings))

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, h: Tensor) -> Tensor:
        """``h (..., H)`` → logits ``(..., V)``."""
        if self.projection is not None:
            h = self.projection(h)
        return linear(h, self.embedding.weight, self.bias)
