"""Operations per decoding step: rnnkit's greedy and beam decoding against the plain loop.

On a GPU a decoding step of a small model is bound by kernel launches (one per ATen
operation) and by the host syncs (reads of device values, copies of host data to the
device: each waits for the device). Counted on the CPU with ``tests/generation/op_counts.py``
at the sizes of ``bench_tasks.py``'s ``seq2seq-greedy`` / ``seq2seq-beam`` (512 sources in
batches of 64, V 40, E 64, H 128, max length 32, K 5, the model after 300 training steps
on string reversal): per step (a ``step`` call; encoding and setup left out), the
operations inside the model's step and in the search around it, by kind (products; gate,
attention and output math; the choice of tokens; bookkeeping), and host syncs.

Contenders: ``rnnkit`` (``Seq2Seq.decode``: the compiled library's inference step, on the
CPU), ``rnnkit torch`` (with the compiled library off: the inference step of torch
operations, ``TorchInferenceStep``, what decoding runs on a GPU), ``rnnkit general`` (the
model's general ``step``, what a GPU ran before) and ``torch.nn`` (the plain
``nn.LSTMCell`` loop of ``bench_tasks.py``). On the CPU the last three compute the LSTM
cell's gate math in elementwise operations (torch's ten, ``TorchInferenceStep``'s eight),
on a GPU in torch's one fused kernel. ``kernels`` leaves out the views (``view``, ``t``,
``select``...) and allocations (``empty``), which launch nothing on a GPU, and the host
reads; ``GPU kernels`` counts each cell's gate math as the one fused kernel a GPU runs.

    python benchmarks/bench_decode_ops.py            # the table
    python benchmarks/bench_decode_ops.py --names    # and the op names of each
    python benchmarks/bench_decode_ops.py --time     # and the CPU time (one thread)
    python benchmarks/bench_decode_ops.py --cell gru # a GRU decoder (untrained; no torch.nn)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "generation"))
sys.path.insert(0, str(HERE.parent / "tests"))  # op_counts reads host_syncs there
import bench_tasks  # noqa: E402
from op_counts import OpCounts, fused_on_gpu, kind, launches  # noqa: E402

from rnnkit.bptt.native import use_native  # noqa: E402
from rnnkit.models.seq2seq import Seq2Seq, build_seq2seq  # noqa: E402
from rnnkit.models.seq2seq_inference import InferenceStep  # noqa: E402
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep  # noqa: E402
from rnnkit.models.spec import ModelSpec  # noqa: E402


def _general_only() -> contextlib.AbstractContextManager[object]:
    """The model's general step forced: neither inference step applies."""
    return mock.patch.object(TorchInferenceStep, "build", classmethod(lambda cls, m: None))


def _count(
    runs: list[Callable[[], object]], native: bool, general: bool, *owners: object
) -> dict[str, object]:
    """Per-step figures over several decodings (each counted from its first step)."""
    names: collections.Counter[str] = collections.Counter()
    syncs: collections.Counter[str] = collections.Counter()
    steps = in_step = 0
    for run in runs:
        forced = _general_only() if general else contextlib.nullcontext()
        with use_native(native), forced, OpCounts(*owners) as counts:
            run()
        names += counts.by_name()
        syncs += counts.sync_names()
        steps += counts.steps
        in_step += counts.in_step
    total = sum(names.values())
    kinds: collections.Counter[str] = collections.Counter()
    for name, n in names.items():
        kinds[kind(name)] += n
    kernels = sum(n for name, n in names.items() if launches(name))
    return {
        "steps": steps,
        "ops": total / steps,
        "kernels": kernels / steps,
        "gpu kernels": (kernels - fused_on_gpu(names)) / steps,
        "model": in_step / steps,
        "search": (total - in_step) / steps,
        "kinds": {k: kinds[k] / steps for k in ("product", "math", "choice", "bookkeeping")},
        "syncs": sum(syncs.values()) / steps,
        "names": {k: v / steps for k, v in names.most_common()},
        "sync_names": {k: v / steps for k, v in syncs.most_common()},
    }


def _seconds(runs: list[Callable[[], object]], native: bool, general: bool, repeats: int) -> float:
    """The fastest of ``repeats`` passes over ``runs`` (seconds), uncounted."""
    best = float("inf")
    for _ in range(repeats):
        forced = _general_only() if general else contextlib.nullcontext()
        with use_native(native), forced, torch.no_grad():
            start = time.perf_counter()
            for run in runs:
                run()
            best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", action="store_true", help="the op names of each contender")
    p.add_argument(
        "--decode-train",
        type=int,
        default=bench_tasks.DECODE_TRAIN["steps"],
        help="training steps of the model before counting (as bench_tasks.py)",
    )
    p.add_argument(
        "--time",
        action="store_true",
        help="also each contender's CPU time per decoding of all sources (one thread)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed passes (the fastest counts)")
    p.add_argument(
        "--cell",
        choices=("lstm", "gru", "rnn"),
        default="lstm",
        help="the decoder's cell: gru or rnn build an untrained model of the same sizes "
        "(no torch.nn contender)",
    )
    args = p.parse_args(argv)
    bench_tasks.DECODE_TRAIN["steps"] = args.decode_train
    if args.time:
        torch.set_num_threads(1)
    torch.manual_seed(0)
    V, E, H, B, N, K, max_length = 40, 64, 128, 64, 512, 5, 32
    ref = None
    if args.cell == "lstm":
        model, ref = bench_tasks._decoding_models(V, E, H)
    else:
        spec = ModelSpec(hidden=H, embedding=E, attention="additive", cell=args.cell)
        model = build_seq2seq(spec, V, V).eval()
    gen = torch.Generator().manual_seed(0)
    batches = [bench_tasks._pairs(gen, V, B)[:2] for _ in range(N // B)]
    timed = " ms / decoding |" if args.time else ""
    print(
        "| search | contender | steps | ops / step | in the step | search | products | "
        "math | choice | bookkeeping | kernels / step | GPU kernels / step | host syncs / step |"
        + timed
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.time else ""))
    tables = []
    for search, beam in (("greedy", 1), ("beam 5", K)):
        decodings: list[Callable[[], object]] = [
            partial(model.decode, s, m, beam=beam, max_length=max_length) for s, m in batches
        ]
        steppers: tuple[object, ...] = (InferenceStep, TorchInferenceStep, Seq2Seq)
        contenders: dict[str, tuple[list[Callable[[], object]], bool, bool, tuple[object, ...]]] = {
            "rnnkit": (decodings, True, False, steppers),
            "rnnkit torch": (decodings, False, False, steppers),
            "rnnkit general": (decodings, False, True, steppers),
        }
        if ref is not None:
            contenders["torch.nn"] = (
                [
                    partial(ref.greedy, s, m, max_length)
                    if beam == 1
                    else partial(ref.beam, s, m, K, max_length)
                    for s, m in batches
                ],
                True,
                False,
                (ref,),
            )
        for name, (runs, native, general, owners) in contenders.items():
            with torch.no_grad():
                r = _count(runs, native, general, *owners)
            tables.append((search, name, r))
            k = r["kinds"]
            assert isinstance(k, dict)
            ms = ""
            if args.time:
                ms = f" {1000 * _seconds(runs, native, general, args.repeats):.0f} |"
            print(
                f"| {search} | {name} | {r['steps']} | {r['ops']:.1f} | {r['model']:.1f} | "
                f"{r['search']:.1f} | {k['product']:.1f} | {k['math']:.1f} | {k['choice']:.1f} | "
                f"{k['bookkeeping']:.1f} | {r['kernels']:.1f} | {r['gpu kernels']:.1f} | "
                f"{r['syncs']:.2f} |{ms}",
                flush=True,
            )
    if args.names:
        for search, name, r in tables:
            names = r["names"]
            syncs = r["sync_names"]
            assert isinstance(names, dict) and isinstance(syncs, dict)
            print(f"\n{search}, {name}:")
            for op, n in names.items():
                print(f"  {n:7.2f}  {op}  ({kind(op)})")
            for op, n in syncs.items():
                print(f"  {n:7.2f}  sync: {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
