"""One model per log key: the sessions' parameter vectors gathered per key
(:func:`read_items`, ``collect``), which of a key's values are modelled and how they are
normalised (:class:`KeyModel`), the key's sequences for its regressor, and the
regressor's error on each vector (:func:`vector_errors`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from rnnkit.anomaly.thresholds import (
    GaussianFit,
)
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import to_device
from rnnkit.data.events import Session, iter_sessions
from rnnkit.data.vectors import VectorSequence
from rnnkit.errors import DataError
from rnnkit.models.regressor import Regressor

__all__ = [
    "KEYS_FORMAT",
    "MIN_ERROR_STD",
    "MIN_TRAIN_VECTORS",
    "MIN_VALID_VECTORS",
    "KeyModel",
    "read_items",
    "vector_errors",
]


#: Fewest training vectors a key is modelled from.
MIN_TRAIN_VECTORS = 10


#: Fewest validation vectors a key's error Gaussian is fitted to.
MIN_VALID_VECTORS = 5


#: Smallest standard deviation of a key's errors (normalised units squared): a key whose
#: errors are all alike would otherwise flag the smallest change.
MIN_ERROR_STD = 0.01


KEYS_FORMAT = "rnnkit.params_keys"


def read_items(path: str) -> list[tuple[Session, str, int]]:
    with open(path, "rb") as fileobj:
        items = [(s, path, line) for line, s in iter_sessions(fileobj, path)]
    if not items:
        raise DataError("no sessions (the file is empty)", path)
    return items


@dataclass
class KeyModel:
    """One key's model: which values it reads, how they are normalised, its errors.

    Attributes:
        key: the event (log template).
        width: how many values the key's events carry.
        dims: the positions modelled (numbers in every training vector).
        mean, scale: per modelled dim, the normalisation ``(x − mean) / scale``.
        error: the Gaussian of the validation errors.
        directory: the key's ``regress`` run, relative to the run directory.
        model: the loaded regressor (None until loaded).
    """

    key: str
    width: int
    dims: list[int]
    mean: np.ndarray
    scale: np.ndarray
    error: GaussianFit
    directory: str
    train_vectors: int = 0
    valid_vectors: int = 0
    model: Regressor | None = None

    def bound(self, z: float) -> float:
        """The error above which a vector is anomalous: ``μ + z σ``."""
        return self.error.mean + z * self.error.std

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "width": self.width,
            "dims": self.dims,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "error": {"mean": self.error.mean, "std": self.error.std, "n": self.error.n},
            "dir": self.directory,
            "train_vectors": self.train_vectors,
            "valid_vectors": self.valid_vectors,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KeyModel:
        error = doc["error"]
        key = cls(
            key=str(doc["key"]),
            width=int(doc["width"]),
            dims=[int(d) for d in doc["dims"]],
            mean=np.asarray(doc["mean"], dtype=np.float64),
            scale=np.asarray(doc["scale"], dtype=np.float64),
            error=GaussianFit(float(error["mean"]), float(error["std"]), int(error["n"])),
            directory=str(doc["dir"]),
            train_vectors=int(doc.get("train_vectors", 0)),
            valid_vectors=int(doc.get("valid_vectors", 0)),
        )
        ok = (
            key.dims
            and len(key.mean) == len(key.scale) == len(key.dims)
            and all(0 <= d < key.width for d in key.dims)
            and np.isfinite(key.mean).all()
            and (key.scale > 0).all()
            and math.isfinite(key.error.mean)
            and key.error.std > 0
            and ".." not in Path(key.directory).parts
            and not Path(key.directory).is_absolute()
        )
        if not ok:
            raise ValueError(f"key {key.key!r} is not valid")
        return key

    def normalise(self, vectors: np.ndarray) -> tuple[np.ndarray, int]:
        """``(normalised (n, |dims|) float32, missing values filled)`` of raw ``(n, width)``
        vectors (NaN = missing: filled with the training mean, i.e. 0)."""
        x = (vectors[:, self.dims] - self.mean) / self.scale
        missing = np.isnan(x)
        with np.errstate(over="ignore"):  # beyond float32: inf, which scoring flags
            return np.where(missing, 0.0, x).astype(np.float32), int(missing.sum())


def as_matrix(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """Parameter vectors as a float64 matrix, ``None`` as NaN."""
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


@dataclass
class Occurrences:
    """One key's vectors in the sessions of one file: per session, its rows in order."""

    rows: list[list[list[float | None]]]
    where: list[tuple[str, int]]  # (path, line) of each session

    def count(self) -> int:
        return sum(len(r) for r in self.rows)


def collect(
    items: Iterable[tuple[Session, str, int]], widths: dict[str, int] | None = None
) -> dict[str, Occurrences]:
    """Per key, its vectors per session; widths checked (one line naming file:line)."""
    out: dict[str, Occurrences] = {}
    seen_width: dict[str, tuple[int, str, int]] = {}
    for session, path, line in items:
        if session.params is None:
            raise DataError(
                f'session {session.session!r} has no "params" (write the sessions with '
                "rnnkit sessions --from log --params)",
                path,
                line,
            )
        per_key: dict[str, list[list[float | None]]] = {}
        for index, (event, values) in enumerate(zip(session.events, session.params, strict=True)):
            want = widths.get(event) if widths is not None else None
            if widths is None:
                first = seen_width.setdefault(event, (len(values), path, line))
                want = first[0]
            if want is not None and len(values) != want:
                raise DataError(
                    f"session {session.session!r}: params[{index}] has {len(values)} values; "
                    f"the event {event!r} had {want} "
                    + ("in training" if widths is not None else f"at {first[1]}:{first[2]}"),
                    path,
                    line,
                )
            per_key.setdefault(event, []).append(values)
        for event, rows in per_key.items():
            occ = out.setdefault(event, Occurrences([], []))
            occ.rows.append(rows)
            occ.where.append((path, line))
    return out


def key_sequences(key: KeyModel, occ: Occurrences) -> list[VectorSequence]:
    """The regressor's sequences of one key: a zero start step, then its vectors."""
    seqs = []
    for rows, (path, line) in zip(occ.rows, occ.where, strict=True):
        x, _ = key.normalise(as_matrix(rows))
        values = np.concatenate([np.zeros((1, x.shape[1]), np.float32), x])
        seqs.append(VectorSequence(values, None, path, line))
    return seqs


def check_validation_values(key: KeyModel, occ: Occurrences) -> None:
    """A validation value that, normalised with the training statistics, is beyond
    float32's range is one :class:`DataError` naming its session's file:line, the event
    and the value. Without this check it became ``inf`` in the model, the validation loss
    NaN, and training stopped with advice about the learning rate.

    >>> key = KeyModel("k", 1, [0], np.zeros(1), np.ones(1), GaussianFit(0.0, 1.0, 0), "d", 9)
    >>> check_validation_values(key, Occurrences([[[1.0], [1e300]]], [("v.jsonl", 4)]))
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: v.jsonl:4: validation value 1e+300 (occurrence 2 of the event \
'k' in this session, value 0) is beyond float32's range once normalised with the training \
statistics (mean 0, scale 1): validation sessions are normal ones; remove or rescale it
    """
    for rows, (path, line) in zip(occ.rows, occ.where, strict=True):
        raw = as_matrix(rows)[:, key.dims]
        with np.errstate(over="ignore", invalid="ignore"):
            x = ((raw - key.mean) / key.scale).astype(np.float32)
        bad = np.argwhere(np.isinf(x))
        if len(bad):
            i, d = (int(v) for v in bad[0])
            raise DataError(
                f"validation value {raw[i, d]:g} (occurrence {i + 1} of the event {key.key!r} "
                f"in this session, value {key.dims[d]}) is beyond float32's range once "
                f"normalised with the training statistics (mean {key.mean[d]:.3g}, scale "
                f"{key.scale[d]:.3g}): validation sessions are normal ones; remove or rescale it",
                path,
                line,
            )


def fit_key(
    key: str, width: int, train_occ: Occurrences, directory: str
) -> tuple[KeyModel | None, str]:
    """The dims and normalisation of a key from its training vectors (no model yet), or
    None and why it is not modelled."""
    n = train_occ.count()
    if n < MIN_TRAIN_VECTORS:
        return None, f"{n} training vector(s), fewer than {MIN_TRAIN_VECTORS}"
    matrix = as_matrix([row for rows in train_occ.rows for row in rows]).reshape(n, width)
    dims = [d for d in range(width) if not np.isnan(matrix[:, d]).any()]
    if not dims:
        return None, "no value that is a number in every training vector"
    mean, std = _mean_std(matrix[:, dims])
    constant = std <= 1e-12 * np.maximum(np.abs(mean), 1.0)
    scale = np.where(constant, np.maximum(np.abs(mean), 1.0), std)
    placeholder = GaussianFit(0.0, 1.0, 0)
    return KeyModel(key, width, dims, mean, scale, placeholder, directory, n), ""


def _mean_std(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``(n, D)`` values, the mean and standard deviation; where they overflow
    (squares of values beyond 1e154: ``s`` was inf, and the run's ``keys.json``
    unreadable), taken in units of the column's largest magnitude ``b``:
    ``m = b · mean(x / b)``, ``s = b · std(x / b)``.

    >>> _mean_std(np.array([[1e300], [-1e300]]))
    (array([0.]), array([1.e+300]))
    """
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = values.mean(axis=0), values.std(axis=0)
    if np.isfinite(mean).all() and np.isfinite(std).all():
        return mean, std
    big = np.abs(values).max(axis=0)
    big = np.where(big > 0, big, 1.0)
    unit = values / big
    return unit.mean(axis=0) * big, unit.std(axis=0) * big


@torch.no_grad()
def vector_errors(
    model: Regressor, seqs: Sequence[VectorSequence], batch_size: int = 64
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per sequence ``[0, v_1 … v_n]``: the error ``mean_d (v̂_i − v_i)²`` of each ``v_i``
    ``(n,)`` and the predictions ``(n, D)``, the state carried over the whole sequence."""
    model.eval()
    device = next(model.parameters()).device
    errors: list[np.ndarray] = [np.zeros(0)] * len(seqs)
    preds: list[np.ndarray] = [np.zeros((0, 0))] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].values))
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        xs = [torch.from_numpy(seqs[i].values) for i in idx]
        x = to_device(pad_sequence(xs, batch_first=True), device)
        # the mask made on the host and moved with its host copy: the loop's questions
        # of it (lengths, prefix form) then read nothing back from the device
        lengths = torch.tensor([len(v) for v in xs])
        mask = move_mask(torch.arange(x.shape[1])[None, :] < lengths[:, None], device)
        mean = model(x, mask).mean.double().cpu().numpy()  # (B, T, D)
        for row, i in enumerate(idx):
            n = len(seqs[i].values)
            pred, target = mean[row, : n - 1], seqs[i].values[1:n].astype(np.float64)
            preds[i] = pred
            errors[i] = ((pred - target) ** 2).mean(axis=1)
    return errors, preds
