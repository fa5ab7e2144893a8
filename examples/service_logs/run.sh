#!/usr/bin/env bash
# Learn normal from the recorded PostgreSQL log, then score the test sessions with the
# key-sequence model (LSTM, its 5-gram beside it) and the parameter-value model.
#
#   examples/service_logs/record.sh          # first: OUT/recording/{postgres.log,labels.tsv}
#   examples/service_logs/run.sh [OUT] [SEED]
#
# A few minutes on 2 CPU cores. Prints the table of docs/anomaly.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/service_logs}
SEED=${2:-0}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
rnnkit() { "$PY" -m rnnkit "$@"; }

# One session per client connection (its application_name), each event a Drain template of
# the message, each event's numbers (duration, ids, session time...) and the seconds since
# the connection's previous line (--overwrite: a rerun replaces the last run's sessions).
rnnkit sessions --from log "$OUT/recording/postgres.log" --out "$OUT/all.jsonl" --overwrite \
    --log-format '<Date> <Time> <Zone> [<Pid>] <Session> <Content>' --session-field Session \
    --params --time-field Date,Time
"$PY" examples/service_logs/compare.py split --out "$OUT" --seed "$SEED"
data=(--train "$OUT/train.jsonl" --valid "$OUT/valid.jsonl" --seed "$SEED" --overwrite --quiet)
# --score max: the verdict score of the README's table (the task's default is now combined).
rnnkit train --task events "${data[@]}" --out "$OUT/events" \
    --hidden 64 --embedding 32 --epochs "${EPOCHS:-30}" --batch-size 16 --lr 0.01 --bptt full \
    --score max
rnnkit train --task params "${data[@]}" --out "$OUT/params" \
    --cell gru --hidden 16 --epochs "${EPOCHS:-30}" --batch-size 16 --lr 0.01
rnnkit evaluate --checkpoint "$OUT/events" --data "$OUT/test.jsonl" --json > "$OUT/eval_events.json"
rnnkit evaluate --checkpoint "$OUT/params" --data "$OUT/test.jsonl" --json > "$OUT/eval_params.json"
rnnkit score --checkpoint "$OUT/events" --params "$OUT/params" --ngram --top 3 \
    --data "$OUT/test.jsonl" > "$OUT/scores.jsonl"
"$PY" examples/service_logs/compare.py table --out "$OUT"
