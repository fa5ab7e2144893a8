"""End to end, every task: rnnkit's model against the same model written plainly on torch.nn.

One training step = forward, masked loss, backward, global-norm clipping at 5, Adam step,
on random token ids of realistic shapes (speed does not depend on the values). rnnkit's
step runs as ``rnnkit train`` runs it: the models' checks and figures deferred and read
once with the gradient norm (on a GPU, one wait for the device). The
torch.nn models are written the way a user would write them:

* ``lm``: ``nn.Embedding`` → ``nn.LSTM`` → ``nn.Linear``, state carried (detached);
  rnnkit ``build_language_model`` (the char LM of ``make run``: E 64, H 256, B 32, K 64);
* ``tag``: ``nn.Embedding`` → bidirectional ``nn.LSTM`` on ``pack_padded_sequence`` →
  ``nn.Linear``; rnnkit ``build_tagger`` (E 64, H 128, B 32, sentence lengths 5–40);
* ``classify``: ``nn.Embedding`` → ``nn.LSTM`` on ``pack_padded_sequence``, the last
  state → the feed-forward head; rnnkit ``build_classifier`` (E 64, H 128, B 32,
  lengths 10–100, ``pooling last``);
* ``events``: the event LM, ``nn.Embedding`` → 2-layer ``nn.LSTM`` → ``nn.Linear`` on
  padded sessions with a masked loss; rnnkit ``build_language_model`` with the same mask
  (E 32, 2 × H 64, B 32, sessions of 20–200 events);
* ``seq2seq``: encoder ``nn.LSTM``, decoder an ``nn.LSTMCell`` loop with additive
  attention on the previous state and the context fed with the next input (the wiring of
  ``build_seq2seq``), head on ``[h, context]``; rnnkit ``build_seq2seq`` (E 64, H 128,
  B 64, string lengths 5–15);
* ``seq2seq-after``: the same with attention after the decoder step (``--attention-wiring
  after``, no input feeding): the torch.nn model runs its decoder as one ``nn.LSTM`` call
  over the target and the attention of all steps in batched products, as a user would
  write this wiring; rnnkit ``build_seq2seq`` with ``attention_wiring="after"``; the
  ``seq2seq`` task's torch.nn cell loop is timed beside them (its own ratio);
* ``seq2seq-greedy``: greedy decoding of 512 sources in batches of 64 (max length 32),
  rnnkit ``Seq2Seq.decode`` (finished rows leave the batch) against the loop a user
  writes (all rows until every row has ended); same weights (copied), after 300 training
  steps on string reversal (``--decode-train``) so that outputs end as a trained
  model's do;
* ``seq2seq-beam``: beam search (K = 5, length-normalised, the stopping rule of
  ``rnnkit.generation.seq2seq_search``) of the same sources: rnnkit (finished sources leave
  the batch) against the same search written on the torch.nn model, every source's K
  rows computed until all sources have ended (the same hypotheses).

Both decoding tasks also time rnnkit with the model's general decoder step instead of
the inference step that ``Seq2Seq.decode`` takes for an LSTM decoder (``rnnkit general
step``: its time over rnnkit's, the gain of that step).

Timing: the two contenders of a task alternate in interleaved rounds (``_common``);
the ratio is the median over rounds of ``torch time / rnnkit time`` (> 1: rnnkit is
faster). Threads: torch's default unless ``--threads``; ``--cpu-time`` runs one thread
and times it by its own CPU time, which leaves out the time other processes take.

    python benchmarks/bench_tasks.py                  # all tasks, 5 rounds (~4 min)
    python benchmarks/bench_tasks.py --quick          # 3 rounds of shorter blocks (~2 min)
    python benchmarks/bench_tasks.py --tasks seq2seq,seq2seq-greedy --json
    python benchmarks/bench_tasks.py --device cuda    # both on a GPU (torch.nn: cuDNN)
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, machine, median_ratio

from rnnkit import to_torch
from rnnkit.data.vocab import BOS_ID, EOS_ID
from rnnkit.deferred import deferring
from rnnkit.models.builders import build_language_model
from rnnkit.models.classifier import build_classifier
from rnnkit.models.seq2seq import build_seq2seq
from rnnkit.models.spec import ModelSpec
from rnnkit.models.tagger import build_tagger
from rnnkit.types import LSTMState

TASKS = (
    "lm",
    "tag",
    "classify",
    "events",
    "seq2seq",
    "seq2seq-after",
    "seq2seq-greedy",
    "seq2seq-beam",
)
Step = Callable[[], None]


def _trainer(model: nn.Module, loss_fn: Callable[[int], torch.Tensor]) -> Step:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    count = [0]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(count[0]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        count[0] += 1

    return step


def _rnnkit_trainer(model: nn.Module, loss_fn: Callable[[int], torch.Tensor]) -> Step:
    """:func:`_trainer` as ``rnnkit train``'s Trainer runs a step: the models' checks and
    figures deferred (``rnnkit.deferred``), read once with the gradient norm."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    count = [0]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with deferring() as deferred:
            loss = loss_fn(count[0])
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            deferred.read(loss.detach(), norm)
        opt.step()
        count[0] += 1

    return step


def _synchronised(fn: Step, device: torch.device) -> Step:
    """``fn``, then wait for the device: a step's time is its work, not its launches."""
    if device.type != "cuda":
        return fn

    def step() -> None:
        fn()
        torch.cuda.synchronize(device)

    return step


def _lengths(gen: torch.Generator, B: int, lo: int, hi: int) -> torch.Tensor:
    return torch.randint(lo, hi + 1, (B,), generator=gen)


def _padded(gen: torch.Generator, V: int, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
    T = int(lengths.max())
    ids = torch.randint(4, V, (len(lengths), T), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, 0), mask


def _masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[mask], targets[mask])


# ------------------------------------------------------------------------------ tasks
def task_lm(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, B, K = 100, 64, 256, 32, 64
    lm = build_language_model(ModelSpec(hidden=H, embedding=E), V)
    data = torch.randint(0, V, (8, B, K + 1), generator=gen)

    class TorchLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding, self.lstm = nn.Embedding(V, E), nn.LSTM(E, H, batch_first=True)
            self.head = nn.Linear(H, V)

    tlm = TorchLM()
    carry: dict[str, Any] = {"rnnkit": None, "torch": None}

    def rk_loss(i: int) -> torch.Tensor:
        x, y = data[i % 8, :, :-1], data[i % 8, :, 1:]
        out = lm.loss(x, y, state=carry["rnnkit"])
        assert isinstance(out.state, LSTMState)
        carry["rnnkit"] = LSTMState(out.state.h.detach(), out.state.c.detach())
        return out.loss

    def t_loss(i: int) -> torch.Tensor:
        x, y = data[i % 8, :, :-1], data[i % 8, :, 1:]
        h, (hn, cn) = tlm.lstm(tlm.embedding(x), carry["torch"])
        carry["torch"] = (hn.detach(), cn.detach())
        return nn.functional.cross_entropy(tlm.head(h).flatten(0, 1), y.flatten())

    return {"rnnkit": _rnnkit_trainer(lm, rk_loss), "torch.nn": _trainer(tlm, t_loss)}, B * K


def task_tag(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, B, K = 5000, 64, 128, 32, 17
    spec = ModelSpec(hidden=H, embedding=E)
    tagger = build_tagger(spec, V, K)
    batches = []
    for _ in range(8):
        lengths = _lengths(gen, B, 5, 40)
        words, mask = _padded(gen, V, lengths)
        tags = torch.randint(0, K, words.shape, generator=gen)
        batches.append((words, mask, tags, lengths))
    tokens = sum(int(b[3].sum()) for b in batches) // len(batches)

    class TorchTagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(V, E)
            self.lstm = nn.LSTM(E, H, batch_first=True, bidirectional=True)
            self.head = nn.Linear(2 * H, K)

    tt = TorchTagger()

    def rk_loss(i: int) -> torch.Tensor:
        words, mask, tags, _ = batches[i % 8]
        return tagger.loss(words, tags, mask).loss

    def t_loss(i: int) -> torch.Tensor:
        words, mask, tags, lengths = batches[i % 8]
        packed = pack_padded_sequence(
            tt.embedding(words), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = tt.lstm(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return _masked_ce(tt.head(h), tags, mask)

    return {"rnnkit": _rnnkit_trainer(tagger, rk_loss), "torch.nn": _trainer(tt, t_loss)}, tokens


def task_classify(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, B, K = 5000, 64, 128, 32, 4
    spec = ModelSpec(hidden=H, embedding=E, pooling="last")
    clf = build_classifier(spec, V, K)
    batches = []
    for _ in range(8):
        lengths = _lengths(gen, B, 10, 100)
        ids, mask = _padded(gen, V, lengths)
        batches.append((ids, mask, torch.randint(0, K, (B,), generator=gen), lengths))
    tokens = sum(int(b[3].sum()) for b in batches) // len(batches)

    class TorchClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(V, E)
            self.lstm = nn.LSTM(E, H, batch_first=True)
            self.head = nn.Sequential(nn.Linear(H, H), nn.ReLU(), nn.Linear(H, K))

    tc = TorchClassifier()

    def rk_loss(i: int) -> torch.Tensor:
        ids, mask, labels, _ = batches[i % 8]
        return clf.loss(ids, labels, mask).loss

    def t_loss(i: int) -> torch.Tensor:
        ids, _, labels, lengths = batches[i % 8]
        packed = pack_padded_sequence(
            tc.embedding(ids), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (hn, _) = tc.lstm(packed)
        return nn.functional.cross_entropy(tc.head(hn[-1]), labels)

    return {"rnnkit": _rnnkit_trainer(clf, rk_loss), "torch.nn": _trainer(tc, t_loss)}, tokens


def task_events(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, L, B = 60, 32, 64, 2, 32
    spec = ModelSpec(hidden=H, embedding=E, layers=L)
    lm = build_language_model(spec, V)
    batches = []
    for _ in range(8):
        lengths = _lengths(gen, B, 20, 200)
        ids, mask = _padded(gen, V, lengths + 1)
        batches.append((ids[:, :-1], ids[:, 1:], mask[:, 1:], lengths))
    tokens = sum(int(b[3].sum()) for b in batches) // len(batches)

    class TorchEventLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(V, E)
            self.lstm = nn.LSTM(E, H, num_layers=L, batch_first=True)
            self.head = nn.Linear(H, V)

    te = TorchEventLM()

    def rk_loss(i: int) -> torch.Tensor:
        x, y, mask, _ = batches[i % 8]
        return lm.loss(x, y, mask=mask).loss

    def t_loss(i: int) -> torch.Tensor:
        x, y, mask, _ = batches[i % 8]
        h, _ = te.lstm(te.embedding(x))
        return _masked_ce(te.head(h), y, mask)

    return {"rnnkit": _rnnkit_trainer(lm, rk_loss), "torch.nn": _trainer(te, t_loss)}, tokens


class TorchSeq2Seq(nn.Module):
    """Encoder ``nn.LSTM``; decoder ``nn.LSTMCell`` stepped in Python with additive
    attention on the previous state, its context concatenated to the next input and to
    the head's input — the wiring of rnnkit's ``build_seq2seq`` (``context init``)."""

    def __init__(self, V: int, E: int, H: int) -> None:
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(V, E), nn.Embedding(V, E)
        self.encoder: nn.Module = nn.LSTM(E, H, batch_first=True)
        self.query_proj = nn.Linear(H, H)
        self.memory_proj = nn.Linear(H, H, bias=False)
        self.v = nn.Parameter(torch.randn(H) / H**0.5)
        self.cell: nn.Module = nn.LSTMCell(E + H, H)
        self.head = nn.Linear(2 * H, V)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        lengths = src_mask.sum(1)
        packed = pack_padded_sequence(
            self.src_emb(src), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        out, (hn, cn) = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(
            out, batch_first=True, total_length=src.shape[1]
        )
        return memory, self.memory_proj(memory), (hn[-1], cn[-1])

    def attend(self, h, memory, keys, src_mask):
        scores = torch.tanh(keys + self.query_proj(h).unsqueeze(1)) @ self.v
        weights = torch.softmax(scores.masked_fill(~src_mask, float("-inf")), dim=-1)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)

    def step(self, emb, hc, memory, keys, src_mask):
        ctx = self.attend(hc[0], memory, keys, src_mask)
        h, c = self.cell(torch.cat([emb, ctx], dim=-1), hc)
        return torch.cat([h, ctx], dim=-1), (h, c)

    def loss(self, src, src_mask, tgt_in, tgt_out, tgt_mask):
        memory, keys, hc = self.encode(src, src_mask)
        emb = self.tgt_emb(tgt_in)
        feats = []
        for t in range(tgt_in.shape[1]):
            f, hc = self.step(emb[:, t], hc, memory, keys, src_mask)
            feats.append(f)
        logits = self.head(torch.stack(feats, dim=1))
        return _masked_ce(logits, tgt_out, tgt_mask)

    @torch.no_grad()
    def greedy(self, src, src_mask, max_length: int) -> torch.Tensor:
        memory, keys, hc = self.encode(src, src_mask)
        B, dev = src.shape[0], src.device  # called outside main's `with device:`
        token = torch.full((B,), BOS_ID, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        out = []
        for _ in range(max_length):
            f, hc = self.step(self.tgt_emb(token), hc, memory, keys, src_mask)
            token = self.head(f).argmax(-1)
            out.append(token)
            done |= token == EOS_ID
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def beam(self, src, src_mask, K: int, max_length: int) -> list[list[int]]:
        """Beam search, every source's K rows stepped until all sources are done; a source
        is done when its best candidate is ``</s>`` or no live beam is left (the rule of
        ``rnnkit.generation.seq2seq_search``); score = log p / n."""
        memory, keys, hc = self.encode(src, src_mask)
        B, dev = src.shape[0], src.device  # called outside main's `with device:`
        expand = torch.arange(B, device=dev).repeat_interleave(K)
        memory, keys, src_mask = memory[expand], keys[expand], src_mask[expand]
        hc = (hc[0][expand], hc[1][expand])
        token = torch.full((B * K,), BOS_ID, dtype=torch.long, device=dev)
        beam_lp = torch.full((B, K), float("-inf"), device=dev)
        beam_lp[:, 0] = 0.0
        seqs = torch.zeros(B * K, 0, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        best: list[tuple[float, list[int]]] = [(float("-inf"), [])] * B
        base = (torch.arange(B, device=dev) * K).view(-1, 1)
        for t in range(max_length):
            f, hc = self.step(self.tgt_emb(token), hc, memory, keys, src_mask)
            log_probs = torch.log_softmax(self.head(f), dim=-1)
            V = log_probs.shape[-1]
            cand = beam_lp.unsqueeze(-1) + log_probs.view(B, K, V)
            top_lp, top_idx = cand.view(B, K * V).topk(2 * K, dim=-1)
            parent, tok = top_idx // V, top_idx % V
            finite, is_eos = torch.isfinite(top_lp), tok == EOS_ID
            closes = is_eos & finite & ~done.view(-1, 1)
            closes[:, K:] = False
            for b, c in closes.nonzero().tolist():
                score = float(top_lp[b, c]) / (t + 1)
                if score > best[b][0]:
                    best[b] = (score, seqs[b * K + int(parent[b, c])].tolist())
            live_lp, pick = top_lp.masked_fill(is_eos | ~finite, float("-inf")).topk(K, dim=-1)
            rows = (base + parent.gather(1, pick)).view(-1)
            tok = tok.gather(1, pick).view(-1)
            if t == max_length - 1:  # the live beams are hypotheses too (unfinished)
                for b, k in (live_lp.isfinite() & ~done.view(-1, 1)).nonzero().tolist():
                    score = float(live_lp[b, k]) / (t + 1)
                    if score > best[b][0]:
                        best[b] = (
                            score,
                            [*seqs[int(rows[b * K + k])].tolist(), int(tok[b * K + k])],
                        )
                break
            done |= ~live_lp[:, 0].isfinite() | (is_eos[:, 0] & finite[:, 0])
            if bool(done.all()):
                break
            seqs = torch.cat([seqs[rows], tok.view(-1, 1)], dim=1)
            beam_lp, token = live_lp, tok
            hc = (hc[0][rows], hc[1][rows])
        return [ids for _, ids in best]


class TorchSeq2SeqAfter(TorchSeq2Seq):
    """Attention after the decoder step, no input feeding: the decoder is one ``nn.LSTM``
    over the target, then the attention of all steps at once (batched products)."""

    def __init__(self, V: int, E: int, H: int) -> None:
        super().__init__(V, E, H)
        del self.cell
        self.decoder: nn.Module = nn.LSTM(E, H, batch_first=True)

    def loss(self, src, src_mask, tgt_in, tgt_out, tgt_mask):
        memory, keys, (h, c) = self.encode(src, src_mask)
        out, _ = self.decoder(self.tgt_emb(tgt_in), (h[None], c[None]))  # (B, T, H)
        scores = torch.tanh(keys.unsqueeze(1) + self.query_proj(out).unsqueeze(2)) @ self.v
        weights = torch.softmax(scores.masked_fill(~src_mask[:, None], float("-inf")), dim=-1)
        logits = self.head(torch.cat([out, torch.bmm(weights, memory)], dim=-1))
        return _masked_ce(logits, tgt_out, tgt_mask)


def _rnnkit_seq2seq(V: int, E: int, H: int, wiring: str = "before"):
    spec = ModelSpec(
        hidden=H, embedding=E, attention="additive", context="init", attention_wiring=wiring
    )
    return build_seq2seq(spec, V, V)


def _torch_copy(model, wiring: str = "before"):
    """The torch.nn model with ``model``'s weights (so decoding runs the same lengths)."""
    V, E = model.target_embedding.weight.shape
    H = model.decoder.hidden_size
    ref = TorchSeq2Seq(V, E, H) if wiring == "before" else TorchSeq2SeqAfter(V, E, H)
    with torch.no_grad():
        ref.src_emb.weight.copy_(model.source_embedding.weight)
        ref.tgt_emb.weight.copy_(model.target_embedding.weight)
        ref.encoder = to_torch(model.encoder)
        if wiring == "before":
            ref.cell = to_torch(model.decoder.cells()[0])
        else:
            ref.decoder = to_torch(model.decoder)
        att = model.attention
        ref.query_proj.load_state_dict(att.query_proj.state_dict())
        ref.memory_proj.load_state_dict(att.memory_proj.state_dict())
        ref.v.copy_(att.v)
        ref.head.load_state_dict(model.head.state_dict())
    return ref


def _seq2seq_models(V: int, E: int, H: int, wiring: str = "before"):
    model = _rnnkit_seq2seq(V, E, H, wiring)
    return model, _torch_copy(model, wiring)


#: Training steps of the decoding tasks' model on string reversal (``--decode-train``), so
#: that it ends its outputs with ``</s>`` at about the right length as a trained model does
#: (an untrained one rarely draws ``</s>``: every row runs to the length limit).
DECODE_TRAIN = {"steps": 300}
_DECODE_MODEL: dict[int, object] = {}


def _decoding_models(V: int, E: int, H: int):
    from rnnkit.data.pairs import PairBatch

    steps = DECODE_TRAIN["steps"]
    if steps not in _DECODE_MODEL:
        torch.manual_seed(0)
        model = _rnnkit_seq2seq(V, E, H)
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        # on the device the data is made on (main's `with device:`): a CPU generator
        # drawing CUDA tensors is refused by torch
        gen = torch.Generator(device=torch.get_default_device()).manual_seed(1)
        for _ in range(steps):
            src, src_mask, tgt_in, tgt_out, tgt_mask = _pairs(gen, V, 64, reverse=True)
            rows = torch.arange(src.shape[0])
            batch = PairBatch(src, src_mask, tgt_in, tgt_out, tgt_mask, rows)
            opt.zero_grad(set_to_none=True)
            model.loss(batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
        _DECODE_MODEL[steps] = model.eval()
    model = _DECODE_MODEL[steps]
    return model, _torch_copy(model).eval()


def _pairs(gen: torch.Generator, V: int, B: int, reverse: bool = False):
    lengths = _lengths(gen, B, 5, 15)
    src, src_mask = _padded(gen, V, lengths)
    tgt, tgt_mask = _padded(gen, V, lengths + 1)
    if reverse:  # the target is the source read backwards
        for b, n in enumerate(lengths.tolist()):
            tgt[b, :n] = src[b, :n].flip(0)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt[:, :-1]], dim=1)
    tgt_out = tgt.clone()
    tgt_out[torch.arange(B), lengths] = EOS_ID
    return src, src_mask, tgt_in.masked_fill(~tgt_mask, 0), tgt_out, tgt_mask


def task_seq2seq(gen: torch.Generator, wiring: str = "before") -> tuple[dict[str, Step], int]:
    from rnnkit.data.pairs import PairBatch

    V, E, H, B = 40, 64, 128, 64
    model, ref = _seq2seq_models(V, E, H, wiring)
    batches = [_pairs(gen, V, B) for _ in range(8)]
    tokens = sum(int(b[4].sum()) for b in batches) // len(batches)

    def rk_loss(i: int) -> torch.Tensor:
        src, src_mask, tgt_in, tgt_out, tgt_mask = batches[i % 8]
        batch = PairBatch(src, src_mask, tgt_in, tgt_out, tgt_mask, torch.arange(src.shape[0]))
        return model.loss(batch).loss

    def t_loss(i: int) -> torch.Tensor:
        return ref.loss(*batches[i % 8])

    fns = {"rnnkit": _rnnkit_trainer(model, rk_loss), "torch.nn": _trainer(ref, t_loss)}
    if wiring == "after":  # and the torch.nn cell loop of the default wiring, for scale
        loop = TorchSeq2Seq(V, E, H)
        fns["torch.nn cell loop"] = _trainer(loop, lambda i: loop.loss(*batches[i % 8]))
    return fns, tokens


def task_seq2seq_greedy(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, B, N, max_length = 40, 64, 128, 64, 512, 32
    model, ref = _decoding_models(V, E, H)
    batches = [_pairs(gen, V, B)[:2] for _ in range(N // B)]

    def rk() -> None:
        for src, mask in batches:
            model.decode(src, mask, beam=1, max_length=max_length)

    def tn() -> None:
        for src, mask in batches:
            ref.greedy(src, mask, max_length)

    return {"rnnkit": rk, "torch.nn": tn, "rnnkit general step": _general(model, batches, 1)}, N


def task_seq2seq_beam(gen: torch.Generator) -> tuple[dict[str, Step], int]:
    V, E, H, B, N, K, max_length = 40, 64, 128, 64, 512, 5, 32
    model, ref = _decoding_models(V, E, H)
    batches = [_pairs(gen, V, B)[:2] for _ in range(N // B)]

    def rk() -> None:
        for src, mask in batches:
            model.decode(src, mask, beam=K, max_length=max_length)

    def tn() -> None:
        for src, mask in batches:
            ref.beam(src, mask, K, max_length)

    return {"rnnkit": rk, "torch.nn": tn, "rnnkit general step": _general(model, batches, K)}, N


def _general(model, batches, beam: int, max_length: int = 32) -> Step:
    """rnnkit's decoding with the model's general ``step`` instead of the inference step
    ``Seq2Seq.decode`` takes for an LSTM decoder (what ``decode`` ran before it)."""
    from rnnkit.data.vocab import BOS_ID, EOS_ID
    from rnnkit.generation.seq2seq_search import decode_batch
    from rnnkit.models.seq2seq_decoder import PER_SOURCE, STATE_BATCH_DIM

    @torch.no_grad()
    def run() -> None:
        for src, mask in batches:
            state = model.encode(src, mask)
            decode_batch(
                model,
                state,
                STATE_BATCH_DIM,
                beam=beam,
                max_length=max_length,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                per_source=PER_SOURCE,
            )

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block", type=float, default=1.0, help="seconds per timed block")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="one thread, timed by its CPU time (steadier on a loaded machine)",
    )
    p.add_argument("--quick", action="store_true", help="3 rounds of 0.5 s blocks")
    p.add_argument(
        "--decode-train",
        type=int,
        default=DECODE_TRAIN["steps"],
        help="training steps (string reversal) of the decoding tasks' model before timing; "
        "0: untrained (rows rarely end before the length limit)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where both models train (cuda: torch.nn runs cuDNN; the device is "
        "synchronised after every step of either)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--out",
        type=Path,
        help="also write the JSON result here, rewritten after every task (a run stopped at "
        "a time limit keeps the tasks it finished)",
    )
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    DECODE_TRAIN["steps"] = args.decode_train
    if args.quick:
        args.rounds, args.block = 3, 0.5
    if args.cpu_time:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    builders = {
        "lm": task_lm,
        "tag": task_tag,
        "classify": task_classify,
        "events": task_events,
        "seq2seq": task_seq2seq,
        "seq2seq-after": lambda gen: task_seq2seq(gen, "after"),
        "seq2seq-greedy": task_seq2seq_greedy,
        "seq2seq-beam": task_seq2seq_beam,
    }
    info = machine()
    rows: list[dict] = []
    clock_name = "thread CPU time" if args.cpu_time else "wall clock"

    def document() -> dict:
        return {"machine": info, "rounds": args.rounds, "clock": clock_name, "rows": rows}

    def saved() -> None:
        if args.out:  # whole: written aside, then renamed
            part = args.out.with_name(args.out.name + ".part")
            part.write_text(json.dumps(document()))
            part.replace(args.out)

    names = args.tasks.split(",")
    for name in names:
        if name not in builders:
            p.error(f"--tasks: unknown task {name!r} (known: {', '.join(TASKS)})")
    for name in names:
        try:
            row = _task_row(name, builders[name], device, args)
        except Exception as exc:  # one task's failure is recorded; the others still run
            traceback.print_exc()
            row = {"task": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        saved()
        if args.json:
            continue
        if "error" in row:
            print(f"{name:<15} failed: {row['error']}", flush=True)
            continue
        extra = "".join(
            f"   {k} {v:,.0f}, ratio {row['ratio_' + k.replace(' ', '_')]:.2f}"
            for k, v in row.get("others_per_s", {}).items()
        )
        print(
            f"{name:<15} rnnkit {row['rnnkit_per_s']:>10,.0f} {row['unit']}/s   "
            f"torch.nn {row['torch_per_s']:>10,.0f}   ratio {row['ratio']:.2f}{extra}",
            flush=True,
        )
    if args.json:
        print(json.dumps(document()))
    else:
        print(
            f"({info['cpu']}, {info['cores']} cores, {info['torch_threads']} threads, torch "
            f"{info['torch']}, {info['date']}, load {info['load_1min']} at the start, "
            f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
            f"{', CPU time of the thread' if args.cpu_time else ''})"
        )
    return 1 if any("error" in r for r in rows) else 0


def _task_row(name: str, build: Callable, device: torch.device, args: argparse.Namespace) -> dict:
    """One task's contenders built on ``device`` and timed in interleaved rounds: its
    units a second on each side, the ratio, and any further reference's
    (``others_per_s``, ``ratio_<name>``)."""
    torch.manual_seed(0)
    with device:  # models and data on the device (tensors made without one go there)
        fns, units = build(torch.Generator(device=device).manual_seed(0))
    fns = {k: _synchronised(f, device) for k, f in fns.items()}
    clock = "thread" if args.cpu_time else "wall"
    times = interleaved(fns, rounds=args.rounds, block_s=args.block, clock=clock)

    def per_s(key: str) -> float:
        return units / sorted(times[key])[len(times[key]) // 2]

    row: dict = {
        "task": name,
        "unit": "sentences" if name in ("seq2seq-greedy", "seq2seq-beam") else "tokens",
        "rnnkit_per_s": per_s("rnnkit"),
        "torch_per_s": per_s("torch.nn"),
        "ratio": median_ratio(times, "torch.nn", "rnnkit"),
    }
    others = [k for k in times if k not in ("rnnkit", "torch.nn")]
    if others:
        row["others_per_s"] = {k: per_s(k) for k in others}
    for other in others:  # a further reference: its time over rnnkit's
        row[f"ratio_{other.replace(' ', '_')}"] = median_ratio(times, other, "rnnkit")
    return row


if __name__ == "__main__":
    sys.exit(main())
