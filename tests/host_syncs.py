"""The torch functions and tensor methods that read device values on the host: each waits
for the device on a GPU. Shared by the tests' counters (``tests/training/host_reads.py``,
``tests/generation/op_counts.py``); importable from any test: this directory is on the
path for the root conftest."""

from __future__ import annotations

READS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "__format__",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
    }
)
