"""Size limits of what rnnkit reads: an absurd input is a clear error, not an out-of-memory.

Every limit has a default generous enough for real data, a keyword argument of the
readers that enforce it, and an environment variable, so a user of the command line can
raise it without a code change::

    RNNKIT_MAX_LINE_CHARS=4000000 rnnkit train --task classify --train long-docs.tsv ...

=====================  ==========================  =====================================
limit                  default                     applies to
=====================  ==========================  =====================================
``max_line_chars``     1,048,576 characters        a line of a CoNLL-U, ``token<TAB>tag``,
                                                   ``label<TAB>text``,
                                                   ``source<TAB>target`` or word-vectors
                                                   file (an error);
                                                   strace and log lines (skipped, counted)
``max_json_line_bytes`` 10 MiB                     a line of an events JSON-lines file or
                                                   of the streaming input (one session)
``max_seq_len``        1,000,000 tokens            a tagged sentence, an event session
``max_vocab``          1,000,000 tokens            a vocabulary built from data
``max_json_depth``     100 levels                  nesting of any JSON rnnkit reads
``max_file_bytes``     4 GiB                       a training or evaluation data file
                                                   (read in chunks, checked as it comes)
``max_corpus_bytes``   1 GiB                       a plain-text language-model corpus
                                                   (held whole, then as 8-byte token ids:
                                                   about 10 bytes of memory per byte)
``max_parameters``     500,000,000 parameters      the recurrent layers of a model to train
                                                   (``rnnkit train --max-parameters N``)
=====================  ==========================  =====================================

A plain-text language-model corpus has no line limit: it is a document, read whole and
cut into segments, so a corpus without newlines is legitimate.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from os import PathLike
from typing import Any

from rnnkit.data.utf8 import decode_utf8
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "MAX_CORPUS_BYTES",
    "MAX_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_LINE_BYTES",
    "MAX_LINE_CHARS",
    "MAX_PARAMETERS",
    "MAX_SEQ_LEN",
    "MAX_VOCAB",
    "Limit",
    "loads_json",
]


@dataclass(frozen=True)
class Limit:
    """One size limit: its keyword name, its default, and what it counts.

    >>> MAX_SEQ_LEN.value(5)
    5
    >>> MAX_SEQ_LEN.exceeded("sentence of 7 tokens", 5)
    'sentence of 7 tokens, over the limit of 5 tokens (raise it with RNNKIT_MAX_SEQ_LEN=N, \
or max_seq_len=N in Python)'
    """

    name: str
    default: int
    unit: str

    @property
    def env(self) -> str:
        """The environment variable that overrides the default."""
        return f"RNNKIT_{self.name.upper()}"

    def value(self, override: int | None = None, default: int | None = None) -> int:
        """The limit in force: ``override`` if given, else the environment variable, else
        ``default`` (a module's own constant) or this limit's default."""
        if override is not None:
            if isinstance(override, bool) or not isinstance(override, int) or override < 1:
                raise ConfigError(f"{self.name} must be a positive integer, got {override!r}")
            return override
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default if default is None else default
        try:
            found = int(raw.replace("_", ""))
        except ValueError:
            found = 0
        if found < 1:
            raise ConfigError(f"{self.env} must be a positive integer, got {raw!r}")
        return found

    def exceeded(self, found: str, limit: int) -> str:
        """The message body: what was found, the limit, and how to raise it."""
        return (
            f"{found}, over the limit of {limit:,} {self.unit} (raise it with "
            f"{self.env}=N, or {self.name}=N in Python)"
        )


MAX_LINE_CHARS = Limit("max_line_chars", 1 << 20, "characters")
MAX_JSON_LINE_BYTES = Limit("max_json_line_bytes", 10 << 20, "bytes")
MAX_SEQ_LEN = Limit("max_seq_len", 1_000_000, "tokens")
MAX_VOCAB = Limit("max_vocab", 1_000_000, "tokens")
MAX_JSON_DEPTH = Limit("max_json_depth", 100, "levels")
MAX_FILE_BYTES = Limit("max_file_bytes", 4 << 30, "bytes")
MAX_CORPUS_BYTES = Limit("max_corpus_bytes", 1 << 30, "bytes")
MAX_PARAMETERS = Limit("max_parameters", 500_000_000, "parameters")


def _depth_over(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all different: ``json.loads`` keeps the last of two values
    in silence (``{"seq": A, "seq": B}`` is B); no file of rnnkit repeats a key."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _not_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is out of the range of a finite number")
    return value


def loads_json(
    text: str | bytes,
    path: str | PathLike[str] | None = None,
    line: int | None = None,
    *,
    max_depth: int | None = None,
    only_text: bool = False,
    **options: Any,
) -> Any:
    """``json.loads`` that fails only with a one-line :class:`DataError` naming ``path:line``.

    Python's decoder raises ``RecursionError`` on deep nesting (``[`` x 100,000) and a
    bare ``ValueError`` on an integer of over 4,300 digits; both become a ``DataError``,
    and so do nesting deeper than ``max_depth`` (:data:`MAX_JSON_DEPTH`), which no file
    of rnnkit needs, and an object that repeats a key (``json.loads`` keeps the last value
    in silence). ``only_text``: a data file's strings, text only (no lone surrogate,
    below). ``options`` go to ``json.loads`` (``object_pairs_hook``...); an exception
    raised by a hook passes through.

    >>> loads_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> loads_json('{"y": 1, "y": 2}', "r.jsonl", 3)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: r.jsonl:3: invalid JSON: key 'y' appears twice
    >>> loads_json("[" * 100_000, "x.json")
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: x.json: JSON nested too deeply, over the limit of 100 levels \
(raise it with RNNKIT_MAX_JSON_DEPTH=N, or max_json_depth=N in Python)
    """
    limit = MAX_JSON_DEPTH.value(max_depth)
    too_deep = MAX_JSON_DEPTH.exceeded("JSON nested too deeply", limit)
    if isinstance(text, bytes):
        # line None: a whole file, whose line of the bad byte is counted from the bytes.
        text = decode_utf8(text, path, line)
    # Strict JSON: NaN, Infinity and 1e999 are not numbers JSON allows (a NaN threshold
    # would switch detection off); every file rnnkit writes is strict JSON too.
    options.setdefault("parse_constant", _not_json_number)
    options.setdefault("parse_float", _finite_float)
    options.setdefault("object_pairs_hook", _unique_keys)
    try:
        value = json.loads(text, **options)
    except json.JSONDecodeError as exc:
        # A line of a JSON-lines file is named by the caller; in a whole file, by the error.
        at = line if line is not None else exc.lineno
        raise DataError(f"invalid JSON: {exc.msg} (column {exc.colno})", path, at) from None
    except _DuplicateKey as exc:
        raise DataError(f"invalid JSON: key {exc.key!r} appears twice", path, line) from None
    except RecursionError:
        raise DataError(too_deep, path, line) from None
    except ValueError as exc:
        if "digits" in str(exc):  # int() refuses over sys.get_int_max_str_digits() digits
            raise DataError("invalid JSON: an integer with too many digits", path, line) from None
        raise DataError(f"invalid JSON: {exc}", path, line) from None
    # Counting brackets is a fast upper bound; only a document that could be too deep is
    # walked.
    if text.count("[") + text.count("{") > limit and _depth_over(value, limit):
        raise DataError(too_deep, path, line)
    # With ``only_text``, a string may not spell half of a UTF-16 pair ("\ud800"), which JSON's
    # grammar allows and no text can hold: a data file's token or label so spelt failed
    # later, writing a vocabulary or printing a verdict. (A run's own files keep paths,
    # which Python spells so where a name is not UTF-8.) Only a document that spells one
    # is walked.
    if only_text and _SURROGATE_ESCAPE.search(text) and (lone := _lone_surrogate(value)):
        shown = lone if len(lone) <= 40 else lone[:40] + "..."
        raise DataError(
            f"invalid JSON: the string {shown!r} holds a lone surrogate (half of a UTF-16 "
            "pair), which is not text",
            path,
            line,
        )
    return value


#: A JSON escape of a surrogate code point (U+D800 to U+DFFF), paired or not
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _lone_surrogate(value: Any) -> str | None:
    """The first string (object keys included) of a decoded JSON ``value`` that holds a
    lone surrogate code point, else None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
