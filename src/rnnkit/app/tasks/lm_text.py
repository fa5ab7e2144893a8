"""What a trained language model does with text: continue a prompt (:func:`sample_texts`,
``rnnkit generate``) and score new lines token by token (:func:`line_logprobs`, ``rnnkit
predict``), each line read from where the model saw lines start."""

from __future__ import annotations

import math
from typing import Any

import torch

from rnnkit.app.config import TrainConfig, parse_bptt
from rnnkit.data.vocab import BOS_ID, EOS_ID, NEVER_GENERATED, Vocabulary
from rnnkit.deferred import deferring
from rnnkit.errors import ConfigError
from rnnkit.models.conditional import CONDITIONAL_STATE_DIM, ConditionalLM
from rnnkit.models.jordan import JordanLM
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.length import LengthState

#: The kinds of model ``--task lm`` trains (``--wiring``, ``--condition``; ``build_lm``).
AnyLM = LanguageModel | JordanLM | ConditionalLM

__all__ = [
    "SCORED_LOGITS",
    "SCORED_STEPS",
    "join_prompt",
    "line_logprobs",
    "prompt_ids",
    "sample_texts",
]

LN2 = math.log(2)


def prompt_ids(cfg: TrainConfig, vocab: Vocabulary, prompt: str | None) -> tuple[list[int], int]:
    """Token ids that prime generation, and how many prompt tokens were unknown.

    Sequence-trained models (``--bptt full``/``window``) saw ``<s>`` first; stream-trained
    ones saw running text, so an empty prompt starts from a newline when it is known.
    """
    ids, unknown = vocab.encode_with_unknown(prompt) if prompt else ([], 0)
    if parse_bptt(cfg.bptt)[0] != "segment":
        return [BOS_ID, *ids], unknown
    if not ids:
        if cfg.doc_boundary != "none":  # lines ended with </s>: text starts after one
            return [EOS_ID], unknown
        newline = vocab.stoi.get("\n") if vocab.unit == "char" else None
        ids = [newline if newline is not None else BOS_ID]
    return ids, unknown


def join_prompt(vocab: Vocabulary, prompt: str | None, continuation: str) -> str:
    """The prompt followed by its generated continuation, joined in the vocabulary's unit.

    Characters join with nothing between them; words with one space, unless the prompt
    already ends in whitespace or either side is empty (the prompt is kept as written).

    >>> join_prompt(Vocabulary(["on"], unit="word"), "the cat", "on dog")
    'the cat on dog'
    >>> join_prompt(Vocabulary(["o"], unit="char"), "the cat", "on dog")
    'the caton dog'
    >>> join_prompt(Vocabulary([], unit="word"), "the cat ", "on"), join_prompt(
    ...     Vocabulary([], unit="word"), None, "on")
    ('the cat on', 'on')
    """
    prompt = prompt or ""
    if vocab.unit == "char" or not prompt or not continuation or prompt[-1].isspace():
        return prompt + continuation
    return prompt + " " + continuation


def sample_texts(
    cfg: TrainConfig,
    vocab: Vocabulary,
    model: AnyLM,
    prompt: str | None = None,
    *,
    num: int = 1,
    max_length: int = 200,
    strategy: str = "sample",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam_size: int = 4,
    seed: int | None = None,
    condition: int | None = None,
) -> list[str]:
    """Generate ``num`` continuations of ``prompt`` as text (the prompt not repeated;
    :func:`join_prompt` joins the two). ``<pad>``, ``<unk>`` and ``<s>`` are never
    generated; ``</s>`` only ends a text, and never for a model of a stream that never
    held it (``segment`` without ``--doc-boundary eos|line``: its texts end at
    ``max_length``).

    ``condition``: the class index a :class:`ConditionalLM` generates for (required for
    one, refused otherwise). With ``--length predict`` and sampling, each sample draws its
    own length ``T`` (which counts the prompt's tokens); greedy and beam search take the
    most probable ``T``.
    """
    from rnnkit.generation.search import generate_batch

    ids, _ = prompt_ids(cfg, vocab, prompt)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed if seed is None else seed)
    model.eval()
    if isinstance(model, ConditionalLM) != (condition is not None):
        raise ValueError("a class index is needed exactly for a class-conditional model")
    prompts, copies = [ids], num
    state: Any = None
    state_batch_dim: Any = getattr(model, "state_batch_dim", 2)
    if isinstance(model, ConditionalLM):
        state = model.start(torch.tensor([condition], device=device))
        state_batch_dim = CONDITIONAL_STATE_DIM
    length = model.length if isinstance(model, LanguageModel) else None
    if length is not None and length.mode == "predict" and strategy == "sample":
        # One draw of T per sample, from the length output reading h_0 = 0.
        h0 = torch.zeros(num, cfg.hidden, device=device)
        lengths = length.start(num, h0, sample=True, generator=generator)
        state, prompts, copies = LengthState(None, lengths), [ids] * num, 1
    # A stream whose lines end in "\n" (segment, no --doc-boundary eos|line) never held
    # </s>: the model gives it a little probability all the same, and a hot sample drew
    # it, ending texts on a symbol never seen. Such texts end at max_length only.
    ends = parse_bptt(cfg.bptt)[0] != "segment" or cfg.doc_boundary in ("eos", "line")
    results = generate_batch(
        model,
        prompts,
        max_length=max_length,
        eos_id=EOS_ID if ends else None,
        strategy=strategy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        beam_size=beam_size,
        num=copies,
        generator=generator,
        state=state,
        state_batch_dim=state_batch_dim,
        forbid=NEVER_GENERATED if ends else (*NEVER_GENERATED, EOS_ID),
    )
    return [vocab.decode(r.ids) for row in results for r in row]


# -- per-token scores of new text ---------------------------------------------------------


def _line_ends(cfg: TrainConfig, vocab: Vocabulary) -> tuple[int, int | None]:
    """The token that precedes a line and the one that ends it, as the model saw them:
    ``<s>`` … ``</s>`` for sequence-trained models (under ``--length stop`` the ``</s>``
    step is the stop output's probability); for streams ``</s>`` with ``--doc-boundary
    eos|line``, else the newline character of a char model (None: a word stream has no
    end)."""
    if parse_bptt(cfg.bptt)[0] != "segment":
        return BOS_ID, EOS_ID
    if cfg.doc_boundary in ("eos", "line"):
        return EOS_ID, EOS_ID
    newline = vocab.stoi.get("\n") if vocab.unit == "char" else None
    return (BOS_ID if newline is None else newline), newline


#: Most steps one forward call of :func:`line_logprobs` reads: the layers keep what a
#: backward would need of every step of a call (a 200,000-character line took 1.7 GB).
SCORED_STEPS = 1024

#: Most logits (lines × steps × vocabulary) one forward call of :func:`line_logprobs`
#: holds, 64 MiB of float32 (and its log-sum-exp as much again): a call reads at least
#: one step, so where lines × vocabulary alone is larger a call holds one step's.
SCORED_LOGITS = 1 << 24


@torch.no_grad()
def line_logprobs(
    cfg: TrainConfig,
    vocab: Vocabulary,
    model: AnyLM,
    lines: list[str],
    conditions: list[int] | None = None,
    batch_size: int | None = None,
) -> list[dict[str, Any]]:
    """Per-token log-probabilities (nats) and surprise (bits, ``−log₂ p``) of every line,
    ``batch_size`` lines at a time (None: all at once).

    Each line is read from the model's start of a line (:func:`_line_ends`) and scored
    token by token, the end of the line included where the model knows one: a plain
    :class:`LanguageModel` through its forward, many steps a call; every other model
    (``--wiring``, ``--condition``, ``--length``) through its ``step``, the generation
    interface. ``conditions``: the class of every line for a
    class-conditional model.

    Returns, per line: ``{"tokens": [...], "logprobs": [...], "surprise": [...],
    "nats": total, "unknown": n}`` (``tokens`` as the vocabulary reads the line, ``"</s>"``
    or ``"\\n"`` for the end).
    """
    if batch_size is not None and len(lines) > batch_size:
        return [
            record
            for lo in range(0, len(lines), batch_size)
            for record in line_logprobs(
                cfg,
                vocab,
                model,
                lines[lo : lo + batch_size],
                None if conditions is None else conditions[lo : lo + batch_size],
            )
        ]
    length = model.length if isinstance(model, LanguageModel) else None
    if length is not None and length.mode == "predict":
        raise ConfigError(
            "predict on a --length predict run: its token probabilities depend on the "
            "length chosen first; evaluate scores whole sequences"
        )
    start, end = _line_ends(cfg, vocab)
    model.eval()
    device = next(model.parameters()).device
    rows, results = [], []
    for text in lines:
        ids, unknown = vocab.encode_with_unknown(text)
        pieces = vocab.tokenize(text)
        targets = [*ids, end] if end is not None else list(ids)
        shown = [*pieces, vocab.itos[end]] if end is not None else list(pieces)
        rows.append(([start, *ids], targets))
        results.append({"tokens": shown, "unknown": unknown})
    if not rows:
        return []
    T = max(len(t) for _, t in rows)
    state: Any = None
    if isinstance(model, ConditionalLM):
        if conditions is None:
            raise ValueError("a class-conditional model needs the class of every line")
        state = model.start(torch.tensor(conditions, device=device))
    elif conditions is not None:
        raise ValueError("classes given for a model that is not class-conditional")
    # Every step's ids made on the host and moved once: rows already scored feed their
    # last token again (their outputs are not read); a line of no token (blank under
    # --unit word without a line end) reads any id.
    inputs = torch.tensor([[inp[min(t, len(inp) - 1)] for inp, _ in rows] for t in range(T)])
    wants = torch.tensor(
        [[tg[min(t, len(tg) - 1)] if tg else 0 for _, tg in rows] for t in range(T)]
    )  # (T, n): a step's ids are one contiguous row
    inputs, wants = inputs.to(device), wants.to(device)
    got = torch.zeros(T, len(rows), dtype=torch.float64, device=device)
    # deferring(): on a GPU the model's check of each step's ids (checked above, by the
    # vocabulary) is read once at the end, and the log-probabilities stay on the device
    # until then: no wait for the device at every token
    with deferring():
        if isinstance(model, LanguageModel) and model.length is None:
            # A plain model reads a stretch of steps in one forward call (the step loop
            # scored ~1,000 characters a second of one long line on a CPU): a row's steps
            # after its end feed only later steps, which are not read.
            span = max(1, min(T, SCORED_STEPS, SCORED_LOGITS // (len(rows) * model.vocab_size)))
            for lo in range(0, T, span):
                logits, state = model(inputs[lo : lo + span].T, state=state)  # (n, t, V)
                want = wants[lo : lo + span].T.unsqueeze(-1)  # (n, t, 1)
                lp = logits.gather(2, want).squeeze(-1) - logits.logsumexp(-1)  # (n, t)
                got[lo : lo + span] = lp.T.double()
        else:
            for t in range(T):
                log_probs, state = model.step(inputs[t], state)
                got[t] = log_probs.gather(1, wants[t].view(-1, 1)).squeeze(1).double()
    got = got.T.cpu()
    for i, (_, targets) in enumerate(rows):
        lp = got[i, : len(targets)].tolist()
        results[i]["logprobs"] = lp
        # 0.0 - x, not -x: a certain token (log p = 0) is 0, not -0.0 in the output
        results[i]["surprise"] = [(0.0 - v) / LN2 for v in lp]
        results[i]["nats"] = 0.0 - sum(lp)
    return results
