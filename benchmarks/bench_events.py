"""Anomaly scoring throughput: events/s in batch and streaming, and memory per open session.

- **batch**: :func:`rnnkit.app.tasks.events.event_surprises` over whole sessions (padded,
  grouped by length, state carried over chunks of 512 steps), surprise and rank of every
  event;
- **streaming**: :class:`rnnkit.anomaly.streaming.StreamScorer` on the same events, sessions
  interleaved at random, fed one event per call (an idle input: every event is its own
  ``model.step``) and in reads of 64 events (a busy input: one step for every session
  that has an event in the read);
- **memory**: bytes per open session, measured by opening 20,000 sessions of six events
  each: the row of the state pool (LSTM ``h`` and ``c``), and the Python bookkeeping
  (``tracemalloc``: running scores, the five most surprising events, the LRU entry).

The model is untrained (throughput does not depend on the weights) unless ``--checkpoint``
names an ``events`` run; sessions come from the toy grammar of
:func:`rnnkit.data.generated_sessions.generate_sessions` (about 20 events each) unless ``--data``
names a sessions file.

    python benchmarks/bench_events.py [--hidden 64] [--layers 1] [--threads 1] [--json]
    python benchmarks/bench_events.py --checkpoint runs/syscalls/run \
        --data runs/syscalls/test.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, machine

from rnnkit.anomaly.stream_format import StreamItem
from rnnkit.anomaly.streaming import StreamScorer
from rnnkit.app.tasks.events import (
    EventVocabulary,
    event_surprises,
    load_events,
)
from rnnkit.data.events import read_sessions
from rnnkit.data.generated_sessions import generate_sessions
from rnnkit.models.builders import build_language_model
from rnnkit.models.spec import ModelSpec

#: Six events per open session: its list of the five most surprising events is full.
FILLER = ("login:user", "open", "read", "read", "close", "stat")


def _interleaved(sessions, seed: int = 0) -> list[StreamItem]:
    rng = random.Random(seed)
    cursors = {s.session: 0 for s in sessions}
    events = {s.session: s.events for s in sessions}
    items = []
    while cursors:
        sid = rng.choice(list(cursors))
        i = cursors[sid]
        end = i + 1 == len(events[sid])
        items.append(StreamItem(sid, (events[sid][i],), end))
        if end:
            del cursors[sid]
        else:
            cursors[sid] = i + 1
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="an events run directory (default: untrained model)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--data", help="a sessions file to score (default: the toy grammar)")
    p.add_argument("--sessions", type=int, default=400, help="toy sessions scored")
    p.add_argument("--open", type=int, default=20_000, help="sessions opened for memory")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    if args.data:
        sessions = read_sessions(args.data)
    else:
        sessions = generate_sessions(args.sessions, anomalies=args.sessions // 10, seed=0)
    if args.checkpoint:
        run = load_events(args.checkpoint)
        model, vocab, g = run.model, run.vocab, int(run.thresholds["top_g"])
    else:
        vocab = EventVocabulary.from_sessions(s.events for s in sessions)
        spec = ModelSpec(hidden=args.hidden, embedding=32, layers=args.layers)
        model, g = build_language_model(spec, len(vocab)).eval(), 9
    n_events = sum(len(s.events) for s in sessions)
    seqs = [vocab.encode_events(s.events)[0] for s in sessions]
    results: dict[str, Any] = {"machine": machine(), "events": n_events}
    results["model"] = {
        "cell": "lstm" if model.encoder.is_lstm else "gru/rnn",
        "hidden": model.encoder.hidden_size,
        "layers": model.encoder.num_layers,
        "vocab": len(vocab),
    }

    batch_s = best_time(lambda: event_surprises(model, seqs, batch_size=64), args.repeats)
    results["batch_events_per_s"] = n_events / batch_s

    items = _interleaved(sessions)
    for read in (1, 64):

        def stream(read: int = read) -> None:
            scorer = StreamScorer(model, vocab, threshold=1e9, top_g=g, idle_timeout=None)
            for lo in range(0, len(items), read):
                scorer.feed(items[lo : lo + read])

        repeats = 1 if read == 1 else args.repeats
        results[f"stream_events_per_s_read{read}"] = n_events / best_time(stream, repeats)

    scorer = StreamScorer(
        model, vocab, threshold=1e9, top_g=g, max_sessions=args.open, idle_timeout=None
    )
    warm = [StreamItem(f"w{i}", ("login:user",)) for i in range(64)]
    scorer.feed(warm)
    scorer.close_all()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for lo in range(0, args.open, 256):
        scorer.feed([StreamItem(f"s{i}", FILLER) for i in range(lo, min(lo + 256, args.open))])
    python_bytes = (tracemalloc.get_traced_memory()[0] - before) / scorer.open_sessions
    tracemalloc.stop()
    state = scorer.state_bytes_per_session()
    results["memory_per_open_session"] = {
        "state_bytes": state,
        "python_bytes": round(python_bytes),
        "total_bytes": round(state + python_bytes),
        "open_sessions": scorer.open_sessions,
    }

    if args.json:
        print(json.dumps(results))
        return 0
    m = results["machine"]
    print(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} thread(s)), "
          f"load {m['load_1min']}, {m['date']}")  # fmt: skip
    mod = results["model"]
    print(f"model: {mod['cell']} H={mod['hidden']} L={mod['layers']}, vocabulary {mod['vocab']}; "
          f"{len(sessions)} sessions, {n_events:,} events")  # fmt: skip
    print(f"batch scoring          {results['batch_events_per_s']:>10,.0f} events/s")
    print(f"streaming, 1 per read  {results['stream_events_per_s_read1']:>10,.0f} events/s")
    print(f"streaming, 64 per read {results['stream_events_per_s_read64']:>10,.0f} events/s")
    mem = results["memory_per_open_session"]
    print(f"per open session: {mem['state_bytes']} B of state + {mem['python_bytes']} B of "
          f"bookkeeping = {mem['total_bytes']} B ({mem['open_sessions']:,} open)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
