"""Programs written for ``torch.nn`` run unchanged with ``from rnnkit import nn``: each
program of ``tests/layers/programs`` runs as written and again with only its import line
swapped, and the two runs agree (losses, perplexity, sampled words, CRF scores and
Viterbi paths; saving and loading the whole model under ``weights_only=True``)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
