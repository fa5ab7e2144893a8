"""Output-to-hidden (Jordan) recurrence (Goodfellow et al., *Deep Learning*, Fig. 10.4): no ``W_h``.

    h_t = φ(W_x x_t + W_o o_{t−1} + b)        z_t = W_y h_t + b_y,   ŷ_t = softmax(z_t)

The only path from one step to the next is the output ``o_{t−1}``. Here ``o_{t−1}`` is the
one-hot vector ``e_{y_{t−1}}`` of the previous token (``<s>`` at the first step), so
``W_o o_{t−1}`` is column ``y_{t−1}`` of ``W_o ∈ R^{H×V}``: an embedding lookup of width
``H`` (``feedback.weight[y] = W_o[:, y]``). One-hot rather than the soft output because
teacher forcing feeds the true target, and generation must feed the same kind of thing
(the model's own drawn token) or it runs on inputs it never saw in training.

Training (teacher forcing): the fed-back token is the true ``y_{t−1}``, known for every
step in advance, so all ``B·T`` steps are computed at once by batched products; there is
no time loop and the gradient of the loss at step ``t`` reaches only step ``t``'s
pre-activation (its inputs ``x_t`` and ``y_{t−1}``). Generation: ``step`` feeds back the
model's own drawn token, one step per token, ``O(1)`` work per step.

With only the token fed back, the model's memory is the previous token (and ``x_t``): a
token-only Jordan LM is a neural bigram model. ``x_t`` (``input_size > 0``) carries
whatever else the caller provides at each step (a condition, a position, …).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rnnkit.cells.rnn import NONLINEARITIES, activate
from rnnkit.metrics.losses import training_loss
from rnnkit.models.language_model import LossOutput

__all__ = ["NONLINEARITIES", "JordanLM", "jordan_lm"]


class JordanLM(nn.Module):
    """Language model with the output-to-hidden recurrence of Fig. 10.4.

    Args:
        feedback: ``nn.Embedding(V, H)``; row ``y`` is ``W_o e_y`` (the one-hot fed back).
        head: maps ``(…, H)`` to logits ``(…, V)`` (``W_y``, ``b_y``), e.g. ``nn.Linear``.
        input_size: ``I``, the width of the optional per-step input ``x_t`` (0: none).
        nonlinearity: ``φ``, ``"tanh"``, ``"relu"`` or ``"sigmoid"``.
        dropout: on ``h_t`` before the head.

    >>> _ = torch.manual_seed(0)
    >>> lm = jordan_lm(vocab_size=7, hidden_size=5)
    >>> lm(torch.tensor([[2, 4, 5]])).shape
    torch.Size([1, 3, 7])
    """

    #: How the training loss averages token losses: "token" (every target token weighs
    #: the same) or "sequence" (the mean within each sequence, then over sequences).
    loss_reduction: str = "token"

    def __init__(
        self,
        feedback: nn.Embedding,
        head: nn.Module,
        input_size: int = 0,
        nonlinearity: str = "tanh",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if nonlinearity not in NONLINEARITIES:
            raise ValueError(
                f"nonlinearity must be one of {', '.join(NONLINEARITIES)}, got {nonlinearity!r}"
            )
        if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 0:
            raise ValueError(f"input_size must be an integer >= 0, got {input_size!r}")
        H = feedback.embedding_dim
        self.feedback = feedback
        self.head = head
        self.input_size = input_size
        self.hidden_size = H
        self.nonlinearity = nonlinearity
        # W_x without a bias: b below is the one bias of the pre-activation.
        self.input_weight = nn.Linear(input_size, H, bias=False) if input_size else None
        self.bias = nn.Parameter(feedback.weight.new_zeros(H))
        self.drop = nn.Dropout(dropout)

    @property
    def vocab_size(self) -> int:
        return self.feedback.num_embeddings

    def _check_inputs(self, prev: Tensor, inputs: Tensor | None, lead: tuple[int, ...]) -> None:
        if self.input_weight is None:
            if inputs is not None:
                raise ValueError("inputs given but the model has input_size = 0")
            return
        if inputs is None or tuple(inputs.shape) != (*lead, self.input_size):
            got = None if inputs is None else tuple(inputs.shape)
            raise ValueError(f"inputs must have shape {(*lead, self.input_size)}, got {got}")

    def hidden(self, prev: Tensor, inputs: Tensor | None = None) -> Tensor:
        """``h = φ(W_x x + W_o e_prev + b)`` for any leading shape, all positions at once.

        Args:
            prev: ``(B, T)`` (or ``(B,)``) the previous token of every step.
            inputs: ``(B, T, I)`` (or ``(B, I)``) the ``x_t``, or None when ``I = 0``.

        Returns:
            ``(B, T, H)`` (or ``(B, H)``).
        """
        self._check_inputs(prev, inputs, tuple(prev.shape))
        a = self.feedback(prev) + self.bias  # (B, T, H)
        if self.input_weight is not None:
            a = a + self.input_weight(inputs)
        return activate(a, self.nonlinearity)

    def forward(self, prev: Tensor, inputs: Tensor | None = None) -> Tensor:
        """Teacher-forced logits ``(B, T, V)``: ``prev[:, t]`` is the true ``y_{t−1}``."""
        return self.head(self.drop(self.hidden(prev, inputs)))

    def loss(
        self,
        prev: Tensor,
        targets: Tensor,
        mask: Tensor | None = None,
        inputs: Tensor | None = None,
    ) -> LossOutput:
        """Teacher-forced cross-entropy, masked token mean (nats), computed in parallel.

        Args:
            prev: ``(B, T)`` inputs ``<s> y_1 … y_{T−1}``.  targets: ``(B, T)``.
            mask: ``(B, T)`` bool or None.  inputs: ``(B, T, I)`` or None.
        """
        logits = self(prev, inputs)
        loss, nats, tokens = training_loss(logits, targets, mask, self.loss_reduction)
        return LossOutput(loss, nats, tokens, None)

    @torch.no_grad()
    def step(self, token: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Free running: ``token (B,)``, the model's own last output, → log-probs ``(B, V)``.

        ``state`` is the per-row input ``x (B, I)`` held fixed while generating (None when
        ``I = 0``); it is returned unchanged (batch dimension 0 for row selection). The
        fed-back token is the whole memory, so a step costs the same at any position.
        """
        h = self.hidden(token, state)  # (B, H)
        return torch.log_softmax(self.head(self.drop(h)), dim=-1), state


def jordan_lm(
    vocab_size: int, hidden_size: int, input_size: int = 0, nonlinearity: str = "tanh"
) -> JordanLM:
    """A :class:`JordanLM` with a linear output layer, sized by the arguments."""
    return JordanLM(
        nn.Embedding(vocab_size, hidden_size),
        nn.Linear(hidden_size, vocab_size),
        input_size=input_size,
        nonlinearity=nonlinearity,
    )
