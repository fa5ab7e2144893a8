"""Resumable snapshots of a :class:`~rnnkit.training.loop.Trainer`: what goes into one,
and how a run continues from it.

A snapshot (written by :func:`~rnnkit.training.checkpoint.save_snapshot`, atomically)
holds the model, the optimizer, the learning-rate schedules, the best validation so far,
the loss of the last gain and the validations since, the clipping and float16-overflow
counts, the GradScaler, the torch RNG, the data position and the carried recurrent state,
so that N steps, a resume and M steps train exactly as N + M steps would.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rnnkit.errors import CheckpointError, RnnkitError
from rnnkit.training.checkpoint import load_snapshot, save_model_weights, save_snapshot
from rnnkit.training.options import given
from rnnkit.types import LSTMState

if TYPE_CHECKING:
    from rnnkit.training.loop import Trainer

__all__ = []


def carry_tensors(carry: Any) -> dict[str, Tensor]:
    """The carried recurrent state as named tensors of a snapshot.

    >>> sorted(carry_tensors(LSTMState(torch.zeros(1), torch.ones(1))))
    ['carry/c', 'carry/h']
    """
    if carry is None:
        return {}
    if isinstance(carry, LSTMState):
        return {"carry/h": carry.h, "carry/c": carry.c}
    return {"carry/state": carry}


def carry_from(tensors: dict[str, Tensor], device: torch.device) -> Any:
    """The carried state back from a snapshot's tensors (None when it holds none)."""
    if "carry/h" in tensors:
        return LSTMState(tensors["carry/h"].to(device), tensors["carry/c"].to(device))
    if "carry/state" in tensors:
        return tensors["carry/state"].to(device)
    return None


def _state(trainer: Trainer) -> dict[str, Any]:
    guard = trainer.guard
    return {
        "batches": trainer.batches.state_dict(),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "plateau": trainer.plateau.state_dict() if trainer.plateau is not None else None,
        "best": trainer.best,
        "bad_evals": trainer.bad_evals,
        "gain_loss": trainer.gain_loss,
        "clipped": trainer.clipped,
        "precision": trainer.options.precision,
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "scaler_skips": guard.scaler_skips,
        "scaler_streak": guard.scaler_streak,
    }


def save_trainer(trainer: Trainer) -> None:
    """Write a resumable snapshot of the trainer's current step (rank 0 writes; with
    several processes every rank must call this: the carried state is gathered first)."""
    out_dir = trainer.out_dir
    if out_dir is None:
        return
    carry = carry_tensors(trainer.carry)
    dist = trainer.dist
    if dist.enabled:  # the snapshot holds the GLOBAL batch's carried state
        carry = {k: dist.gather_rows(v, dim=2) for k, v in carry.items()}
    if not dist.is_main:
        return
    extra = {**_rng_states(trainer._device), **carry}
    save_snapshot(out_dir, trainer.step, trainer.model, trainer.optimizer, _state(trainer), extra)
    if trainer.evaluate_fn is None:  # no validation: the latest weights are the ones to use
        save_model_weights(trainer.model, out_dir / "model.safetensors")
    if trainer.run_log.csv_due():
        trainer.run_log.write_csv()


def _rng_states(device: torch.device | None = None) -> dict[str, Tensor]:
    """The random generators a training step draws from: the CPU's, and each CUDA
    device's where CUDA is in use (dropout on a GPU draws from the device's generator, so
    an exact resume needs it too). ``device``: the one this process trains on; its own
    generator is kept apart (``rng/cuda_own``): under torchrun only rank 0 writes, and
    in rank 0's process the other ranks' GPUs' generators were never drawn from."""
    states = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["rng/cuda"] = torch.stack(torch.cuda.get_rng_state_all())  # (devices, n)
        if device is not None and device.type == "cuda":
            states["rng/cuda_own"] = torch.cuda.get_rng_state(device)
    return states


def _restore_rng(extra: dict[str, Tensor], device: torch.device | None = None) -> None:
    if "rng/torch" in extra:
        torch.set_rng_state(extra["rng/torch"])
    if "rng/cuda" in extra and torch.cuda.is_available():
        # A machine with fewer devices restores those it has (a run resumed elsewhere
        # still resumes; exactly so where the devices match).
        saved = list(extra["rng/cuda"])[: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(saved)
        # The generator the writing process trained with goes to the device THIS process
        # trains on (rank r: cuda:r). Every rank sets the same seed and draws the same
        # shapes, so rank 0's is every rank's. (Snapshots before this key: rank 0 was
        # cuda:0.)
        if device is not None and device.type == "cuda":
            own = extra.get("rng/cuda_own", extra["rng/cuda"][0])
            torch.cuda.set_rng_state(own, device)


def resume_trainer(trainer: Trainer) -> None:
    """Restore model, optimizer, scheduler, RNG, data position and carried state from the
    snapshot in the trainer's run directory; a snapshot that does not fit is one
    :class:`~rnnkit.errors.CheckpointError` naming the directory."""
    out_dir = trainer.out_dir
    if out_dir is None:
        raise RnnkitError("resume needs an output directory")
    state, extra = load_snapshot(out_dir, trainer.model, trainer.optimizer)
    try:
        _restore(trainer, state, extra)
    except RnnkitError as exc:
        if str(out_dir) in str(exc):
            raise
        raise CheckpointError(f"{out_dir}: the snapshot's state: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
        # A state.json whose checksums match but whose content was forged: one line.
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise CheckpointError(
            f"{out_dir}: the snapshot's state.json does not fit this run "
            f"({type(exc).__name__}: {detail})"
        ) from None


def _load_plateau(plateau: torch.optim.lr_scheduler.ReduceLROnPlateau, saved: Any) -> None:
    """The plateau schedule's state back. Its worst value (``mode_worse``), and its best
    one until a first validation, are ±inf, which the snapshot's strict JSON writes as
    null: they are the schedule's worst value again (without it, a run snapshotted before
    its first validation failed at the next one after a resume)."""
    plateau.load_state_dict(saved)
    worse = math.inf if plateau.mode == "min" else -math.inf
    if plateau.mode_worse is None:
        plateau.mode_worse = worse
    if plateau.best is None:
        plateau.best = worse


def _restore(trainer: Trainer, state: dict[str, Any], extra: dict[str, Tensor]) -> None:
    saved_precision = state.get("precision", "fp32")  # snapshots before --precision
    if saved_precision != trainer.options.precision:
        options = trainer.options  # named as the user gave them: --precision or precision=
        now = options.precision if options.command_line else repr(options.precision)
        raise CheckpointError(
            f"{trainer.out_dir}: the snapshot was trained with "
            f"{given(options.argument('precision'), saved_precision)}, not {now}"
        )
    trainer.step = int(state["step"])
    trainer.batches.load_state_dict(state["batches"])
    if trainer.scheduler is not None and state.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.plateau is not None and state.get("plateau") is not None:
        _load_plateau(trainer.plateau, state["plateau"])
    trainer.best = state.get("best")
    trainer.bad_evals = int(state.get("bad_evals", 0))
    # a snapshot from before min_gain: every improvement was a gain, the last the best
    gain_loss = state.get("gain_loss", (trainer.best or {}).get("loss_nats"))
    trainer.gain_loss = float(gain_loss) if gain_loss is not None else None
    trainer.clipped = int(state.get("clipped", 0))
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    trainer.guard.scaler_skips = int(state.get("scaler_skips", 0))
    trainer.guard.scaler_streak = int(state.get("scaler_streak", 0))
    _restore_rng(extra, trainer._device)
    dist = trainer.dist
    if dist.enabled:  # this process's rows of the global carried state
        extra = {
            k: v if not k.startswith("carry/") else dist.rows(v, dim=2) for k, v in extra.items()
        }
    trainer.carry = carry_from(extra, trainer._device)
