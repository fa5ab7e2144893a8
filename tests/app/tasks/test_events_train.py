"""Training pieces of the events task: a long session is cut into pieces that cover
each prediction once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rnnkit.app.tasks.events.train import _pieces
from rnnkit.data.vocab import EOS_ID


def test_pieces_cover_a_long_session_once() -> None:
    seq = np.arange(4, 14)  # 10 events: 11 predictions with the end
    pieces = _pieces(seq, 4)
    assert [len(x) for x, _ in pieces] == [4, 4, 3]
    targets = np.concatenate([y for _, y in pieces])
    assert targets.tolist() == [*seq.tolist(), EOS_ID]
    # A later piece starts from the event before its first target.
    assert pieces[1][0][0] == pieces[0][1][-1]


def _lm(seed: int = 0):
    import torch

    from rnnkit.models.builders import build_language_model
    from rnnkit.models.spec import ModelSpec

    torch.manual_seed(seed)
    return build_language_model(ModelSpec(hidden=6, embedding=4, cell="lstm"), 9).double()


def _batch():
    import torch

    lengths = [11, 7, 3]
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(4, 9, (3, 11), generator=g)
    targets = torch.randint(3, 9, (3, 11), generator=g)
    mask = torch.arange(11)[None, :] < torch.tensor(lengths)[:, None]
    return inputs, targets, mask, lengths


def _step_by_step_grads(model, inputs, targets, lengths, k):
    """The oracle: each session alone, one ``step`` at a time, its state detached before
    every k-th step; the token-mean loss over all sessions, by autograd."""
    import torch

    total, count = 0.0, sum(lengths)
    for row, n in enumerate(lengths):
        state = None
        for t in range(n):
            if t and t % k == 0:
                state = type(state)(*(s.detach() for s in state))
            out = model(inputs[row, t : t + 1].view(1, 1), state=state)  # one step
            state = out.state
            total = total - torch.log_softmax(out.logits[0, 0], -1)[targets[row, t]]
    model.zero_grad()
    (total / count).backward()
    return float(total.detach() / count), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("k", [1, 3, 4, 11])
def test_segment_loss_cuts_the_gradient_every_k_steps_and_carries_the_state(k) -> None:
    from rnnkit.app.tasks.events.train import segment_loss

    model = _lm()
    inputs, targets, mask, lengths = _batch()
    want_loss, want = _step_by_step_grads(model, inputs, targets, lengths, k)
    model.zero_grad()
    out = segment_loss(model, inputs, targets, mask, k)
    out.loss.backward()
    assert float(out.loss.detach()) == pytest.approx(want_loss, rel=1e-10)
    assert out.tokens == sum(lengths) and out.nats == pytest.approx(want_loss * sum(lengths))
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-10), name
    if k < max(lengths):  # a real cut: not the full-BPTT gradient
        full_loss, full = _step_by_step_grads(model, inputs, targets, lengths, 10**6)
        assert full_loss == pytest.approx(want_loss)  # the same forward values
        hh = next(name for name in want if name.endswith("weight_hh"))
        assert not torch.allclose(full[hh], want[hh])


def _trained_weights(tmp_path, bptt: str, **kw):
    from safetensors.torch import load_file

    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.events import train
    from rnnkit.data.events import write_sessions
    from rnnkit.data.generated_sessions import generate_sessions

    data = tmp_path / "train.jsonl"
    if not data.exists():
        write_sessions(data, generate_sessions(24, seed=1))
    out = tmp_path / bptt.replace(":", "_")
    cfg = TrainConfig(
        task="events", train=str(data), out=str(out), hidden=8, embedding=4, steps=3,
        batch_size=8, lr=1e-2, bptt=bptt, ngram_order=2, **kw,
    )  # fmt: skip
    train(cfg.validate(), quiet=True)
    pointer = json.loads((out / "latest.json").read_text())  # the weights after step 3
    assert pointer["step"] == 3
    return load_file(str(out / pointer["snapshot"] / "model.safetensors"))


def test_events_train_with_the_truncation_bptt_names(tmp_path) -> None:
    from rnnkit.app.config import TrainConfig

    assert TrainConfig.for_task("events", train="x").bptt == "full"  # the task's default
    full = _trained_weights(tmp_path, "full")
    # segment:K with K beyond every piece cuts nothing: full BPTT exactly
    same = _trained_weights(tmp_path, "segment:1000")
    assert all(torch.equal(full[k], same[k]) for k in full)
    # segment:3 and window:3 are different truncations, so different training
    segment, window = (
        _trained_weights(tmp_path, "segment:3"),
        _trained_weights(tmp_path, "window:3"),
    )
    assert any(not torch.allclose(segment[k], window[k]) for k in segment)
    assert any(not torch.allclose(segment[k], full[k]) for k in segment)


def test_segment_with_sequence_reduction_is_one_clear_error(tmp_path) -> None:
    from rnnkit.errors import ConfigError

    with pytest.raises(ConfigError, match="--loss-reduction sequence needs whole sequences"):
        _trained_weights(tmp_path, "segment:4", loss_reduction="sequence")
