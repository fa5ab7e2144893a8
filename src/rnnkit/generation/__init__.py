"""Generation: sampling, greedy and beam search over any model's one-step function.

The searches know nothing of a model's wiring: a model hands them a step function
(token ids and state in, log-probabilities and state out, :class:`StepModel`), so the
language models and the encoder–decoders call them rather than the other way round.

* ``search``: ``generate`` and ``generate_batch``, the entry points: sampling, greedy and
  beam search, batched, with finished rows no longer costing a step; the prompt's priming;
* ``options``: what a search is given and gives back (``StepModel``,
  ``GenerationResult``) and the checks of its options;
* ``state``: rows of a recurrent state selected, repeated or merged (``select_state``);
* ``sampling``: the filtered distribution (temperature, top-k, top-p) and the sampling
  loop;
* ``beam``: beam search with length normalisation and its stopping rules;
* ``seq2seq_search``: the same over an encoder–decoder's output, the encoder side kept in
  place while the beam reorders the decoder's rows.
"""

from rnnkit.generation.options import GenerationResult, StepModel
from rnnkit.generation.sampling import filter_log_probs
from rnnkit.generation.search import generate, generate_batch
from rnnkit.generation.seq2seq_search import beam_search, decode_batch
from rnnkit.generation.state import select_state

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
