#!/usr/bin/env bash
# Record real system-call sessions with strace, train the events model, score, report.
#
#   examples/syscalls/record.sh [--out runs/syscalls] [--normal-per-kind 36] ...
#
# Installs strace with apt-get when it is missing (as root), then runs run.py with the
# project's virtual environment (make it first: `make test` or `make run`).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v strace >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq strace
    else
        echo "strace is not installed: install it (e.g. sudo apt-get install strace)" >&2
        exit 1
    fi
fi
PYTHON=.venv/bin/python
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" examples/syscalls/run.py "$@"
