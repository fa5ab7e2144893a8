#!/bin/sh
# Grapheme-to-phoneme conversion on CMUdict with the default encoder-decoder (attention):
# train, then the test figures (runs/g2p/test.json): token_error_rate is the phoneme error
# rate, 1 - exact_match the word error rate.
#
#   recipes/g2p_cmudict/run.sh [more rnnkit train options, e.g. --max-time 2700]
set -eu
# Running again replaces the run, unless the options continue it (--resume).
case " $* " in *" --resume "*) replace="" ;; *) replace="--overwrite" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
data=$here/data
out=$here/runs/g2p
"$PYTHON" -m rnnkit train --task seq2seq --source-unit char --target-unit word \
    --train "$data/train.tsv" --valid "$data/valid.tsv" --out "$out" $replace "$@"
"$PYTHON" -m rnnkit evaluate --checkpoint "$out" --data "$data/test.tsv" --json \
    > "$out/test.json"
cat "$out/test.json"
