"""Programs written for ``torch.nn`` run unchanged with ``from rnnkit import nn``: each
program of ``tests/layers/programs`` runs as written and again with only its import line
swapped, and the two runs agree (losses, perplexity, sampled words, CRF scores and
Viterbi paths; saving and loading the whole model under ``weights_only=True``; LBFGS
over hand-unrolled cells and their free-running predictions; packed batches of names and
their predicted classes; an attention encoder-decoder's losses, random teacher-forcing
choices and greedy translations; a forecaster trained with dropout between layers over
packed series, its best state dict saved and loaded into a fresh model; a CRNN
over a convolution's non-contiguous columns with a CTC loss and greedy CTC decoding; a
regressor trained through activation checkpointing with ``weight_norm`` and
``spectral_norm`` on recurrent weights, parameter groups, AdamW with a schedule and a
moving average of the weights; a character model used under ``inference_mode``, traced,
compiled and quantized). ``test_dropin_distributed.py`` runs a data-parallel script.

Tolerances follow the dtype: a float64 program agrees to ~1e-9 relative (rnnkit and
torch sum the same products in other orders), a float32 one to ~1e-5."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

PROGRAMS = Path(__file__).parent / "programs"
TORCH_IMPORT = "from torch import nn\n"


def _run(name: str, swapped: bool, *args):
    source = (PROGRAMS / f"{name}.py").read_text()
    assert source.count(TORCH_IMPORT) == 1
    if swapped:
        source = source.replace(
            TORCH_IMPORT, "from rnnkit import nn  # was: from torch import nn\n"
        )
    namespace: dict = {"__name__": f"program_{name}_{int(swapped)}"}
    # A pickled model names its class by module: make the program importable by that name.
    import sys
    import types

    module = types.ModuleType(namespace["__name__"])
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, str(PROGRAMS / f"{name}.py"), "exec"), module.__dict__)
        return module.main(*args)
    finally:
        del sys.modules[module.__name__]


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU", "RNN_TANH"])
def test_word_language_model(tmp_path, rnn_type):
    kind = "RNN" if rnn_type == "RNN_TANH" else rnn_type
    theirs = _run("word_language_model", False, kind, tmp_path / "torch.pt")
    ours = _run("word_language_model", True, kind, tmp_path / "rnnkit.pt")
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-9, abs=1e-12)
    assert ours["ppl"] == pytest.approx(theirs["ppl"], rel=1e-9)
    assert ours["words"] == theirs["words"]


@pytest.mark.usefixtures("single_thread")
def test_bilstm_crf():
    theirs = _run("bilstm_crf", False)
    ours = _run("bilstm_crf", True)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-5)
    assert ours["score"] == pytest.approx(theirs["score"], rel=1e-5)
    assert ours["path"] == theirs["path"]


@pytest.mark.usefixtures("single_thread")
def test_sine_wave_lstm_cells_with_lbfgs():
    theirs = _run("sine_wave_lstm_cells", False)
    ours = _run("sine_wave_lstm_cells", True)
    assert len(ours["losses"]) == len(theirs["losses"]) > 3  # LBFGS's closure calls
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-9)
    assert ours["test_losses"] == pytest.approx(theirs["test_losses"], rel=1e-9)
    for mine, reference in zip(ours["predictions"], theirs["predictions"], strict=True):
        assert mine == pytest.approx(reference, rel=1e-9, abs=1e-12)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_name_classifier_packed(dtype, rel):
    theirs = _run("name_classifier_packed", False, dtype)
    ours = _run("name_classifier_packed", True, dtype)
    assert min(len(n) for n in ours["names"]) == 1  # a length-1 name in the batch
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=rel)
    assert ours["probabilities"] == pytest.approx(theirs["probabilities"], rel=rel, abs=rel)
    assert ours["predicted"] == theirs["predicted"]
    assert ours["accuracy"] == theirs["accuracy"]


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_seq2seq_attention(dtype, rel):
    theirs = _run("seq2seq_attention", False, dtype)
    ours = _run("seq2seq_attention", True, dtype)
    assert True in theirs["forced"] and False in theirs["forced"]  # both ways trained
    assert ours["forced"] == theirs["forced"]  # the same random draws in between
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=rel)
    assert ours["tokens"] == theirs["tokens"]
    assert ours["exact"] == theirs["exact"]
    assert ours["scores"] == pytest.approx(theirs["scores"], rel=rel)
    assert ours["attentions"] == pytest.approx(theirs["attentions"], rel=rel, abs=rel)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_series_forecaster(tmp_path, dtype, rel):
    """Dropout between layers over packed series in training draws torch's masks, so the
    trained weights, the loader's later shuffles and every later random number agree."""
    theirs = _run("series_forecaster", False, tmp_path / "torch.pt", dtype)
    ours = _run("series_forecaster", True, tmp_path / "rnnkit.pt", dtype)
    assert ours["orders"] == theirs["orders"]  # each epoch's shuffle
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=rel)
    assert ours["valid_losses"] == pytest.approx(theirs["valid_losses"], rel=rel)
    assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=rel)
    assert ours["predictions"] == pytest.approx(theirs["predictions"], rel=rel, abs=rel)
    assert ours["next_random"] == theirs["next_random"]


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    ("dtype", "epochs", "rel"),
    # float32 over 40 steps: after ~100 steps of Adam the two runs' rounding, amplified by
    # training, reaches ~1e-5 (not a difference of function: float64 agrees to ~1e-13)
    [(torch.float32, 40, 1e-5), (torch.float64, 150, 1e-9)],
)
def test_crnn_ctc(dtype, epochs, rel):
    theirs = _run("crnn_ctc", False, dtype, epochs)
    ours = _run("crnn_ctc", True, dtype, epochs)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=rel)
    # log-probabilities: an absolute error on a log is a relative one on the probability
    assert ours["log_probs"] == pytest.approx(theirs["log_probs"], rel=0, abs=rel)
    assert ours["decoded"] == theirs["decoded"]
    assert ours["correct"] == theirs["correct"]
    if epochs == 150:
        assert ours["correct"] > 0  # trained far enough to read some lines


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    ("dtype", "use_reentrant", "schedule", "rel"),
    [
        (torch.float32, False, "onecycle", 1e-5),
        (torch.float64, False, "onecycle", 1e-9),
        (torch.float64, True, "lambda", 1e-9),
    ],
)
def test_memory_and_optimizer_idioms(dtype, use_reentrant, schedule, rel):
    """Checkpointing replays the dropout masks between the LSTM's layers, weight_norm and
    spectral_norm run as often as on torch's layers, and the moving average (a deep copy
    of the parametrized model) averages and reloads the same weights."""
    args = (dtype, use_reentrant, schedule)
    theirs = _run("memory_optimizer_idioms", False, *args)
    ours = _run("memory_optimizer_idioms", True, *args)
    assert ours["groups"] == theirs["groups"] and min(theirs["groups"]) > 0
    assert ours["rates"] == theirs["rates"]
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=rel)
    assert ours["vector_sums"] == pytest.approx(theirs["vector_sums"], rel=rel)
    # AdamW normalises each gradient: a weight whose gradient is ~0 moves by what
    # rounding leaves of it, so the weights are compared to an absolute tolerance too
    assert ours["final_vector"] == pytest.approx(theirs["final_vector"], rel=rel, abs=rel)
    assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=rel)
    assert ours["averaged"] == pytest.approx(theirs["averaged"], rel=rel, abs=rel)
    for run in (ours, theirs):  # the average's state dict predicts as the average does
        assert run["reloaded"] == pytest.approx(run["averaged"], rel=1e-12, abs=1e-12)
        assert run["n_averaged"] == len(run["losses"])
    assert ours["state_keys"] == theirs["state_keys"]
    assert any("parametrizations.weight_hh_l0.original" in k for k in ours["state_keys"])
    assert ours["next_random"] == theirs["next_random"]


def _run_recording(name: str, swapped: bool, *args):
    """``_run``, and the warnings the program gave (torch's own notices: TorchScript's and
    quantization's deprecations), as (category, first line)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(name, swapped, *args)
    said = {(w.category.__name__, str(w.message).splitlines()[0]) for w in caught}
    return result, sorted(said)


def _compile_backend() -> str:
    """torch.compile's default backend generates C++: without a compiler, graph capture
    only."""
    return "inductor" if shutil.which("c++") or shutil.which("g++") else "aot_eager"


def _same_inference(ours, theirs, rel):
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=rel)
    assert ours["batch_loss"] == pytest.approx(theirs["batch_loss"], rel=rel)
    for key in ("h_n", "c_n", "packed_logits", "eager", "traced", "compiled"):
        assert ours[key] == pytest.approx(theirs[key], rel=rel, abs=rel), key
    assert ours["lengths"] == theirs["lengths"]
    assert ours["greedy"] == theirs["greedy"] and ours["sampled"] == theirs["sampled"]


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_inference_idioms(dtype, rel):
    """inference_mode with the state carried, a traced and a compiled model: the same
    results, and no warning that torch's layers do not give."""
    backend = _compile_backend()
    theirs, their_warnings = _run_recording("inference_idioms", False, dtype, False, backend)
    ours, our_warnings = _run_recording("inference_idioms", True, dtype, False, backend)
    _same_inference(ours, theirs, rel)
    for run in (ours, theirs):  # the traced and compiled model compute the eager one
        assert run["traced"] == pytest.approx(run["eager"], rel=rel, abs=rel)
        assert run["compiled"] == pytest.approx(run["eager"], rel=rel, abs=rel)
    assert ours["next_random"] == theirs["next_random"]
    # nothing torch's layers do not say (torch's run, first, may also give notices that
    # torch gives once per process: "`torch.jit.script_method` is deprecated")
    assert set(our_warnings) <= set(their_warnings)


@pytest.mark.usefixtures("single_thread")
def test_inference_idioms_with_torchs_quantize_dynamic(monkeypatch):
    """torch's own ``quantize_dynamic(model, {nn.LSTM, nn.Linear})``: a difference that
    docs/torch-nn.md states. torch's function looks classes up by their exact type, so
    the drop-in stays a float LSTM (the Linear is quantized); after
    ``rnnkit.nn.register_quantization()`` the program runs as with torch's layers."""
    from torch.ao.quantization import quantization_mappings as qm

    from rnnkit import nn as knn

    args = (torch.float32, True, _compile_backend())
    theirs, their_warnings = _run_recording("inference_idioms", False, *args)
    unregistered, _ = _run_recording("inference_idioms", True, *args)
    _same_inference(unregistered, theirs, 1e-5)
    assert [t.rsplit(".", 1)[1] for t in theirs["quantized_types"]] == [
        "Embedding",
        "LSTM",
        "Linear",
    ]
    assert theirs["quantized_types"][1].startswith("torch.ao.nn.quantized.dynamic.")
    assert unregistered["quantized_types"][1] == "rnnkit.nn.LSTM"  # left as it was
    assert unregistered["quantized_types"][2] == theirs["quantized_types"][2]
    assert unregistered["quantized"] != pytest.approx(theirs["quantized"], rel=1e-5, abs=1e-5)

    # torch's table replaced by a copy: the registration leaks nothing out of this test
    table = dict(qm.DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)
    monkeypatch.setattr(qm, "DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS", table)
    knn.register_quantization()
    ours, our_warnings = _run_recording("inference_idioms", True, *args)
    _same_inference(ours, theirs, 1e-5)
    assert ours["quantized_types"] == theirs["quantized_types"]
    assert ours["quantized"] == pytest.approx(theirs["quantized"], rel=1e-5, abs=1e-5)
    assert ours["next_random"] == theirs["next_random"]
    assert set(our_warnings) <= set(their_warnings)
