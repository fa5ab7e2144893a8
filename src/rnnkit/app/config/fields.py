"""One option of the training configuration: a dataclass field that carries, in its
metadata, everything the command line and a configuration file need to offer it.

``option(default, help=..., choices=...)`` wraps :func:`dataclasses.field`; the
:class:`Option` it stores is read by ``rnnkit train`` to build its argument
(``rnnkit.app.cli.train``), by :meth:`TrainConfig.validate` to check the value, and by the
tables of options that only some tasks or cells read. So a choice list, a help text and
the tasks an option applies to are written once, next to the field, and the parser, the
checks and ``--help`` cannot disagree.

The option's flag is always its field name with dashes (``batch_size`` → ``--batch-size``):
every message that names an option is built that way, and a configuration file's keys are
the same names.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

from rnnkit.errors import ConfigError
from rnnkit.models.spec import TASKS as MODEL_TASKS

__all__ = [
    "TASKS",
    "TOKEN_TASKS",
    "Option",
    "check_choice",
    "check_option",
    "check_positive",
    "check_rate",
    "flag",
    "option",
    "option_fields",
    "option_of",
    "value_kinds",
]

#: Every task of ``rnnkit train --task`` (the models' list: ``ModelSpec.for_task`` checks it).
TASKS = MODEL_TASKS
#: The tasks that read tokens (``regress`` and ``params`` read vectors of numbers).
TOKEN_TASKS = ("lm", "tag", "classify", "seq2seq", "events")


class _Same:
    """The command line's default is the field's own (the usual case)."""

    def __repr__(self) -> str:
        return "SAME"


SAME: Any = _Same()


@dataclass(frozen=True)
class Option:
    """What the command line needs of one field (``dataclasses.Field.metadata["option"]``).

    Attributes:
        help: the ``--help`` text (``%(default)s`` is argparse's default).
        choices: the only values allowed (checked by argparse, by a configuration file
            and by ``validate``), or None.
        metavar: the placeholder ``--help`` shows, or None for argparse's own.
        tasks: the tasks that read the option; None: every task. Giving it to another
            task is refused (``TrainConfig.check_applies``).
        cells: the recurrent cells that read the option; None: every cell.
        positive: an integer ≥ 1 (None allowed where the field's type allows it).
        rate: a number in (0, 1) (a false-positive rate, a confidence).
        resume: ``--resume`` may change it (how long, where and how verbosely to train).
        command_line: the command line's default when it differs from the field's
            (``--epochs`` unset means "until validation stops improving"; ``--out`` has
            none, it is required); SAME otherwise.
    """

    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    tasks: tuple[str, ...] | None = None
    cells: tuple[str, ...] | None = None
    positive: bool = False
    rate: bool = False
    resume: bool = False
    command_line: Any = SAME


def option(
    default: Any,
    *,
    help: str,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    tasks: tuple[str, ...] | None = None,
    cells: tuple[str, ...] | None = None,
    positive: bool = False,
    rate: bool = False,
    resume: bool = False,
    command_line: Any = SAME,
) -> Any:
    """A dataclass field with default ``default`` and its :class:`Option` as metadata.

    >>> @dataclass
    ... class A:
    ...     width: int = option(8, help="width", positive=True)
    >>> option_of(dataclasses.fields(A)[0]).positive, A().width
    (True, 8)
    """
    meta = Option(help, choices, metavar, tasks, cells, positive, rate, resume, command_line)
    return dataclasses.field(default=default, metadata={"option": meta})


def option_of(field: dataclasses.Field[Any]) -> Option:
    """The :class:`Option` of ``field`` (every field of the configuration has one)."""
    meta = field.metadata.get("option")
    if not isinstance(meta, Option):
        raise TypeError(f"field {field.name} was not declared with option()")
    return meta


def option_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields ``cls`` declares itself (not those of its bases), in order."""
    own = inspect.get_annotations(cls)
    return [f for f in dataclasses.fields(cls) if f.name in own]


def flag(name: str) -> str:
    """The option of the field ``name``: ``batch_size`` → ``--batch-size``."""
    return "--" + name.replace("_", "-")


_KINDS: dict[type, dict[str, tuple[type, bool]]] = {}


def value_kinds(cls: type) -> dict[str, tuple[type, bool]]:
    """Each field of ``cls`` → its type (bool, int, float or str) and whether it may be
    None (``int | None``), from the annotations.

    >>> @dataclass
    ... class A:
    ...     steps: int | None = None
    >>> value_kinds(A)
    {'steps': (<class 'int'>, True)}
    """
    if cls in _KINDS:
        return _KINDS[cls]
    kinds: dict[str, tuple[type, bool]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is typing.ClassVar:
            continue
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        types_ = [a for a in args if a is not type(None)]
        if len(types_) != 1 or types_[0] not in (bool, int, float, str):
            raise TypeError(f"field {name}: {hint} is not an option's type")
        kinds[name] = (types_[0], len(types_) < len(args))
    _KINDS[cls] = kinds
    return kinds


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """``value`` must be one of ``choices``; else a ConfigError naming the option."""
    if value not in choices:
        raise ConfigError(f"{flag(name)} must be one of {', '.join(choices)}, got {value!r}")


def check_positive(name: str, value: Any) -> None:
    """``value`` must be None or an integer in [1, 2^63); else a ConfigError."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag(name)} must be an integer, got {value!r}")
    if value < 1:
        raise ConfigError(f"{flag(name)} must be ≥ 1, got {value}")
    if value >= 2**63:  # torch sizes are 64-bit: OverflowError
        raise ConfigError(f"{flag(name)} is absurdly large: {value}")


def check_rate(name: str, value: Any) -> None:
    """``value`` must be a number in (0, 1); else a ConfigError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{flag(name)} must be in (0, 1), got {value!r}")


def check_option(field: dataclasses.Field[Any], value: Any) -> None:
    """``value`` must be what ``field``'s :class:`Option` declares: one of its choices, a
    positive count, a rate; else a ConfigError naming the option."""
    meta = option_of(field)
    if meta.choices is not None:
        check_choice(field.name, value, meta.choices)
    if meta.positive:
        check_positive(field.name, value)
    if meta.rate:
        check_rate(field.name, value)
