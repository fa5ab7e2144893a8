"""``rnnkit.nn`` as a program spells ``torch.nn``: its names, its submodules and the star
import are torch's own objects, with the six recurrent classes replaced."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from unittest import mock

import torch
from torch.nn.utils.rnn import pack_padded_sequence as torchs_pack

import rnnkit.nn as knn


def test_submodules_imported_by_their_rnnkit_names_are_torchs_own():
    # a program with every "torch.nn" replaced: one Parameter class, one PackedSequence
    import rnnkit.nn.functional as F
    from rnnkit.nn.parameter import Parameter
    from rnnkit.nn.utils import rnn as rnn_utils
    from rnnkit.nn.utils.rnn import PackedSequence, pack_padded_sequence

    assert Parameter is torch.nn.Parameter and F is torch.nn.functional
    assert rnn_utils is torch.nn.utils.rnn and pack_padded_sequence is torchs_pack
    assert PackedSequence is torch.nn.utils.rnn.PackedSequence

    class Scaled(knn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = knn.LSTM(3, 4, batch_first=True)
            self.gain = Parameter(torch.ones(4))

    model = Scaled()
    assert "gain" in dict(model.named_parameters()) and "gain" in model.state_dict()
    packed = pack_padded_sequence(torch.randn(2, 5, 3), torch.tensor([5, 2]), batch_first=True)
    output, _ = model.lstm(packed)
    assert isinstance(output, PackedSequence)


def test_the_star_imports_bind_torchs_names_with_the_drop_ins_after_them():
    names: dict = {}
    exec("from torch.nn import *\nfrom rnnkit.nn import *", names)
    assert names["Linear"] is torch.nn.Linear and names["functional"] is torch.nn.functional
    assert names["LSTM"] is knn.LSTM and names["GRUCell"] is knn.GRUCell
    # a package's star import is torch's; rnnkit.nn's own stays its six classes and two
    # functions (help(rnnkit.nn) documents what __all__ names)
    exec("from rnnkit.nn.utils import *", names)
    assert names["clip_grad_norm_"] is torch.nn.utils.clip_grad_norm_
    assert len(knn.__all__) == 8


def test_a_patch_through_an_rnnkit_name_patches_torchs_module_and_puts_it_back():
    # weight_norm and rnn are also the names of submodules of torch.nn.utils
    originals = {n: getattr(torch.nn.utils, n) for n in ("clip_grad_norm_", "weight_norm", "rnn")}
    for name, original in originals.items():
        with mock.patch(f"rnnkit.nn.utils.{name}") as patched:
            assert getattr(torch.nn.utils, name) is patched
        assert getattr(torch.nn.utils, name) is original, name
    assert importlib.util.find_spec("rnnkit.nn.utils") is not None


def test_a_submodule_torch_had_not_imported_is_torchs_or_not_found_never_a_copy():
    # a fresh interpreter: torch.nn.utils.prune is not imported with torch
    code = (
        "import sys, rnnkit.nn\n"
        "before = set(sys.modules)\n"
        "try:\n"
        "    import rnnkit.nn.utils.prune\n"
        "except ModuleNotFoundError as e:\n"
        "    print('refused:', e)\n"
        "from rnnkit.nn.utils import prune\n"
        "import torch.nn.utils.prune as torchs\n"
        "import rnnkit.nn.utils.prune as again\n"  # entered by the import above
        "print('same:', prune is torchs is again)\n"
        "print('new:', sorted(m for m in set(sys.modules) - before if not m.startswith('torch')))\n"
        "print('path:', hasattr(rnnkit.nn, '__path__'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "refused: No module named 'rnnkit.nn.utils.prune'",
        "same: True",
        "new: ['rnnkit.nn.utils.prune']",  # the alias of torch's, no second copy
        "path: False",
    ], out.stdout + out.stderr


def test_importing_rnnkit_nn_adds_modules_under_rnnkits_name_only():
    aliases = [name for name, module in sys.modules.items() if name.startswith("rnnkit.nn.")]
    assert "rnnkit.nn.functional" in aliases and "rnnkit.nn.utils.rnn" in aliases
    for name in aliases:
        module = sys.modules[name]
        torchs = sys.modules["torch.nn." + name.removeprefix("rnnkit.nn.")]
        assert module is torchs or module._package is torchs, name
