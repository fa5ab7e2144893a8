#!/usr/bin/env bash
# Encoder–decoder with attention on date conversion ("2024-03-05" → "5 March 2024"),
# then string reversal with attention, without attention, and decoder-only.
# Figures this script reached are in README.md beside it. About 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
RNNKIT=${RNNKIT:-.venv/bin/rnnkit}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/seq2seq}
# Small ops: one intra-op thread is faster than two on a busy 2-core machine.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"

gen() { "$PY" -m rnnkit.data.generated_pairs "$@"; }
gen date --n 4000 --seed 0 --out "$OUT/dates-train.tsv"
gen date --n 500 --seed 1 --out "$OUT/dates-valid.tsv"
gen date --n 500 --seed 2 --out "$OUT/dates-test.tsv"
gen reverse --n 4000 --seed 0 --min-len 5 --max-len 15 --out "$OUT/reverse-train.tsv"
gen reverse --n 500 --seed 1 --min-len 5 --max-len 15 --out "$OUT/reverse-valid.tsv"
gen reverse --n 500 --seed 2 --min-len 5 --max-len 15 --out "$OUT/reverse-test.tsv"

# --overwrite: running the example again replaces its runs.
COMMON=(--task seq2seq --hidden 128 --embedding 32 --epochs 6 --batch-size 32 --lr 0.003
        --max-len 24 --quiet --overwrite)

echo "== dates: bidirectional LSTM encoder, additive attention, beam 5"
"$RNNKIT" train "${COMMON[@]}" --train "$OUT/dates-train.tsv" --valid "$OUT/dates-valid.tsv" \
    --out "$OUT/dates" --attention additive --bidirectional --beam 5
"$RNNKIT" evaluate --checkpoint "$OUT/dates" --data "$OUT/dates-test.tsv" --json
"$RNNKIT" generate --checkpoint "$OUT/dates" --input 2024-03-05

for variant in "attention:--attention additive" "no-attention:--attention none" \
               "decoder-only:--decoder-only --attention none"; do
    name=${variant%%:*}
    read -r -a options <<< "${variant#*:}"
    echo "== reverse, $name"
    "$RNNKIT" train "${COMMON[@]}" --train "$OUT/reverse-train.tsv" \
        --valid "$OUT/reverse-valid.tsv" --out "$OUT/reverse-$name" "${options[@]}"
    "$RNNKIT" evaluate --checkpoint "$OUT/reverse-$name" --data "$OUT/reverse-test.tsv" --json
done
