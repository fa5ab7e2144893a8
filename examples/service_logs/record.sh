#!/usr/bin/env bash
# Record a real PostgreSQL server's log under normal client sessions and under faults.
#
#   examples/service_logs/record.sh [OUT] [drive.py options: --normal 400 --faults 25 ...]
#
# Installs PostgreSQL with apt-get when its server is missing (as root), then runs
# drive.py: a throwaway cluster in a temporary directory (Unix socket only), client
# sessions through psql, the server's log in OUT/recording/postgres.log (default OUT:
# runs/service_logs). About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/service_logs}
shift || true
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
    else
        echo "PostgreSQL is not installed: install it (e.g. sudo apt-get install postgresql)" >&2
        exit 1
    fi
fi
exec python3 examples/service_logs/drive.py --out "$OUT/recording" "$@"
