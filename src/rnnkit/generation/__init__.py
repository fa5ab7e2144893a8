"""Generation: sampling, greedy and beam search over any model's one-step function.

The searches know nothing of a model's wiring: a model hands them a step function
(token ids and state in, log-probabilities and state out, :class:`StepModel`), so the
language models and the encoder–decoders call them rather than the other way round.

* ``search``: sampling (temperature, top-k, top-p), greedy and beam search, batched, with
  finished rows no longer costing a step;
* ``seq2seq_search``: the same over an encoder–decoder's output, the encoder side kept in
  place while the beam reorders the decoder's rows.
"""

from rnnkit.generation.search import (
    GenerationResult,
    StepModel,
    filter_log_probs,
    generate,
    generate_batch,
    select_state,
)
from rnnkit.generation.seq2seq_search import beam_search, decode_batch

__all__ = [
    "GenerationResult",
    "StepModel",
    "beam_search",
    "decode_batch",
    "filter_log_probs",
    "generate",
    "generate_batch",
    "select_state",
]
