"""Sequence classification: one label per sequence.

embedding → recurrent stack → pooling (``last`` real state, ``[h^f_L; h^b_1]`` when
bidirectional; masked ``mean``; masked ``max``) → feed-forward head
``z = W_2 tanh(W_1 p + b_1) + b_2`` → softmax, trained end to end with cross-entropy.
Real-valued sequences (frames ``x_t ∈ R^D``) skip the embedding: the stack reads the
frames themselves (:func:`build_vector_classifier`).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.deferred import active_for, figure_of
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.models.builders import build_embedding, build_encoder
from rnnkit.models.language_model import LossOutput, check_token_ids
from rnnkit.models.pooling import Pooling
from rnnkit.models.spec import ModelSpec

__all__ = ["Classifier", "FeedForwardHead", "build_classifier", "build_vector_classifier"]


class FeedForwardHead(nn.Module):
    """``z = W_2 tanh(W_1 p + b_1) + b_2``: one hidden layer, then class logits.

    >>> FeedForwardHead(6, 4, 3)(torch.zeros(2, 6)).shape
    torch.Size([2, 3])
    """

    def __init__(
        self, in_features: int, hidden: int, num_classes: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, num_classes)
        self.drop = nn.Dropout(dropout)

    @property
    def out_features(self) -> int:
        return self.out.out_features

    def forward(self, p: Tensor) -> Tensor:
        """``p (B, F)`` → logits ``(B, K)``."""
        return self.out(self.drop(torch.tanh(self.hidden(p))))


class Classifier(nn.Module):
    """``Classifier(embedding, encoder, pooling, head)``: parts injected, see module doc.

    Args:
        embedding: ``nn.Embedding(V, E)``; None for real-valued inputs ``(B, T, D)``,
            read by the stack as they are.
        encoder: a stack with ``input_size = E`` (or ``D``).
        pooling: a :class:`~rnnkit.models.pooling.Pooling` whose ``num_directions`` is
            the encoder's.
        head: maps ``(B, D·H)`` to logits ``(B, K)``.
        dropout: dropout on the embeddings and on the pooled vector.

    >>> from rnnkit import GRU
    >>> clf = Classifier(nn.Embedding(9, 4), GRU(4, 5, bidirectional=True),
    ...                  Pooling("max", 2), FeedForwardHead(10, 6, 3))
    >>> x, mask = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> clf(x, mask.bool()).shape
    torch.Size([2, 3])
    """

    def __init__(
        self,
        embedding: nn.Embedding | None,
        encoder: StackedRecurrent,
        pooling: Pooling,
        head: nn.Module,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if embedding is not None and encoder.input_size != embedding.embedding_dim:
            raise ValueError(
                f"encoder input_size {encoder.input_size} != embedding_dim "
                f"{embedding.embedding_dim}"
            )
        if pooling.num_directions != encoder.num_directions:
            raise ValueError(
                f"pooling has num_directions={pooling.num_directions} but the encoder "
                f"{encoder.num_directions}"
            )
        self.embedding = embedding
        self.encoder = encoder
        self.pooling = pooling
        self.head = head
        self.drop = nn.Dropout(dropout)

    @property
    def num_classes(self) -> int:
        # The head is a Linear or a FeedForwardHead: both give their output width.
        return cast(int, self.head.out_features)

    def encode(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """The pooled sequence vectors ``(B, D·H)`` of ``inputs (B, T)`` token ids (or
        ``(B, T, D)`` frames without an embedding)."""
        if mask is None:
            mask = torch.ones(inputs.shape[:2], dtype=torch.bool, device=inputs.device)
        if self.embedding is not None:
            inputs = check_token_ids(inputs, getattr(self.embedding, "num_embeddings", None))
        x = inputs if self.embedding is None else self.embedding(inputs)
        out = self.encoder(self.drop(x), mask=mask)
        return self.pooling(out.outputs, mask, out.state)

    def forward(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, K)``.

        Args:
            inputs: ``(B, T)`` token ids, or ``(B, T, D)`` frames (no embedding).
            mask: ``(B, T)`` bool, True at real steps (every row needs one); None = all.
        """
        return self.head(self.drop(self.encode(inputs, mask)))

    def loss(self, inputs: Tensor, labels: Tensor, mask: Tensor | None = None) -> LossOutput:
        """Mean cross-entropy over the examples, in nats; ``tokens`` counts examples.

        Args:
            inputs, mask: as in :meth:`forward`.
            labels: ``(B,)`` class ids.
        """
        if labels.dim() != 1 or labels.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"labels must have shape (B,) = ({inputs.shape[0]},), got {tuple(labels.shape)}"
            )
        if labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise TypeError(f"labels must hold integer class ids, got dtype {labels.dtype}")
        if labels.shape[0] == 0:  # the mean over no example is NaN: refused, as the LM's
            raise ValueError(
                "an empty batch (B = 0) has no loss: the mean over examples is undefined"
            )
        logits = self(inputs, mask)
        K = logits.shape[-1]
        bad = (labels < 0) | (labels >= K)
        deferred = active_for(labels)
        if deferred is not None:  # read with the step's figures; a GPU kernel stops on it
            deferred.check(bad.any(), lambda: _label_error(labels, bad, K))
            labels = labels.clamp(0, K - 1)
        elif bool(bad.any()):  # torch's message: "Target 3 is out of bounds."
            raise _label_error(labels, bad, K)
        loss = F.cross_entropy(logits, labels)
        n = int(labels.shape[0])
        return LossOutput(loss, figure_of(loss.detach().double() * n), n)

    @torch.no_grad()
    def predict(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor:
        """Most probable class ids ``(B,)``."""
        return self(inputs, mask).argmax(-1)


def build_classifier(spec: ModelSpec, vocab_size: int, num_classes: int) -> Classifier:
    """Embedding → stack (``spec.bidirectional``) → ``spec.pooling`` → feed-forward head
    with ``spec.hidden`` units.

    >>> spec = ModelSpec(hidden=8, embedding=4, bidirectional=True, pooling="mean")
    >>> clf = build_classifier(spec, vocab_size=12, num_classes=3)
    >>> clf.pooling, clf.num_classes
    (Pooling('mean', num_directions=2), 3)
    """
    encoder = build_encoder(spec, spec.embedding)
    width = encoder.hidden_size * encoder.num_directions
    return Classifier(
        build_embedding(spec, vocab_size, spec.embedding),
        encoder,
        Pooling(spec.pooling, encoder.num_directions),
        FeedForwardHead(width, spec.hidden, num_classes, spec.dropout),
        dropout=spec.dropout,
    )


def build_vector_classifier(spec: ModelSpec, input_size: int, num_classes: int) -> Classifier:
    """Frames ``x_t ∈ R^D`` (``D = input_size``) → stack → ``spec.pooling`` → feed-forward
    head: :func:`build_classifier` without the embedding (``spec.embedding`` unused).

    >>> clf = build_vector_classifier(ModelSpec(hidden=8, pooling="mean"), 3, num_classes=2)
    >>> clf(torch.zeros(4, 5, 3)).shape
    torch.Size([4, 2])
    """
    encoder = build_encoder(spec, input_size)
    width = encoder.hidden_size * encoder.num_directions
    return Classifier(
        None,
        encoder,
        Pooling(spec.pooling, encoder.num_directions),
        FeedForwardHead(width, spec.hidden, num_classes, spec.dropout),
        dropout=spec.dropout,
    )


def _label_error(labels: Tensor, bad: Tensor, classes: int) -> ValueError:
    i = int(torch.nonzero(bad)[0, 0])
    return ValueError(
        f"labels must lie in [0, {classes}) (the classes), got {int(labels[i])} at {i}"
    )
