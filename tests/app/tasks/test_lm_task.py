"""The lm task pipeline: train_lm / evaluate_lm / load_lm agreement,
exact resume of sequence-mode training, and the errors of incompatible run directories."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.lm import evaluate_lm, load_lm, train_lm
from rnnkit.app.tasks.lm_text import line_logprobs
from rnnkit.data.vocab import EOS_ID
from rnnkit.errors import CheckpointError
from rnnkit.training.checkpoint import atomic_write_json
from rnnkit.training.manifest import write_manifest

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "hat"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    # Tiny models: threads only add contention (and time) on a shared machine.
    yield


def corpus(lines=80, seed=0):
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + "\n" for _ in range(lines)
    )


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "train.txt").write_text(corpus(80, 0), encoding="utf-8")
    (d / "valid.txt").write_text(corpus(12, 1), encoding="utf-8")
    return d


def tiny(texts, out=None, **changes):
    values = dict(
        train=str(texts / "train.txt"),
        out=str(out or texts / "run"),
        hidden=12,
        embedding=8,
        batch_size=4,
        bptt="segment:16",
        steps=4,
        ngram_order=3,
    )
    return TrainConfig(**{**values, **changes}).validate()


@pytest.fixture(scope="module")
def run(texts, tmp_path_factory):
    """One trained run with a separate validation file (4 steps, one validation)."""
    out = tmp_path_factory.mktemp("run")
    cfg = tiny(texts, out, valid=str(texts / "valid.txt"), dropout=0.1)
    return cfg, out, train_lm(cfg, quiet=True)


# -- train / evaluate / load agree -------------------------------------------------------------
def test_run_directory_and_summary(run):
    _cfg, out, summary = run
    for name in ("config.json", "vocab.json", "model.safetensors", "latest.json"):
        assert (out / name).is_file(), name
    assert summary["steps"] == 4 and summary["valid"]["step"] == 4
    valid, ngram = summary["valid"], summary["ngram"]
    assert valid["perplexity"] == pytest.approx(math.exp(valid["loss_nats"]))
    assert valid["bits_per_char"] == pytest.approx(valid["loss_nats"] / math.log(2))
    assert ngram["order"] == 3 and math.isfinite(ngram["loss_nats"])
    assert json.loads((out / "summary.json").read_text()) == summary


def test_recurrent_and_ngram_are_scored_on_the_same_tokens(run, texts):
    _, _, summary = run
    assert summary["ngram"]["tokens"] == summary["valid"]["tokens"]
    # every character of the validation text but the first, whatever the rows leave over
    text = (texts / "valid.txt").read_text(encoding="utf-8")
    assert summary["valid"]["tokens"] == len(text) - 1
    for batch_size in (3, 7):
        metrics = evaluate_lm(run[1], str(texts / "valid.txt"), batch_size=batch_size)
        assert metrics["tokens"] == metrics["ngram"]["tokens"] == len(text) - 1


def test_evaluate_on_the_validation_file_reproduces_the_summary(run, texts):
    _cfg, out, summary = run
    metrics = evaluate_lm(out, str(texts / "valid.txt"))
    assert metrics["tokens"] == summary["valid"]["tokens"]
    assert metrics["loss_nats"] == pytest.approx(summary["valid"]["loss_nats"], rel=1e-6)
    assert metrics["ngram"] == pytest.approx(summary["ngram"], rel=1e-9)


def test_load_lm_gives_the_saved_weights_in_eval_mode(run):
    cfg, out, _ = run
    loaded_cfg, vocab, model = load_lm(out)
    assert loaded_cfg == cfg and not model.training
    saved = load_file(str(out / "model.safetensors"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name])
    assert len(vocab) == model.vocab_size


def test_unknown_characters_are_scored_as_unk(run, tmp_path):
    _, out, _ = run
    (tmp_path / "odd.txt").write_text("the cat sat on the ☃ mat\nand ran\n")
    metrics = evaluate_lm(out, str(tmp_path / "odd.txt"))
    assert metrics["tokens"] > 0 and math.isfinite(metrics["loss_nats"])
    # and counted, as predict's "unknown" counts them: those the vocabulary lacks
    _, vocab, _ = load_lm(out)
    text = (tmp_path / "odd.txt").read_text()
    assert metrics["unknown"] == sum(c not in vocab.stoi for c in text) > 0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_line_boundaries_reset_the_state_in_evaluation_as_in_training(texts, tmp_path, batch_size):
    """``--doc-boundary line``: training zeroes the state at each line start; evaluation
    (and so validation, early stopping, the summary) reads the text so too, every token
    but the first scored. The oracle: each line ``</s> w…`` of each row run alone from a
    zero state."""
    cfg = tiny(texts, tmp_path / "run", doc_boundary="line", bptt="segment:5", steps=2)
    train_lm(cfg, quiet=True)
    _, vocab, model = load_lm(tmp_path / "run")
    model.eval()
    lines = (texts / "valid.txt").read_text().splitlines()
    stream = [t for line in lines for t in [*vocab.encode(line), EOS_ID]]
    metrics = evaluate_lm(tmp_path / "run", str(texts / "valid.txt"), batch_size=batch_size)
    # the rows as evaluation lays them out: row b the inputs b·L … (b+1)·L − 1, each row
    # from a zero state too, the last row on to the end (the tokens the rows leave over)
    rows = min(batch_size, (len(stream) - 1) // 5)
    L = (len(stream) - 1) // rows
    assert rows == 1 or (len(stream) - 1) % rows  # a tail is left over
    nats = []
    with torch.no_grad():
        for b in range(rows):
            end = (b + 1) * L if b < rows - 1 else len(stream) - 1
            cuts = [i for i in range(b * L + 1, end) if stream[i] == EOS_ID]
            for lo, hi in zip([b * L, *cuts], [*cuts, end], strict=True):
                inputs = torch.tensor([stream[lo:hi]])
                log_probs = model(inputs).logits[0].double().log_softmax(-1)
                nats += [-log_probs[t, stream[lo + t + 1]].item() for t in range(hi - lo)]
    assert metrics["tokens"] == len(nats) == len(stream) - 1  # every token but the first
    assert metrics["loss_nats"] == pytest.approx(sum(nats) / len(nats), rel=1e-6)


def test_a_line_is_what_predict_reads_as_one_form_feeds_and_separators_included(tmp_path):
    """Lines are split at "\n" only, as ``predict`` reads them: a form feed (Python
    sources hold them) and U+2028 are characters of the vocabulary, not line ends."""
    text = "ab\x0ccd\nef\u2028gh\rab\ncd\n" * 20
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    cfg = tiny(tmp_path, tmp_path / "run", unit="char", bptt="full", steps=2, batch_size=4)
    train_lm(cfg, quiet=True)
    _, vocab, model = load_lm(tmp_path / "run")
    assert {"\x0c", "\u2028"} <= set(vocab.itos)
    (tmp_path / "v.txt").write_text("ab\x0ccd\nef\u2028gh\n", encoding="utf-8")
    metrics = evaluate_lm(tmp_path / "run", str(tmp_path / "v.txt"))
    assert metrics["tokens"] == 12  # 2 lines of 5 characters, each with its </s>
    records = line_logprobs(cfg, vocab, model, ["ab\x0ccd", "ef\u2028gh"])
    assert [r["unknown"] for r in records] == [0, 0]
    assert [len(r["tokens"]) for r in records] == [6, 6]
    nats = sum(r["nats"] for r in records)
    assert nats / 12 == pytest.approx(metrics["loss_nats"], rel=1e-5)
    # a lone "\r" ends a line for predict's reader, and so here: never a character
    assert "\r" not in vocab.itos
    (tmp_path / "cr.txt").write_bytes("ab\x0ccd\ref\u2028gh\n".encode())
    assert evaluate_lm(tmp_path / "run", str(tmp_path / "cr.txt")) == metrics


# -- exact resume -------------------------------------------------------------------------------
def snapshot_weights(out):
    pointer = json.loads((out / "latest.json").read_text())
    return pointer["step"], load_file(str(out / pointer["snapshot"] / "model.safetensors"))


@pytest.mark.parametrize(
    "changes",
    [
        dict(bptt="window:3", cell="gru", dropout=0.2),
        dict(bptt="segment:8", doc_boundary="line", dropout=0.2, layers=2),
    ],
    ids=["window-sequences", "segment-streams-lines"],
)
def test_train_lm_resume_equals_one_run(texts, tmp_path, changes):
    straight = train_lm(tiny(texts, tmp_path / "a", steps=9, **changes), quiet=True)
    train_lm(tiny(texts, tmp_path / "b", steps=4, **changes), quiet=True)
    resumed = train_lm(tiny(texts, tmp_path / "b", steps=9, **changes), resume=True, quiet=True)
    assert straight["steps"] == resumed["steps"] == 9
    (step_a, a), (step_b, b) = snapshot_weights(tmp_path / "a"), snapshot_weights(tmp_path / "b")
    assert step_a == step_b == 9
    for name in a:
        assert torch.equal(a[name], b[name]), name


# -- incompatible run directories ----------------------------------------------------------------
def test_resume_with_another_model_is_refused(run, texts):
    cfg, _out, _ = run
    changed = TrainConfig(**{**cfg.to_dict(), "hidden": 16})
    with pytest.raises(CheckpointError, match=r"config\.json.*'hidden'.*incompatible"):
        train_lm(changed, resume=True, quiet=True)


def test_load_lm_refuses_a_vocabulary_of_another_size(run, tmp_path):
    _, out, _ = run
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "vocab.json", "model.safetensors"):
        (copy / name).write_bytes((out / name).read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["vocab_size"] += 1
    atomic_write_json(copy / "config.json", config)
    write_manifest(copy)  # as a forger would: the run's own checks must still catch it
    with pytest.raises(CheckpointError, match=r"vocab\.json: \d+ tokens but config\.json"):
        load_lm(copy)


def test_load_lm_refuses_weights_of_another_width(run, tmp_path):
    _, out, _ = run
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "vocab.json", "model.safetensors"):
        (copy / name).write_bytes((out / name).read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["config"]["hidden"] = 10
    atomic_write_json(copy / "config.json", config)
    write_manifest(copy)  # as a forger would: the run's own checks must still catch it
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*another configuration"):
        load_lm(copy)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda c: c["config"].update(hiden=3), "unknown keys"),
        (lambda c: c["config"].update(steps="4"), "steps must be int"),
        (lambda c: c.update(format_version=99), "not an rnnkit checkpoint"),
        (lambda c: c["config"].update(task="tag"), "not 'lm'"),
    ],
)
def test_load_lm_refuses_a_bad_config_json(run, tmp_path, edit, words):
    _, out, _ = run
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "vocab.json", "model.safetensors"):
        (copy / name).write_bytes((out / name).read_bytes())
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    atomic_write_json(copy / "config.json", config)
    write_manifest(copy)  # as a forger would: the run's own checks must still catch it
    with pytest.raises(CheckpointError, match=rf"config\.json.*{words}"):
        load_lm(copy)


def test_load_lm_of_a_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_lm(tmp_path / "nope")


def test_load_lm_of_a_file_names_it_a_file_and_its_folder(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(CheckpointError) as refused:
        load_lm(weights)
    assert str(refused.value) == (
        f"{weights}: not a directory; --checkpoint names a run directory (here perhaps {tmp_path})"
    )
