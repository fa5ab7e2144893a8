"""``rnnkit generate``: sample, decode greedily or beam-search from a trained checkpoint."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rnnkit.app.cli.aliases import add_max_len_option, warn_deprecated
from rnnkit.app.cli.run_options import add_device_option, add_run_option
from rnnkit.errors import ConfigError, DataError

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a checkpoint",
        description="Generate from a trained model; the state is carried "
        "token to token (O(1) work per token).",
    )
    p.add_argument("--checkpoint", required=True, help="run directory written by train")
    p.add_argument("--prompt", help="text that primes the state (lm)")
    p.add_argument("--input", help="source text to transduce (seq2seq)")
    p.add_argument(
        "--condition", metavar="LABEL", help="the class to generate for (class-conditional lm)"
    )
    add_max_len_option(
        p,
        "tokens to generate at most (default 200 for a language model; for seq2seq the "
        "run's --max-len)",
        default=200,
    )
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature > 0")
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with mass ≥ p")
    p.add_argument("--greedy", action="store_true", help="take the most likely token")
    add_run_option(p, "beam", default_text="sampling for a language model, the run's for seq2seq")
    p.add_argument("--seed", type=int, default=0, help="random seed (reproducible samples)")
    p.add_argument("--num", type=int, default=1, help="number of samples")
    p.add_argument("--json", action="store_true", help="print one JSON object per sample")
    add_device_option(p)
    p.set_defaults(func=run)


def _condition_index(checkpoint: str, cfg: Any, label: str | None) -> int | None:
    """The class index of ``--condition LABEL``; a clear error naming the known labels."""
    from rnnkit.app.tasks.lm import lm_labels

    labels = lm_labels(checkpoint, cfg)
    if labels is None:
        if label is not None:
            raise ConfigError(
                "--condition applies to a class-conditional checkpoint "
                "(trained with --condition init, input or both)"
            )
        return None
    known = ", ".join(labels.labels)
    if label is None:
        raise ConfigError(f"this checkpoint is class-conditional: give --condition LABEL ({known})")
    index = labels.get(label)
    if index is None:
        raise ConfigError(f"--condition {label!r} is not a label of this checkpoint ({known})")
    return index


#: Options that ask to sample rather than search (``--greedy``, ``--beam``).
SAMPLING = ("temperature", "top_k", "top_p", "seed")


def _given(args: argparse.Namespace, name: str) -> bool:
    """Whether ``--name`` was given (set by ``cli.main``; called directly: not its default)."""
    explicit = getattr(args, "explicit", None)
    if explicit is not None:
        return name in explicit
    default = {"temperature": 1.0, "seed": 0, "max_length": 200}.get(name)
    return getattr(args, name) not in (None, default)


def _samples(args: argparse.Namespace) -> bool:
    """Whether a sampling option was given: a seq2seq run then samples, not searches."""
    return any(_given(args, name) for name in SAMPLING)


def _check_decoding(args: argparse.Namespace) -> None:
    """One way to decode, for both tasks: a search (``--greedy`` or ``--beam N``) or
    sampling. A mix was decoded one way with the other's options dropped (a language
    model's ``--greedy --beam 3`` searched 3 wide), so it is one line, before any work."""
    if _samples(args) and (args.beam is not None or args.greedy):
        raise ConfigError(
            "--beam/--greedy search; --temperature, --top-k, --top-p and --seed sample: "
            "give one or the other"
        )
    if args.greedy and args.beam is not None:
        raise ConfigError(
            "--greedy takes the most likely token; --beam N keeps the N most likely "
            "prefixes (--beam 1 is greedy): give one or the other"
        )
    if args.greedy and args.num > 1:  # a language model printed one text N times
        raise ConfigError("--greedy gives one output; --num N with --beam N lists the N best")
    if args.beam is not None and args.num > args.beam:
        # a beam of B keeps B hypotheses: a seq2seq run's --beam 1 --num 3 searched 3
        # wide in silence, a language model's named Python's num and beam_size
        raise ConfigError(
            f"--num {args.num} with --beam {args.beam}: a beam of {args.beam} keeps the "
            f"{args.beam} best; give --beam {args.num} or more"
        )


def _transduce(args: argparse.Namespace, module: Any) -> list[str]:
    """``--input`` through a seq2seq run: the run's search (``--beam`` or the run's beam;
    ``--num N`` best hypotheses), ``--greedy``, or sampling when a sampling option is given
    (``--num`` samples); at most ``--max-len`` tokens (default: the run's ``--max-len``)."""
    from rnnkit.app.tasks.seq2seq_generate import EmptySource
    from rnnkit.messages import warning as warn

    if args.input is None:
        raise ConfigError("--input is required for a seq2seq checkpoint")
    if args.prompt is not None:
        raise ConfigError("--prompt applies to a language model; a seq2seq run reads --input")
    sample = _samples(args)  # with no --beam or --greedy: _check_decoding
    try:
        outputs, unknown = module.generate_outputs(
            args.checkpoint,
            args.input,
            sample=sample,
            num=args.num,
            beam=1 if args.greedy else args.beam,
            max_length=args.max_length if _given(args, "max_length") else None,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            device=args.device,
        )
    except EmptySource:  # its message names the Python argument (text)
        raise DataError("--input is empty (no tokens): nothing to transduce") from None
    if unknown:
        warn(f"--input has {unknown} token(s) outside the vocabulary; read as <unk>")
    return list(outputs)


def _check_options(args: argparse.Namespace) -> None:
    """The options every task reads: one line naming the option, before any work."""
    from rnnkit.generation.options import MAX_BEAM, MAX_GENERATE_OUTPUTS, MAX_GENERATE_TOKENS

    if args.max_length is not None and args.max_length > MAX_GENERATE_TOKENS:
        raise ConfigError(
            f"--max-len must be at most {MAX_GENERATE_TOKENS:,}, got {args.max_length:,}"
        )
    # both tasks: the seq2seq functions name their Python arguments (num, max_length)
    if args.max_length is not None and args.max_length < 1:
        raise ConfigError(f"--max-len must be ≥ 1, got {args.max_length}")
    if args.num < 1:
        raise ConfigError(f"--num must be ≥ 1, got {args.num}")
    if args.num > MAX_GENERATE_OUTPUTS:
        raise ConfigError(f"--num must be at most {MAX_GENERATE_OUTPUTS:,}, got {args.num:,}")
    if args.beam is not None and not 1 <= args.beam <= MAX_BEAM:
        # 0 was taken as "no beam" while -2 was refused; 100,000 decoded for minutes.
        raise ConfigError(f"--beam must be an integer from 1 to {MAX_BEAM}, got {args.beam}")
    # The sampler's own checks name its parameters (top_k); the user typed the options.
    if not (0 < args.temperature < math.inf):
        raise ConfigError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError(f"--top-k must be ≥ 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {args.top_p}")
    if abs(args.seed) >= 2**63:  # a torch generator takes 64 bits
        raise ConfigError(f"--seed must be an integer below 2^63 in size, got {args.seed}")
    _check_decoding(args)


def run(args: argparse.Namespace) -> int:
    from rnnkit.app.tasks.registry import task_module, task_of_run

    warn_deprecated(args)
    _check_options(args)
    task = task_of_run(args.checkpoint)
    if args.condition is not None and task != "lm":
        raise ConfigError(f"--condition does not apply to a checkpoint of --task {task}")
    if task == "seq2seq":
        outputs = _transduce(args, task_module(task))
    elif task == "lm":
        from rnnkit.app.tasks.lm import join_prompt, load_lm, prompt_ids, sample_texts
        from rnnkit.messages import warning as warn

        if args.input is not None:  # was ignored: an unprompted sample, exit status 0
            raise ConfigError("--input applies to a seq2seq run; a language model reads --prompt")
        cfg, vocab, model = load_lm(args.checkpoint, args.device)
        condition = _condition_index(args.checkpoint, cfg, args.condition)
        _, unknown = prompt_ids(cfg, vocab, args.prompt)
        if unknown:
            warn(f"--prompt has {unknown} token(s) outside the vocabulary; read as <unk>")
        strategy = "beam" if args.beam else "greedy" if args.greedy else "sample"
        try:
            outputs = sample_texts(
                cfg,
                vocab,
                model,
                args.prompt,
                num=args.num,
                max_length=args.max_length,
                strategy=strategy,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                beam_size=args.beam or 4,
                seed=args.seed,
                condition=condition,
            )
        except ValueError as exc:  # an out-of-range sampling option, named by generate()
            raise ConfigError(str(exc)) from None
        outputs = [join_prompt(vocab, args.prompt, text) for text in outputs]
    else:
        raise ConfigError(f"generate does not apply to a checkpoint of --task {task}")
    for text in outputs:
        print(json.dumps({"text": text}) if args.json else text)
    return 0
