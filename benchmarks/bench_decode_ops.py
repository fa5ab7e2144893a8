"""Operations per decoding step: rnnkit's greedy and beam decoding against the plain loop.

On a GPU a decoding step of a small model is bound by kernel launches (one per ATen
operation) and by the host syncs (reads of device values, copies of host data to the
device: each waits for the device). Counted on the CPU with ``tests/generation/op_counts.py``
at the sizes of ``bench_tasks.py``'s ``seq2seq-greedy`` / ``seq2seq-beam`` (512 sources in
batches of 64, V 40, E 64, H 128, max length 32, K 5, the model after 300 training steps
on string reversal): per step (a ``step`` call; encoding and setup left out), the
operations inside the model's step and in the search around it, by kind (products; gate,
attention and output math; the choice of tokens; bookkeeping), and host syncs.

Contenders: ``rnnkit`` (``Seq2Seq.decode``: the inference step, on the CPU), ``rnnkit
general`` (the model's general ``step`` with the compiled library off: what decoding runs
on a GPU) and ``torch.nn`` (the plain ``nn.LSTMCell`` loop of ``bench_tasks.py``; on the
CPU both of the last two compute the LSTM cell in torch's dozen operations, on a GPU in
its fused kernel). ``kernels`` leaves out the views (``view``, ``t``, ``select``...) and
allocations (``empty``), which launch nothing on a GPU, and the host reads.

    python benchmarks/bench_decode_ops.py            # the table
    python benchmarks/bench_decode_ops.py --names    # and the op names of each
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "generation"))
sys.path.insert(0, str(HERE.parent / "tests"))  # op_counts reads host_syncs there
import bench_tasks  # noqa: E402
from op_counts import OpCounts, kind  # noqa: E402

from rnnkit.bptt.native import use_native  # noqa: E402
from rnnkit.models.seq2seq import Seq2Seq  # noqa: E402
from rnnkit.models.seq2seq_inference import InferenceStep  # noqa: E402


def _count(runs: list[Callable[[], object]], native: bool, *owners: object) -> dict[str, object]:
    """Per-step figures over several decodings (each counted from its first step)."""
    names: collections.Counter[str] = collections.Counter()
    syncs: collections.Counter[str] = collections.Counter()
    steps = in_step = 0
    for run in runs:
        with use_native(native), OpCounts(*owners) as counts:
            run()
        names += counts.by_name()
        syncs += counts.sync_names()
        steps += counts.steps
        in_step += counts.in_step
    total = sum(names.values())
    kinds: collections.Counter[str] = collections.Counter()
    for name, n in names.items():
        kinds[kind(name)] += n
    launches = sum(n for name, n in names.items() if _launches(name))
    return {
        "steps": steps,
        "ops": total / steps,
        "kernels": launches / steps,
        "model": in_step / steps,
        "search": (total - in_step) / steps,
        "kinds": {k: kinds[k] / steps for k in ("product", "math", "choice", "bookkeeping")},
        "syncs": sum(syncs.values()) / steps,
        "names": {k: v / steps for k, v in names.most_common()},
        "sync_names": {k: v / steps for k, v in syncs.most_common()},
    }


# Operations that launch nothing on a GPU: views, allocations, and the host reads
# (counted apart).
NO_LAUNCH = frozenset(
    {
        "empty",
        "new_empty",
        "empty_like",
        "view",
        "_unsafe_view",
        "t",
        "select",
        "slice",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "expand",
        "unsafe_split",
        "split",
        "unbind",
        "alias",
        "_local_scalar_dense",
        "lift_fresh",
        "scalar_tensor",
    }
)


def _launches(name: str) -> bool:
    return name.split("[")[0].rsplit(".", 1)[-1] not in NO_LAUNCH


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", action="store_true", help="the op names of each contender")
    p.add_argument(
        "--decode-train",
        type=int,
        default=bench_tasks.DECODE_TRAIN["steps"],
        help="training steps of the model before counting (as bench_tasks.py)",
    )
    args = p.parse_args(argv)
    bench_tasks.DECODE_TRAIN["steps"] = args.decode_train
    torch.manual_seed(0)
    V, E, H, B, N, K, max_length = 40, 64, 128, 64, 512, 5, 32
    model, ref = bench_tasks._decoding_models(V, E, H)
    gen = torch.Generator().manual_seed(0)
    batches = [bench_tasks._pairs(gen, V, B)[:2] for _ in range(N // B)]
    print(
        "| search | contender | steps | ops / step | in the step | search | products | "
        "math | choice | bookkeeping | kernels / step | host syncs / step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    tables = []
    for search, beam in (("greedy", 1), ("beam 5", K)):
        contenders: dict[str, tuple[list[Callable[[], object]], bool, tuple[object, ...]]] = {
            "rnnkit": (
                [partial(model.decode, s, m, beam=beam, max_length=max_length) for s, m in batches],
                True,
                (InferenceStep, Seq2Seq),
            ),
            "rnnkit general": (
                [partial(model.decode, s, m, beam=beam, max_length=max_length) for s, m in batches],
                False,
                (InferenceStep, Seq2Seq),
            ),
            "torch.nn": (
                [
                    partial(ref.greedy, s, m, max_length)
                    if beam == 1
                    else partial(ref.beam, s, m, K, max_length)
                    for s, m in batches
                ],
                True,
                (ref,),
            ),
        }
        for name, (runs, native, owners) in contenders.items():
            with torch.no_grad():
                r = _count(runs, native, *owners)
            tables.append((search, name, r))
            k = r["kinds"]
            assert isinstance(k, dict)
            print(
                f"| {search} | {name} | {r['steps']} | {r['ops']:.1f} | {r['model']:.1f} | "
                f"{r['search']:.1f} | {k['product']:.1f} | {k['math']:.1f} | {k['choice']:.1f} | "
                f"{k['bookkeeping']:.1f} | {r['kernels']:.1f} | {r['syncs']:.2f} |",
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
