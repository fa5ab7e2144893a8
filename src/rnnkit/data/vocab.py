"""Vocabulary: the two-way map between tokens (characters or words) and integer ids.

Ids 0-3 are always the specials ``<pad>``, ``<unk>``, ``<s>``, ``</s>``; regular tokens follow
by decreasing count (ties by code point order, so a vocabulary is a pure function of its
counts). Character encoding of large texts goes through numpy on code points, never through
one Python object per character.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from os import PathLike
from typing import TypeVar

import numpy as np

from rnnkit.data.files import atomic_write_bytes, read_run_file
from rnnkit.data.limits import MAX_VOCAB, loads_json
from rnnkit.data.utf8 import decode_utf8
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "NEVER_GENERATED",
    "NOT_TEXT",
    "PAD_ID",
    "SPECIALS",
    "UNITS",
    "UNK_ID",
    "Vocabulary",
    "count_tokens",
]

# A vocabulary class: its constructors build an instance of the class they are called on.
_VocabT = TypeVar("_VocabT", bound="Vocabulary")

SPECIALS: tuple[str, ...] = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
#: The specials a model never generates: padding, unknown and start; ``</s>`` only ends.
NEVER_GENERATED: tuple[int, ...] = (PAD_ID, UNK_ID, BOS_ID)
#: Specials a word of a tagger's or classifier's text never stands for (``literal_specials``
#: False): a word "<pad>" read as padding, or "</s>" as an end, is a word the model cannot
#: see. A literal "<unk>" is the unknown word either way (Penn Treebank text writes it).
NOT_TEXT = frozenset(SPECIALS) - {SPECIALS[UNK_ID]}
UNITS: tuple[str, ...] = ("char", "word")

_FORMAT = "rnnkit.vocab"
_VERSION = 1
# Characters per numpy chunk: bounds the transient UTF-32 copy to 16 MiB whatever the text size.
_CHUNK = 1 << 22


def _check_unit(unit: str) -> str:
    if unit not in UNITS:
        raise ConfigError(f"unit must be one of {UNITS}, got {unit!r}")
    return unit


def _code_points(text: str) -> np.ndarray:
    """Code points of ``text`` as a ``uint32`` array (a view on one UTF-32 encoding)."""
    # surrogatepass: a str may hold lone surrogates (e.g. from surrogateescape); never fail here.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def count_tokens(text: str, unit: str = "char") -> Counter[str]:
    """Count the tokens of ``text``: characters (numpy ``bincount`` over code points) or
    whitespace-separated words.

    Args:
        text: the corpus.
        unit: ``"char"`` or ``"word"``.

    >>> sorted(count_tokens("abca").items())
    [('a', 2), ('b', 1), ('c', 1)]
    >>> count_tokens("to be or not to be", unit="word")["be"]
    2
    """
    _check_unit(unit)
    if unit == "word":
        return Counter(text.split())
    counts = np.zeros(0, dtype=np.int64)
    for start in range(0, len(text), _CHUNK):
        chunk = np.bincount(_code_points(text[start : start + _CHUNK]))
        if len(chunk) > len(counts):
            chunk[: len(counts)] += counts
            counts = chunk
        else:
            counts[: len(chunk)] += chunk
    present = np.flatnonzero(counts)
    return Counter({chr(cp): int(counts[cp]) for cp in present})


class Vocabulary:
    """Token <-> id map with the four specials at ids 0-3.

    Args:
        tokens: the regular tokens in id order (they get ids 4, 5, ...); no specials, no
            duplicates; single characters for ``unit="char"``, whitespace-free strings for
            ``unit="word"``.
        unit: ``"char"`` (text is a sequence of characters, decoded by joining with ``""``)
            or ``"word"`` (text split on whitespace, decoded by joining with ``" "``).

    In word mode a literal special in the text (PTB writes ``<unk>``) encodes to its special
    id; with ``literal_specials=False`` (:meth:`encode_array`, :meth:`encode_with_unknown`,
    :meth:`text_id`: a tagger's and a classifier's words) ``<pad>``, ``<s>`` and ``</s>``
    are unknown words instead, and ``<unk>`` stays ``<unk>``. Build from data with
    :meth:`from_counts` or :meth:`from_text`.

    >>> vocab = Vocabulary.from_text("hello", unit="char")
    >>> vocab.itos
    ['<pad>', '<unk>', '<s>', '</s>', 'l', 'e', 'h', 'o']
    >>> vocab.encode("hole!")
    [6, 7, 4, 5, 1]
    >>> vocab.decode([2, 6, 5, 1, 3])
    'he'
    """

    pad_id = PAD_ID
    unk_id = UNK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    def __init__(self, tokens: Iterable[str], unit: str = "char") -> None:
        self.unit = _check_unit(unit)
        self.itos: list[str] = list(SPECIALS)
        self.stoi: dict[str, int] = {tok: i for i, tok in enumerate(SPECIALS)}
        for tok in tokens:
            if not isinstance(tok, str) or not tok:
                raise DataError(f"vocabulary token must be a non-empty string, got {tok!r}")
            if tok in self.stoi:
                what = "a special" if tok in SPECIALS else "a duplicate"
                raise DataError(f"vocabulary token {tok!r} is {what}")
            if unit == "char" and len(tok) != 1:
                raise DataError(f"char vocabulary token must be one character, got {tok!r}")
            if unit == "word" and tok.split() != [tok]:
                raise DataError(f"word vocabulary token must hold no whitespace, got {tok!r}")
            self.stoi[tok] = len(self.itos)
            self.itos.append(tok)
        self._table: np.ndarray | None = None  # code point -> id, built on first char encode

    @classmethod
    def from_counts(
        cls: type[_VocabT],
        counts: Mapping[str, int],
        unit: str = "char",
        min_freq: int = 1,
        max_size: int | None = None,
        *,
        max_vocab: int | None = None,
        source: str | PathLike[str] | None = None,
    ) -> _VocabT:
        """Keep tokens seen at least ``min_freq`` times, most frequent first.

        Args:
            counts: token -> count; counts of special strings are ignored.
            unit: ``"char"`` or ``"word"``.
            min_freq: smallest count kept (>= 1).
            max_size: largest ``len(vocab)``, the four specials included (>= 4); the least
                frequent tokens are dropped first.
            max_vocab: without ``max_size``, more tokens than this (default
                :data:`~rnnkit.data.limits.MAX_VOCAB`, 1,000,000) is a ``DataError``: a
                word vocabulary of random data would otherwise become an embedding
                and an output layer of millions of rows.
            source: the file the counts come from, for that error.

        >>> v = Vocabulary.from_counts({"a": 5, "b": 1, "c": 5}, min_freq=2)
        >>> v.itos[4:], len(v)
        (['a', 'c'], 6)
        >>> Vocabulary.from_counts({"a": 5, "b": 1}, min_freq=9, source="x.txt")
        Traceback (most recent call last):
        ...
        rnnkit.errors.DataError: x.txt: no token is seen at least 9 times (the most frequent, \
'a', 5 times): every token would be <unk>; lower --min-freq
        >>> Vocabulary.from_counts({"a": 5, "b": 1, "c": 5}, max_vocab=2, source="x.txt")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rnnkit.errors.DataError: x.txt: vocabulary of 3 distinct tokens ... limit of 2 tokens ...
        """
        _check_unit(unit)
        if min_freq < 1:
            raise ConfigError(f"min_freq must be >= 1, got {min_freq}")
        if max_size is not None and max_size < len(SPECIALS):
            raise ConfigError(f"max_size must be >= {len(SPECIALS)} (the specials), got {max_size}")
        kept = [(t, c) for t, c in counts.items() if c >= min_freq and t not in SPECIALS]
        real = {t: c for t, c in counts.items() if t not in SPECIALS}
        if not kept and real and min_freq > 1:
            # Every token would be <unk>: a model that learns nothing, trained without a word.
            top = max(real.items(), key=lambda tc: (tc[1], tc[0]))
            raise DataError(
                f"no token is seen at least {min_freq} times (the most frequent, {top[0]!r}, "
                f"{top[1]:,} times): every token would be <unk>; lower --min-freq",
                source,
            )
        limit = MAX_VOCAB.value(max_vocab)
        if max_size is None and len(kept) > limit:
            found = f"vocabulary of {len(kept):,} distinct tokens (seen at least {min_freq} times)"
            raise DataError(MAX_VOCAB.exceeded(found, limit) + "; or raise --min-freq", source)
        kept.sort(key=lambda tc: (-tc[1], tc[0]))
        if max_size is not None:
            kept = kept[: max_size - len(SPECIALS)]
        return cls([t for t, _ in kept], unit=unit)

    @classmethod
    def from_text(
        cls: type[_VocabT],
        text: str,
        unit: str = "char",
        min_freq: int = 1,
        max_size: int | None = None,
        *,
        max_vocab: int | None = None,
        source: str | PathLike[str] | None = None,
    ) -> _VocabT:
        """Build from the token counts of ``text`` (see :meth:`from_counts`).

        >>> Vocabulary.from_text("b a b", unit="word").itos[4:]
        ['b', 'a']
        """
        return cls.from_counts(
            count_tokens(text, unit), unit, min_freq, max_size, max_vocab=max_vocab, source=source
        )

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self.unit == other.unit and self.itos == other.itos

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container: not hashable

    def __repr__(self) -> str:
        return f"Vocabulary(unit={self.unit!r}, size={len(self)})"

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into this vocabulary's units (characters or words).

        >>> Vocabulary([], unit="word").tokenize(" a  b\\nc ")
        ['a', 'b', 'c']
        """
        return list(text) if self.unit == "char" else text.split()

    def text_id(self, token: str) -> int:
        """The id of a word of a text that holds no specials: ``<unk>`` for a token outside
        the vocabulary and for one spelled ``<pad>``, ``<s>`` or ``</s>`` (a word, never
        padding nor a sequence's start or end); a literal ``<unk>`` is ``<unk>``.

        >>> v = Vocabulary(["x"], unit="word")
        >>> [v.text_id(t) for t in ("x", "<pad>", "</s>", "<unk>", "y")]
        [4, 1, 1, 1, 1]
        """
        return UNK_ID if token in NOT_TEXT else self.stoi.get(token, UNK_ID)

    def encode_with_unknown(
        self, text: str, *, max_tokens: int | None = None, literal_specials: bool = True
    ) -> tuple[list[int], int]:
        """Encode ``text`` and count the tokens that fell back to ``<unk>``.

        Args:
            text: the text.
            max_tokens: encode (and count) only the first ``max_tokens`` tokens, those a
                model that cuts its input there reads; None: all of them.
            literal_specials: a word ``<pad>``, ``<s>`` or ``</s>`` is its special (True)
                or an unknown word, counted (False; :meth:`text_id`).

        Returns:
            ``(ids, n_unknown)``; a literal ``<unk>`` word in the text is not counted.

        >>> Vocabulary(["a"]).encode_with_unknown("abca")
        ([4, 1, 1, 4], 2)
        >>> Vocabulary(["a"]).encode_with_unknown("abca", max_tokens=2)
        ([4, 1], 1)
        >>> Vocabulary(["a"], unit="word").encode_with_unknown("a <pad>", literal_specials=False)
        ([4, 1], 1)
        """
        stoi = self.stoi
        tokens = self.tokenize(text)
        if max_tokens is not None:
            tokens = tokens[:max_tokens]
        if literal_specials:
            ids = [stoi.get(tok, -1) for tok in tokens]
        else:
            ids = [-1 if tok in NOT_TEXT else stoi.get(tok, -1) for tok in tokens]
        n_unknown = ids.count(-1)
        if n_unknown:
            ids = [UNK_ID if i < 0 else i for i in ids]
        return ids, n_unknown

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; unknown tokens become ``<unk>`` (id 1).

        >>> Vocabulary(["x", "y"], unit="word").encode("y x z")
        [5, 4, 1]
        """
        stoi = self.stoi
        return [stoi.get(tok, UNK_ID) for tok in self.tokenize(text)]

    def encode_array(
        self, text: str, dtype: type = np.int32, *, literal_specials: bool = True
    ) -> np.ndarray:
        """Token ids of ``text`` as a 1-D numpy array, built without per-character objects.

        Args:
            text: the text (any size: characters are mapped in bounded chunks through a
                code point lookup table).
            dtype: integer dtype of the result (``int32`` takes 4 bytes per token).
            literal_specials: a word ``<pad>``, ``<s>`` or ``</s>`` is its special (True)
                or an unknown word (False; :meth:`text_id`). A character is never one.

        Returns:
            ``(N,)`` array of ids, ``N`` the number of characters or words.

        >>> Vocabulary(["a", "b"]).encode_array("abc")
        array([4, 5, 1], dtype=int32)
        """
        if self.unit == "word":
            if not literal_specials:
                return np.fromiter(map(self.text_id, text.split()), dtype=dtype)
            stoi = self.stoi
            return np.fromiter((stoi.get(w, UNK_ID) for w in text.split()), dtype=dtype)
        return self._encode_chars(text, dtype=dtype)

    def _encode_chars(
        self, text: str, dtype: type = np.int32, newline_id: int | None = None
    ) -> np.ndarray:
        """Char-unit ids through the lookup table; ``newline_id`` overrides ``"\\n"``."""
        table = self._char_table()
        if newline_id is not None:
            table = table.copy()
            table[ord("\n")] = newline_id
        last = len(table) - 1  # every code point past the table maps to this <unk> slot
        out: np.ndarray = np.empty(len(text), dtype=dtype)
        for start in range(0, len(text), _CHUNK):
            cps = _code_points(text[start : start + _CHUNK])
            out[start : start + len(cps)] = table[np.minimum(cps, last)]
        return out

    def _char_table(self) -> np.ndarray:
        if self._table is None:
            cps = np.array([ord(t) for t in self.itos[len(SPECIALS) :]], dtype=np.int64)
            # Dense table (<= 4.4 MB even with astral characters), one slot past the largest
            # code point for <unk>; always covers "\n" so a newline override has a slot.
            size = max(int(cps.max(initial=0)), ord("\n")) + 2
            table = np.full(size, UNK_ID, dtype=np.int32)
            table[cps] = np.arange(len(SPECIALS), len(self.itos), dtype=np.int32)
            self._table = table
        return self._table

    def decode(self, ids: Iterable[int], skip_specials: bool = True) -> str:
        """Text of ``ids``: characters joined with ``""``, words with ``" "``.

        Args:
            ids: token ids (a list, numpy array or 1-D tensor).
            skip_specials: drop ``<pad> <unk> <s> </s>`` (default) or keep their strings.

        >>> v = Vocabulary(["a", "b"], unit="word")
        >>> v.decode([2, 4, 1, 5, 3]), v.decode([4, 1], skip_specials=False)
        ('a b', 'a <unk>')
        """
        itos = self.itos
        size = len(itos)
        array = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids)
        if array.size and array.dtype.kind not in "iu":
            # int() took 1.5 as id 1 (<unk>, dropped: ''), "ab" failed inside int()
            raise DataError(f"token ids must be integers, got dtype {array.dtype}")
        tokens = []
        for raw in array.reshape(-1).tolist():
            i = int(raw)
            if not 0 <= i < size:
                raise DataError(f"token id {i} out of range for a vocabulary of {size}")
            if skip_specials and i < len(SPECIALS):
                continue
            tokens.append(itos[i])
        return ("" if self.unit == "char" else " ").join(tokens)

    def to_json(self) -> str:
        """JSON text of the vocabulary (all tokens in id order, specials first).

        >>> Vocabulary.from_json(Vocabulary(["a"]).to_json()) == Vocabulary(["a"])
        True
        """
        doc = {"format": _FORMAT, "version": _VERSION, "unit": self.unit, "tokens": self.itos}
        return json.dumps(doc, ensure_ascii=False, indent=0)

    @classmethod
    def from_json(
        cls: type[_VocabT], text: str, path: str | PathLike[str] | None = None
    ) -> _VocabT:
        """Parse :meth:`to_json` output; anything malformed is a ``DataError`` naming ``path``.

        >>> Vocabulary.from_json('{"unit": "char", "tokens": []}')
        Traceback (most recent call last):
        ...
        rnnkit.errors.DataError: vocabulary JSON: "tokens" must start with the specials \
['<pad>', '<unk>', '<s>', '</s>']
        """
        try:
            doc = loads_json(text, path)
        except DataError as exc:
            raise DataError(f"vocabulary JSON: {exc.message}", path, exc.line) from None
        if not isinstance(doc, dict):
            raise DataError("vocabulary JSON: expected an object", path)
        if doc.get("format", _FORMAT) != _FORMAT:
            raise DataError(
                f"vocabulary JSON: format is {doc.get('format')!r}, not {_FORMAT}", path
            )
        if doc.get("version", _VERSION) != _VERSION:
            raise DataError(f"vocabulary JSON: unsupported version {doc.get('version')!r}", path)
        unit, tokens = doc.get("unit"), doc.get("tokens")
        if unit not in UNITS:
            raise DataError(f"vocabulary JSON: unit must be one of {UNITS}, got {unit!r}", path)
        if not isinstance(tokens, list):
            raise DataError('vocabulary JSON: "tokens" must be a list of strings', path)
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise DataError(
                f'vocabulary JSON: "tokens" must start with the specials {list(SPECIALS)}', path
            )
        try:
            return cls(tokens[len(SPECIALS) :], unit=unit)
        except DataError as exc:
            raise DataError(f"vocabulary JSON: {exc.message}", path) from None

    def save(self, path: str | PathLike[str]) -> None:
        """Write the JSON atomically: a temporary file in the same folder, then ``os.replace``,
        so a crash never leaves a half-written vocabulary behind.

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = pathlib.Path(d) / "vocab.json"
        ...     Vocabulary(["a"]).save(p)
        ...     Vocabulary.load(p).itos[4:]
        ['a']
        """
        atomic_write_bytes(path, (self.to_json() + "\n").encode("utf-8"))

    @classmethod
    def load(cls: type[_VocabT], path: str | PathLike[str]) -> _VocabT:
        """Read a vocabulary written by :meth:`save`.

        Raises:
            DataError: file missing, unreadable, not UTF-8, or not a valid vocabulary.
        """
        return cls.from_json(decode_utf8(read_run_file(path), path), path)
