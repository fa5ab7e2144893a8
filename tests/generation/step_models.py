"""Small step models and helpers shared by the generation tests: lookup-table models
that count their calls, a second-order Markov model for beam search, a tiny LSTM LM."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rnnkit import LSTM
from rnnkit.generation.options import GenerationResult
from rnnkit.models.language_model import LanguageModel
from rnnkit.types import LSTMState

EOS = 0


class TableModel:
    """Log-probs depend only on the last token: ``log table[token]``; counts its calls.

    The state ``(1, 1, B, 1)`` counts the tokens each row has consumed, so a row fed
    after it should have stopped, or a state routed to the wrong row, shows up.
    """

    def __init__(self, table: Tensor) -> None:
        self.log_table = table.log()
        self.vocab_size = table.shape[1]
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.fed: list[list[int]] = []

    def step(self, token: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        self.calls += 1
        self.batch_sizes.append(token.shape[0])
        self.fed.append(token.tolist())
        if state is None:
            state = torch.zeros(1, 1, token.shape[0], 1)
        assert state.shape[2] == token.shape[0]
        return self.log_table[token], state + 1


class Markov2Model:
    """Log-probs depend on the last two tokens; the state holds the previous one.

    Beam search that reorders states wrongly scores its hypotheses with the wrong
    history, so rescoring the returned ids exposes it.
    """

    def __init__(self, vocab_size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        # Row V of the first index is "no previous token" (the zero state).
        logits = 2.0 * torch.randn(vocab_size + 1, vocab_size, vocab_size, generator=g)
        self.log_table = torch.log_softmax(logits, dim=-1)
        self.vocab_size = vocab_size
        self.calls = 0

    def step(self, token: Tensor, state: LSTMState | None) -> tuple[Tensor, LSTMState]:
        self.calls += 1
        B = token.shape[0]
        prev = torch.full((B,), self.vocab_size) if state is None else state.h.view(B).long()
        new = token.view(1, 1, B, 1).float()
        return self.log_table[prev, token], LSTMState(new, new.clone())


class Counting:
    """Wraps a model and counts its ``step`` calls and the tokens each one got."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.batch_sizes: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.batch_sizes)

    def step(self, token: Tensor, state: object) -> tuple[Tensor, object]:
        self.batch_sizes.append(token.shape[0])
        return self.model.step(token, state)


def chain_table(V: int = 6, p: float = 0.7) -> Tensor:
    """Token ``i`` is followed by ``i + 1`` with probability ``p`` (``V − 1`` by eos)."""
    table = torch.full((V, V), (1 - p) / (V - 1))
    for i in range(V):
        table[i, (i + 1) % V] = p
    return table


def fixed_table(probs: list[float]) -> Tensor:
    """The same next-token distribution whatever the last token."""
    row = torch.tensor(probs)
    return row.expand(len(probs), -1).clone()


def tiny_lm(V: int = 7, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    lm = LanguageModel(nn.Embedding(V, 5), LSTM(5, 12), nn.Linear(12, V))
    with torch.no_grad():
        lm.head.weight.mul_(4.0)  # peaked distributions: greedy paths are unambiguous
    return lm.eval()


def rescore(model: object, prompt: list[int], result: GenerationResult) -> float:
    """Log-probability of ``result`` recomputed one row at a time."""
    log_probs, state = None, None
    for t in prompt:
        log_probs, state = model.step(torch.tensor([t]), state)
    total = 0.0
    drawn = result.ids + ([EOS] if result.finished else [])
    for i, t in enumerate(drawn):
        total += float(log_probs[0, t])
        if i < len(drawn) - 1:
            log_probs, state = model.step(torch.tensor([t]), state)
    return total
