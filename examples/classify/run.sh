#!/usr/bin/env bash
# Sequence classification on real text that ships with Python: which standard-library
# package (asyncio, email, multiprocessing, unittest, xml) does a source line come from?
# Character-level bidirectional LSTM, max pooling, feed-forward head; scored on lines of
# held-out files; trained until validation stops improving. About 1.5 minutes on 2 CPU cores.
#   POOLINGS="max mean last" examples/classify/run.sh   # compare the poolings
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/examples/classify}
POOLINGS=${POOLINGS:-max}
# Small models gain nothing from a second intra-op thread; on a busy machine it costs.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

mkdir -p "$OUT"
"$PY" -c "from rnnkit.data.generated import stdlib_classification_corpus as c; c('$OUT/data')"

for pooling in $POOLINGS; do
  "$PY" -m rnnkit train --task classify --train "$OUT/data/train.tsv" \
    --valid "$OUT/data/valid.tsv" --out "$OUT/$pooling" --unit char --max-len 80 \
    --hidden 64 --embedding 32 --bidirectional --pooling "$pooling" --dropout 0.3 \
    --batch-size 32 --seed 0 --quiet --overwrite  # until validation stops improving; a rerun replaces the run
  "$PY" -m rnnkit evaluate --checkpoint "$OUT/$pooling" --data "$OUT/data/test.tsv" --json \
    > "$OUT/$pooling.test.json"
done

"$PY" - "$OUT" $POOLINGS <<'PY'
import json, sys

out, poolings = sys.argv[1], sys.argv[2:]
for pooling in poolings:
    m = json.load(open(f"{out}/{pooling}.test.json"))
    print(f"pooling {pooling:<4}  accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}")
    width = max(map(len, m["labels"]))
    print(" " * (width + 2) + " ".join(f"{l[:6]:>6}" for l in m["labels"]) + "   (predicted)")
    for label, row in zip(m["labels"], m["confusion_matrix"]):
        print(f"  {label:<{width}} " + " ".join(f"{n:6d}" for n in row))
# The baselines, fitted on the same training lines (rnnkit evaluate scores them too).
for name, b in m["baselines"].items():
    print(f"baseline {b['kind']}: accuracy {b['accuracy']:.4f}  macro-F1 {b['macro_f1']:.4f}")
print(f"test lines: {m['examples']}")
PY
