#!/bin/sh
# Part-of-speech tagging of the Brown corpus with the default BiLSTM tagger and the
# character-level word encoder: train, then the test accuracy (runs/tagger/test.json).
#
#   recipes/pos_brown/run.sh [more rnnkit train options, e.g. --max-time 2700]
set -eu
# Running again replaces the run, unless the options continue it (--resume).
case " $* " in *" --resume "*) replace="" ;; *) replace="--overwrite" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
data=$here/data
out=$here/runs/tagger
"$PYTHON" -m rnnkit train --task tag --char-rnn \
    --train "$data/train.tsv" --valid "$data/valid.tsv" --out "$out" $replace "$@"
"$PYTHON" -m rnnkit evaluate --checkpoint "$out" --data "$data/test.tsv" --json \
    > "$out/test.json"
cat "$out/test.json"
