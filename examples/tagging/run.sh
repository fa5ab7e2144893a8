#!/usr/bin/env bash
# Sequence labelling on real text that ships with Python: every token of the standard
# library's sources tagged with its type and role, answers computed by `tokenize`.
# Trains a word-only tagger, the same with a character RNN per word, and a BIO span
# tagger; scores each on held-out files; prints one table. About a minute on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/examples/tagging}
# Small models gain nothing from a second intra-op thread; on a busy machine it costs.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Without dropout: the model of the README's table (the tag task's default is 0.5).
COMMON=(--hidden 64 --embedding 32 --dropout 0 --epochs 2 --batch-size 32 --seed 0 --quiet)

mkdir -p "$OUT"
"$PY" - "$OUT" <<'PY'
import sys
from rnnkit.data.generated import python_tagging_corpus

out = sys.argv[1]
python_tagging_corpus(f"{out}/types")             # KEYWORD OP NUMBER STRING COMMENT DEF CALL ATTR NAME
python_tagging_corpus(f"{out}/bio", scheme="bio")  # B-/I-CALL, B-/I-REF spans of dotted names
PY

run() {  # name data extra-options...
  local name=$1 data=$2
  shift 2
  "$PY" -m rnnkit train --task tag --train "$OUT/$data/train.tsv" --valid "$OUT/$data/valid.tsv" \
    --out "$OUT/$name" --overwrite "${COMMON[@]}" "$@"  # a rerun replaces the run
  "$PY" -m rnnkit evaluate --checkpoint "$OUT/$name" --data "$OUT/$data/test.tsv" --json \
    > "$OUT/$name.test.json"
}
run words types --no-char-rnn  # the tag task adds the character RNN by default
run chars types --char-rnn
run bio bio --no-char-rnn

"$PY" - "$OUT" <<'PY'
import json, sys
from collections import Counter, defaultdict
from rnnkit.data.tagged import read_token_tags

out = sys.argv[1]


def baseline(data):
    """Test accuracy of "every word gets its most frequent training tag" (unseen: overall)."""
    by_word, overall = defaultdict(Counter), Counter()
    for s in read_token_tags(f"{out}/{data}/train.tsv"):
        for w, t in zip(s.tokens, s.tags):
            by_word[w][t] += 1
            overall[t] += 1
    best = {w: c.most_common(1)[0][0] for w, c in by_word.items()}
    fallback = overall.most_common(1)[0][0]
    pairs = [(w, t) for s in read_token_tags(f"{out}/{data}/test.tsv") for w, t in zip(s.tokens, s.tags)]
    return sum(best.get(w, fallback) == t for w, t in pairs) / len(pairs)


print(f"{'run':<6} {'baseline':>8} {'accuracy':>8} {'OOV acc':>8} {'OOV':>5} {'macro-F1':>8} {'span F1':>8}")
for name, data in (("words", "types"), ("chars", "types"), ("bio", "bio")):
    m = json.load(open(f"{out}/{name}.test.json"))
    span = f"{m['span_f1']:8.4f}" if "span_f1" in m else f"{'-':>8}"
    print(f"{name:<6} {baseline(data):8.4f} {m['accuracy']:8.4f} {m['oov_accuracy']:8.4f} "
          f"{m['oov_tokens']:5d} {m['macro_f1']:8.4f} {span}")
print("test files; baseline = most frequent training tag per word")
PY
