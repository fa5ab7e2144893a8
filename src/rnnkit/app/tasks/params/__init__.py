"""The ``params`` task: DeepLog's parameter-value model, one recurrent regressor per log key.

The sessions are those of the ``events`` task with each event's parameter values
(``"params"``, written by ``rnnkit sessions --from log --params``): the numbers of the
log line's variable parts and, first, the seconds since the session's previous line.
The key-sequence model (``--task events``) asks whether the *order* of the events is
normal; this one asks whether each event's *values* are (Du et al., CCS 2017, §3.2): a
request that takes ten times its usual time, a size out of range.

For each key ``k`` (an event: a log template) of the normal training sessions:

1. **dims**: the positions of ``k``'s vectors that hold a number in every training vector
   of ``k`` (an address, a path, a ``-`` for a missing size are not numbers: those
   positions are left out);
2. **normalisation** with the training statistics, per dim: ``x' = (x − m_d) / s_d``
   (mean and standard deviation; a dim that never changes gets ``s_d = max(|m_d|, 1)``:
   any change of it then counts);
3. **sequences**: in each session, ``k``'s vectors in order after a start step of zeros,
   ``[0, v_1, …, v_n]``; a recurrent regressor (the ``regress`` task's model and training,
   ``--target next``) predicts ``v_i`` from ``v_1 … v_{i−1}``: the first from nothing (the
   key's typical vector), later ones from the same key's history in the session;
4. **Gaussian**: the errors ``e = mean_d (v̂_d − v_d)²`` of ``k``'s validation vectors are
   fitted with ``N(μ_k, σ_k²)`` (:func:`rnnkit.anomaly.thresholds.fit_gaussian`, ``σ_k`` at least
   :data:`MIN_ERROR_STD`); a vector is **anomalous** when its error is above the upper end
   of the ``c`` confidence interval, ``e > μ_k + z σ_k``, ``z = Φ⁻¹((1 + c) / 2)``
   (``--confidence``, default 0.99). An error below the interval is a better prediction
   than usual, never an anomaly.

A session's **score** is the largest ``(e − μ_k) / σ_k`` over its checked vectors. The
interval is per vector, and a session has many: with ~10 vectors a session and errors
(squares) skewed to the right, a per-vector ``c`` of 0.99 flags a fifth of normal
sessions. So a session is **anomalous** when its score is above the *session threshold*
``max(z, t)``: ``t`` is picked on the validation sessions' scores at ``--target-fpr``
(default 0.01; ``--threshold-method`` quantile or a generalized Pareto tail fit, as the
``events`` task), and ``z`` keeps the rule that a session with no vector outside its
interval is never anomalous. DeepLog's own rule (any vector outside its interval) is the
record's ``anomalous_vectors > 0``. Events of keys without a
model (unseen in training, or too rare: fewer than :data:`MIN_TRAIN_VECTORS` training or
:data:`MIN_VALID_VECTORS` validation vectors) are counted, not checked: an unseen key is
the key-sequence model's to flag. A value missing (``null``) where training always had a
number is filled with the training mean and counted.

Why one model per key, as DeepLog: every key has its own width, units and dynamics (a
duration in ms, a byte count, a row count), and a model per key sees only its own history,
so an odd value of one key cannot hide behind another's. Unlike DeepLog, a key's sequence
is its vectors *within one session*, not the whole log's stream: sessions are the unit
that is split, labelled and judged here, and a verdict must not depend on the sessions
interleaved with it.

Run directory: ``config.json``, ``keys.json`` (per key: its dims, normalisation, error
Gaussian and sub-run), ``keys/NNN/`` (a ``regress`` run per key), ``thresholds.json``
(confidence, ``z``, each key's error bound, the target rate and the session threshold),
``valid_scores.safetensors`` (the validation
sessions' scores and every validation vector's ``z``: the report's figures),
``summary.json``.

The modules, one job each: ``options`` (the task's options and their checks), ``keys``
(per key: its vectors, dims, normalisation, regressor errors), ``thresholds`` (the
per-vector bounds and the session threshold), ``train`` (training the run), ``scoring``
(a trained run: load, score, evaluate, predict, combine with the key-sequence model).
"""

from rnnkit.app.tasks.params.keys import (
    MIN_ERROR_STD,
    MIN_TRAIN_VECTORS,
    MIN_VALID_VECTORS,
    KeyModel,
    vector_errors,
)
from rnnkit.app.tasks.params.options import options
from rnnkit.app.tasks.params.scoring import (
    ParamsModel,
    combine,
    evaluate,
    load_params,
    predictor,
    score_sessions,
)
from rnnkit.app.tasks.params.thresholds import (
    read_scores,
    repick_session_score,
    session_threshold,
)
from rnnkit.app.tasks.params.train import train

__all__ = [
    "MIN_ERROR_STD",
    "MIN_TRAIN_VECTORS",
    "MIN_VALID_VECTORS",
    "KeyModel",
    "ParamsModel",
    "combine",
    "evaluate",
    "load_params",
    "options",
    "predictor",
    "read_scores",
    "repick_session_score",
    "score_sessions",
    "session_threshold",
    "train",
    "vector_errors",
]
