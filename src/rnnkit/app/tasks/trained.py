"""A trained run directory as one Python object: ``rnnkit.load(run_dir)``.

Any task's run (``lm``, ``tag``, ``classify``, ``seq2seq``, ``events``, ``regress``,
``params``) loads the same way (``config.json`` says which; nothing is unpickled) into a
:class:`TrainedRun` holding the model (in ``eval()`` mode), its vocabularies and labels
and the training configuration, with the operation each task is for:

* ``predict(inputs)`` — a label per text or real-valued sequence (``classify``), a tag
  per token (``tag``), the output text per source (``seq2seq``), an anomaly verdict per
  session (``events``, ``params``), the predicted values per sequence (``regress``), each
  token's log-probability per text (``lm``): what ``rnnkit predict`` answers;
* ``generate(prompt)`` — text continuations (``lm``).

``rnnkit.load`` is :func:`load`; examples are in ``docs/python-api.md``.
"""

from __future__ import annotations

import contextlib
import json
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.registry import task_of_run
from rnnkit.app.tasks.run_config import check_batch_size, load_config
from rnnkit.data.batching import SequenceBatcher
from rnnkit.data.events import Session
from rnnkit.data.labelled import LabelSet
from rnnkit.data.vocab import Vocabulary
from rnnkit.errors import ConfigError, DataError
from rnnkit.generation.options import MAX_GENERATE_OUTPUTS, MAX_GENERATE_TOKENS

if TYPE_CHECKING:  # the kinds of model (and vocabulary) each task's loader builds
    from rnnkit.models.classifier import Classifier
    from rnnkit.models.conditional import ConditionalLM
    from rnnkit.models.decoder_only import DecoderOnlyTranslator
    from rnnkit.models.jordan import JordanLM
    from rnnkit.models.language_model import LanguageModel
    from rnnkit.models.regressor import Regressor
    from rnnkit.models.seq2seq import Seq2Seq
    from rnnkit.models.tagger import Tagger

__all__ = ["TrainedRun", "load"]

TASK_USE = {
    "lm": "generate(prompt)",
    "tag": "predict(sentences)",
    "classify": "predict(texts)",
    "seq2seq": "predict(sources)",
    "events": "predict(sessions)",
    "regress": "predict(sequences)",
    "params": "predict(sessions)",
}

# The keyword options of predict() beyond batch_size, per task.
PREDICT_OPTIONS = {
    "lm": ("condition",),
    "seq2seq": ("beam", "max_length"),
    "events": ("top_k", "score", "ngram"),
    "params": ("top_k", "confidence", "session_score"),
}


@dataclass
class TrainedRun:
    """A loaded run: ``model`` (``eval()`` mode), ``vocab``, ``labels``, ``config``.

    Attributes:
        run_dir: where it was loaded from.
        task: ``"lm"``, ``"tag"``, ``"classify"``, ``"seq2seq"``, ``"events"``,
            ``"regress"`` or ``"params"``.
        config: the run's training configuration (``config.json``).
        model: the ``torch.nn.Module`` (weights of ``model.safetensors``; for ``params``
            a ``ModuleList`` of the keys' regressors, in the order of ``keys.json``).
        vocab: the input vocabulary (the target one for ``seq2seq``; event names for
            ``events``; words for ``tag``); None for real-valued sequences
            (``regress``, ``params``, ``classify --inputs vectors``).
        labels: the classes (``classify``), the tag set (``tag``), the conditions of a
            class-conditional ``lm``; otherwise None.
        source_vocab: the source vocabulary (``seq2seq``).
        extras: task-specific parts: ``chars`` (``tag --char-rnn``), ``thresholds`` and
            ``ngram`` (``events``), and ``events``, the run as the scorer reads it;
            ``input_size`` (the values a step of real-valued sequences holds);
            ``params``, the run as the scorer reads it.
    """

    run_dir: Path
    task: str
    config: TrainConfig
    model: nn.Module
    vocab: Vocabulary | None
    labels: LabelSet | None = None
    source_vocab: Vocabulary | None = None
    extras: dict[str, Any] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _not_for(self, method: str) -> ConfigError:
        return ConfigError(
            f"{method}() does not apply to a run of the {self.task} task: use {TASK_USE[self.task]}"
        )

    # ---- predict -------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, inputs: Sequence[Any], *, batch_size: int = 64, **options: Any) -> list:
        """The model's answer for each input, in order.

        Args:
            inputs: ``classify``: texts (a run of ``--inputs vectors``: sequences, each
                ``(T, D)`` numbers: an array, a tensor or nested lists; ``(T,)`` for
                ``D = 1``); ``tag``: sentences, each a list of tokens (or a string, split
                on whitespace); ``seq2seq``: source texts; ``events``: sessions, each a
                list of event names (or a :class:`Session`); ``lm``: texts; ``regress``:
                sequences, as a vector classifier's; ``params``: sessions, each a
                :class:`Session` with its ``params`` (or a dict, read as a line of a
                sessions file: ``{"session", "events", "params"}``).
            batch_size: inputs per forward pass.
            options: ``seq2seq``: ``beam`` (default the run's) and ``max_length``;
                ``events``: those of :func:`rnnkit.app.tasks.events.score_sessions`
                (``top_k``, ``score``, ``ngram``); ``lm``: ``condition``, the class of a
                class-conditional run (one for every text, or a list of one per text);
                ``params``: ``top_k``, ``confidence`` and ``session_score``
                (:func:`rnnkit.app.tasks.params.scoring.score_sessions`).

        Returns:
            ``classify``: a label per input; ``tag``: a list of tags per sentence;
            ``seq2seq``: an output text per source; ``events`` and ``params``: a verdict
            dict per session (``score``, ``verdict``, ``threshold``, ``top``, ...);
            ``lm``: a dict per text (``tokens``, ``logprobs`` in nats, ``surprise`` in
            bits, ``nats`` the total, ``unknown``); ``regress``: a dict per sequence
            (``prediction``; with ``--loss gaussian`` also ``variance``). The answers of
            ``rnnkit predict``, but a classifier's, which is the label alone.
        """
        if isinstance(inputs, str):
            raise ConfigError("predict() takes a list of inputs, not one string")
        check_batch_size(batch_size, none=None)
        unknown = sorted(set(options) - set(PREDICT_OPTIONS.get(self.task, ())))
        if unknown:  # named here, not as a TypeError of an inner function
            takes = ", ".join(PREDICT_OPTIONS.get(self.task, ())) or "no options"
            raise ConfigError(
                f"predict() of a {self.task} run takes no {unknown} (it takes {takes})"
            )
        try:
            inputs = list(inputs)
        except TypeError:  # None, a number: "'NoneType' object is not iterable" said no more
            raise ConfigError(
                f"predict() takes a list of inputs, got {type(inputs).__name__}"
            ) from None
        if not inputs:  # nothing to batch: no answers, as for every task
            return []
        with _evaluating(self.model):
            return getattr(self, f"_predict_{self.task}")(inputs, batch_size, **options)

    def _predict_classify(self, texts: list[Any], batch_size: int) -> list[str]:
        assert self.labels is not None
        model = cast("Classifier", self.model)  # load() gives each task its own model kind
        if self.vocab is None:  # --inputs vectors
            from rnnkit.app.tasks.classify_vectors import label_sequences

            seqs = self._sequences(texts)
            answers = label_sequences(self.config, self.labels, model, seqs, batch_size)
            return [a["label"] for a in answers]
        _check_texts(texts, "input", "label<TAB>text")
        ids = []
        for i, text in enumerate(texts):
            # as encode_examples reads a text: a word "<pad>" is unknown, never padding
            x = self.vocab.encode_array(text, dtype=np.int64, literal_specials=False)
            x = x[: self.config.max_len]
            if len(x) == 0:
                raise DataError(f"input {i} has no tokens")
            ids.append(x)
        out: list[str] = [""] * len(ids)
        for batch in SequenceBatcher(ids, batch_size=batch_size, shuffle=False):
            best = model.predict(batch.inputs.to(self.device), batch.mask.to(self.device))
            for row, i in zip(best.tolist(), batch.indices.tolist(), strict=True):  # one read
                out[i] = self.labels.labels[row]
        return out

    def _predict_tag(self, sentences: list[Any], batch_size: int) -> list[list[str]]:
        from rnnkit.app.tasks.tag import TagData, predict_tags

        assert self.labels is not None
        model = cast("Tagger", self.model)  # load() gives each task its own model kind
        tokenized = [_tokens(s, i) for i, s in enumerate(sentences)]
        assert self.vocab is not None  # a tagger's words
        data = TagData(self.vocab, self.labels, (self.extras or {}).get("chars"))
        # rnnkit predict's own tagging: a sentence without tokens gets no tags
        return predict_tags(model, data, tokenized, batch_size)

    def _predict_seq2seq(
        self,
        sources: list[str],
        batch_size: int,
        beam: int | None = None,
        max_length: int | None = None,
    ) -> list[str]:
        from rnnkit.app.tasks.seq2seq_decode import decode_ids, render_output
        from rnnkit.app.tasks.seq2seq_generate import search_options

        assert self.source_vocab is not None and self.vocab is not None
        _check_texts(sources, "source", "source<TAB>target")
        model = cast("Seq2Seq | DecoderOnlyTranslator", self.model)  # (as load() builds it)
        # as transduce and the predictor check them (a beam of 10**6 decoded for minutes)
        beam, limit = search_options(beam, max_length, self.config.beam, self.config.max_len)
        ids = [self.source_vocab.encode_array(s, dtype=np.int64) for s in sources]
        for i, x in enumerate(ids):
            if len(x) == 0:
                raise DataError(f"source {i} has no tokens")
        hyps = decode_ids(model, ids, self.device, batch_size, beam, limit + 1)
        # limit + 1 steps leave room for </s>: an output that did not end is cut at limit
        return [render_output(self.vocab, h[:limit]) for h in hyps]

    def _predict_events(
        self, sessions: list[Any], batch_size: int, **options: Any
    ) -> list[dict[str, Any]]:
        from rnnkit.app.tasks.events import EventsModel, score_sessions

        # the run as load_events read it (thresholds, baseline, calibration), this model
        loaded = cast("EventsModel", (self.extras or {})["events"])
        run = replace(loaded, model=cast("LanguageModel", self.model))
        given = [
            s if isinstance(s, Session) else Session(str(i), _events(s, i))
            for i, s in enumerate(sessions)
        ]
        for i, s in enumerate(given):
            _check_events(s.events, i)
        return list(score_sessions(run, given, batch_size=batch_size, **options))

    def _predict_lm(
        self, texts: list[Any], batch_size: int, condition: str | Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        from rnnkit.app.tasks.lm_text import line_logprobs

        assert self.vocab is not None
        _check_texts(texts, "input")
        conditions = self._conditions(condition, len(texts))
        model = cast("LanguageModel | JordanLM | ConditionalLM", self.model)  # as load() built
        out = line_logprobs(self.config, self.vocab, model, texts, conditions, batch_size)
        if conditions is not None and self.labels is not None:
            for record, index in zip(out, conditions, strict=True):
                record["label"] = self.labels.labels[index]
        return out

    def _conditions(self, condition: str | Sequence[str] | None, n: int) -> list[int] | None:
        """The class index of each of ``n`` texts of a class-conditional run (None for
        another run): ``condition`` one class for all, or a list of one per text."""
        if self.labels is None:
            if condition is not None:
                raise ConfigError("condition= applies to a class-conditional run only")
            return None
        known = ", ".join(self.labels.labels)
        names = [condition] * n if condition is None or isinstance(condition, str) else condition
        if not isinstance(names, Sequence) or len(names) != n:
            raise ConfigError(f"condition= must be one class or a list of {n} (one per text)")
        out = []
        for name in names:
            index = self.labels.get(name) if isinstance(name, str) else None
            if index is None:
                raise ConfigError(f"this run is class-conditional: give condition= one of {known}")
            out.append(index)
        return out

    def _predict_regress(self, sequences: list[Any], batch_size: int) -> list[dict[str, Any]]:
        from rnnkit.app.tasks.regress import predict_sequences

        model = cast("Regressor", self.model)  # as load() built it
        return predict_sequences(self.config, model, self._sequences(sequences))

    def _predict_params(
        self, sessions: list[Any], batch_size: int, **options: Any
    ) -> list[dict[str, Any]]:
        from rnnkit.app.tasks.params.scoring import ParamsModel, score_sessions

        run = cast("ParamsModel", (self.extras or {})["params"])
        items = [(_params_session(s, i), f"session {i}", i + 1) for i, s in enumerate(sessions)]
        return list(score_sessions(run, items, batch_size=batch_size, **options))

    def _sequences(self, sequences: list[Any]) -> list[np.ndarray]:
        """Real-valued sequences as the run reads them: each ``(T, D)`` float32 of the
        run's width, checked as the sequence files are (numbers, finite, in float32's
        range, at least one step)."""
        width = (self.extras or {})["input_size"]
        return [_vector_sequence(s, i, width) for i, s in enumerate(sequences)]

    # ---- generate ------------------------------------------------------------------

    def generate(
        self,
        prompt: str | None = None,
        *,
        num: int = 1,
        max_length: int = 200,
        strategy: str = "sample",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        beam_size: int | None = None,
        seed: int | None = None,
        condition: str | None = None,
    ) -> list[str]:
        """``num`` continuations of ``prompt`` (the prompt not repeated); ``lm`` runs.

        Args:
            strategy: ``"sample"``, ``"greedy"`` or ``"beam"`` (``beam_size`` wide).
            temperature, top_k, top_p: sampling options (``strategy="sample"`` only).
            beam_size: the beam's width (``strategy="beam"`` only; default 4).
            seed: the sampling seed (default the run's): the same seed, the same texts.
            condition: the class to write for (a class-conditional ``lm``, required there).

        An option of another strategy than ``strategy`` is a ``ConfigError`` (it was
        dropped), as ``rnnkit generate`` refuses ``--beam 3 --temperature 5``.
        """
        from rnnkit.app.tasks.lm import sample_texts

        if self.task != "lm":
            raise self._not_for("generate")
        assert self.vocab is not None  # a language model's
        if prompt is not None and not isinstance(prompt, str):
            # a list was encoded element by element: a word of a character run is <unk>
            raise ConfigError(f"prompt must be a string or None, got {type(prompt).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer or None, got {seed!r}")
        if seed is not None and not -(2**63) <= seed < 2**64:  # what torch's generator takes
            raise ConfigError(f"seed must be in [-2**63, 2**64), got {seed}")
        # as rnnkit generate bounds --num and --max-len: None was a TypeError from a
        # comparison, and num=10**12 asked the allocator for terabytes
        _check_count("num", num, MAX_GENERATE_OUTPUTS)
        _check_count("max_length", max_length, MAX_GENERATE_TOKENS)
        _check_strategy(strategy, temperature, top_k, top_p, beam_size, seed)
        if strategy == "greedy" and num > 1:  # one text, num times (the command refuses it)
            raise ConfigError(
                f"strategy='greedy' gives one text; num={num} is for strategy='sample' "
                "(or 'beam', which lists the num best)"
            )
        index = None
        if self.labels is not None:
            known = ", ".join(self.labels.labels)
            if condition is None or self.labels.get(condition) is None:
                raise ConfigError(f"this run is class-conditional: give condition= one of {known}")
            index = self.labels.get(condition)
        elif condition is not None:
            raise ConfigError("condition= applies to a class-conditional run only")
        try:
            with _evaluating(self.model):
                texts = sample_texts(
                    self.config,
                    self.vocab,
                    # load() builds the model of --task lm's wiring and condition
                    cast("LanguageModel | JordanLM | ConditionalLM", self.model),
                    prompt,
                    num=num,
                    max_length=max_length,
                    strategy=strategy,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    beam_size=4 if beam_size is None else beam_size,
                    seed=seed,
                    condition=index,
                )
        except ValueError as exc:  # an out-of-range sampling option, named by generate_batch
            raise ConfigError(str(exc)) from None
        return texts


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """The model in evaluation mode for the block, and every module's own mode back after
    it: a ``predict`` or ``generate`` inside a fine-tuning loop left dropout off."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _check_strategy(
    strategy: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    beam_size: int | None,
    seed: int | None,
) -> None:
    """A ``ConfigError`` for an option ``strategy`` does not read (sampling options with
    a search, ``beam_size`` without ``"beam"``): it was dropped without a word."""
    if strategy not in ("sample", "greedy", "beam"):
        return  # named by the search
    if strategy != "sample":
        given = {"temperature": temperature != 1.0, "top_k": top_k is not None}
        given |= {"top_p": top_p is not None, "seed": seed is not None}
        names = [name for name, is_given in given.items() if is_given]
        if names:
            listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
            raise ConfigError(
                f"strategy={strategy!r} searches; {listed} {'are' if len(names) > 1 else 'is'} "
                "for strategy='sample': give one or the other"
            )
    if beam_size is not None and strategy != "beam":
        raise ConfigError(f"beam_size is for strategy='beam', not strategy={strategy!r}")


def _check_count(name: str, value: object, most: int) -> None:
    """A ``ConfigError`` naming ``name`` unless ``value`` is an integer in ``[1, most]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ConfigError(f"{name} must be an integer ≥ 1, got {value!r}")
    if int(value) > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {int(value):,}")


def _vector_sequence(seq: object, i: int, width: int) -> np.ndarray:
    """One real-valued sequence given in Python as ``(T, D)`` float32: ``D`` the run's
    ``width`` (``(T,)`` reads as ``D = 1``), at least one step, every value a finite
    number within float32's range (what a sequence file's line must hold)."""
    if isinstance(seq, (str, bytes)) or seq is None:
        raise ConfigError(f"sequence {i} is {type(seq).__name__}: give (T, D) numbers")
    if isinstance(seq, torch.Tensor):
        seq = seq.detach().cpu().numpy()
    try:
        values = np.asarray(seq, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # ragged rows, text among the numbers
        raise ConfigError(
            f"sequence {i} is not (T, D) numbers: every step must hold {width} numbers"
        ) from None
    if values.ndim == 1:
        values = values[:, None]
    if values.ndim != 2:
        raise ConfigError(f"sequence {i} has {values.ndim} dimensions, expected (T, D)")
    if values.shape[0] == 0:
        raise DataError(f"sequence {i} has no steps")
    if values.shape[1] != width:
        raise DataError(f"sequence {i} has {values.shape[1]} values a step, the run's {width}")
    if not np.isfinite(values).all():
        raise DataError(f"sequence {i} holds a value that is not finite (NaN or infinity)")
    if np.abs(values).max() > np.finfo(np.float32).max:
        raise DataError(f"sequence {i} holds a value out of float32's range (±3.4e38)")
    return values.astype(np.float32)


def _params_session(session: object, i: int) -> Session:
    """A params run's session given in Python: a :class:`Session`, or a dict read as a
    line of a sessions file (the same checks, ``session i`` where a file names its line)."""
    from rnnkit.data.events import parse_session

    if isinstance(session, Session):
        if session.params is None:
            raise DataError(f"session {i} has no params (the values of its events)")
        # its line, checked as a file's would be (events and params of one length, ...)
        session = {
            "session": session.session,
            "events": session.events,
            "params": session.params,
            **({} if session.label is None else {"label": session.label}),
        }
    if not isinstance(session, dict):
        raise ConfigError(
            f"session {i} is {type(session).__name__}: give a Session or a dict "
            '{"session", "events", "params"}'
        )
    try:
        text = json.dumps(session, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a NaN, an object json cannot write
        raise DataError(f"session {i}: {exc}") from None
    return parse_session(text, f"session {i}", None)


def _check_texts(texts: list[Any], what: str, line: str | None = None) -> None:
    """A ``ConfigError`` naming the first of ``texts`` that is not a string (``None`` or a
    number failed inside the vocabulary with "object of type 'int' has no len()"); with
    ``line`` (the training file's form), a ``DataError`` naming the first that holds a
    tab, which no text a run trained on holds (the label or target would be read as
    text)."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ConfigError(f"{what} {i} is {type(text).__name__}, expected a string")
        if line is not None and "\t" in text:
            raise DataError(f"{what} {i} holds a tab: a {line} line? pass the {what} alone")


def _tokens(sentence: object, i: int) -> list[str]:
    """A tagger's sentence as its tokens: a string split as ``rnnkit predict`` splits a
    line (on tabs where it holds one, else on whitespace), or a list of non-empty strings
    (the tagged files' rule: a token is never empty). A blank string or an empty list is
    a sentence of no tokens, which gets no tags, as a blank line of ``rnnkit predict``
    does."""
    if isinstance(sentence, str):
        from rnnkit.app.tasks.tag import sentence_tokens  # the command line's rule

        try:
            tokens = sentence_tokens(sentence)
        except DataError as exc:
            raise DataError(f"sentence {i}: {exc.message}") from None
    elif isinstance(sentence, Sequence):
        tokens = list(sentence)
    else:
        raise ConfigError(
            f"sentence {i} is {type(sentence).__name__}: give a list of tokens or a string"
        )
    _check_names(tokens, f"sentence {i}", "token {}")
    return tokens


def _events(session: object, i: int) -> list[str]:
    """A session given as its events: a list, never one string (whose characters would
    be read as events) nor a non-sequence."""
    if isinstance(session, str):
        raise ConfigError(f"session {i} is a string: give a list of event names")
    if not isinstance(session, Sequence):
        raise ConfigError(f"session {i} is {type(session).__name__}: give a list of event names")
    return list(session)


def _check_events(events: list[Any], i: int) -> None:
    """The events files' rules (``rnnkit.data.events``) for a session given in Python: at
    least one event, each a non-empty string. ``None``, a number or ``""`` was scored as
    the unknown symbol, a verdict on events that were never given."""
    if not events:
        raise DataError(f"session {i} has no events")
    _check_names(events, f"session {i}", "events[{}]")


def _check_names(names: list[Any], where: str, name: str) -> None:
    """Each of ``names`` a non-empty string, else a ``ConfigError`` naming ``where`` and
    the item (``name`` formatted with its index)."""
    for j, item in enumerate(names):
        if not isinstance(item, str):
            found = type(item).__name__
            raise ConfigError(f"{where}: {name.format(j)} is {found}, expected a string")
        if not item:
            raise ConfigError(f"{where}: {name.format(j)} is an empty string")


def load(run_dir: str | Path, device: str = "cpu") -> TrainedRun:
    """Load the run directory ``rnnkit train`` wrote, whatever its task.

    Args:
        run_dir: the ``--out`` directory of ``rnnkit train``.
        device: where the model goes (``"cpu"``, ``"cuda"``, ...).

    Raises:
        CheckpointError: a missing or inconsistent file, named.
    """
    if not isinstance(run_dir, (str, PathLike)):  # pathlib's own TypeError named no argument
        raise ConfigError(f"run_dir must be a path, got {type(run_dir).__name__}")
    run_dir = Path(run_dir)
    task = task_of_run(run_dir)
    model: nn.Module  # of the task's own kind
    extras: dict[str, Any]
    if task == "lm":
        from rnnkit.app.tasks.lm import lm_labels, load_lm

        cfg, vocab, model = load_lm(run_dir, device)
        return TrainedRun(run_dir, task, cfg, model, vocab, lm_labels(run_dir, cfg))
    if task == "classify":
        from rnnkit.app.tasks.classify import load_classifier

        # (the file checks are the loader's, next: not twice)
        if load_config(run_dir, task="classify", verify=False)[0].inputs == "vectors":
            from rnnkit.app.tasks.classify_vectors import load_vector_classifier

            cfg, width, labels, model = load_vector_classifier(run_dir, device)
            extras = {"input_size": width}  # no vocabulary: frames of this width
            return TrainedRun(run_dir, task, cfg, model, None, labels, extras=extras)
        cfg, vocab, labels, model = load_classifier(run_dir, device)
        return TrainedRun(run_dir, task, cfg, model, vocab, labels)
    if task == "tag":
        from rnnkit.app.tasks.tag import load_tagger

        cfg, data, model = load_tagger(run_dir, device)
        return TrainedRun(
            run_dir, task, cfg, model, data.vocab, data.tags, extras={"chars": data.chars}
        )
    if task == "seq2seq":
        from rnnkit.app.tasks.seq2seq import load_seq2seq

        cfg, source, target, model = load_seq2seq(run_dir, device)
        return TrainedRun(run_dir, task, cfg, model, target, source_vocab=source)
    if task == "events":
        from rnnkit.app.tasks.events import load_events

        run = load_events(run_dir, device)
        extras = {"thresholds": run.thresholds, "ngram": run.ngram, "events": run}
        return TrainedRun(run_dir, task, run.cfg, run.model, run.vocab, extras=extras)
    if task == "regress":
        from rnnkit.app.tasks.regress import load_regressor

        cfg, info, model = load_regressor(run_dir, device)
        extras = {"input_size": info["input_size"], "output_size": info["output_size"]}
        return TrainedRun(run_dir, task, cfg, model, None, extras=extras)
    if task == "params":
        from rnnkit.app.tasks.params.scoring import load_params

        params = load_params(run_dir, device)
        models = nn.ModuleList([cast("nn.Module", key.model) for key in params.keys])
        return TrainedRun(run_dir, task, params.cfg, models, None, extras={"params": params})
    raise ConfigError(f"{run_dir}: runs of task {task!r} cannot be loaded by this version")
