#!/bin/sh
# Word-level language model on the Penn Treebank, the configurations of Zaremba, Sutskever
# & Vinyals (2014): train, then the test perplexity (runs/<config>/test.json).
#
#   recipes/ptb_lm/run.sh [small|medium] [more rnnkit train options]
#
# small:  2 x 200 LSTM, no dropout, 13 epochs, lr 1 halved after every epoch from the 5th on
# medium: 2 x 650 LSTM, dropout 0.5, 39 epochs, lr 1 times 0.8 after every epoch from the 7th
# Both: SGD, batch 20 streams, clip the gradient norm at 5, </s> after every sentence with
# the state carried across sentences, the corpus's own <unk>.
# The paper's loss is summed over the unrolled steps (averaged over the batch); rnnkit's
# is the mean per word. The same update in rnnkit's terms: the learning rate times the
# unrolled steps and the clipping norm divided by them (lr 20, clip 0.25 for small).
set -eu
# Running again replaces the run, unless the options continue it (--resume).
case " $* " in *" --resume "*) replace="" ;; *) replace="--overwrite" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$here/../../.venv/bin/python}
config=${1:-small}
[ $# -gt 0 ] && shift
case $config in
small) model="--hidden 200 --embedding 200 --dropout 0 --bptt segment:20 --init-range 0.1"
       schedule="--lr 20 --clip-norm 0.25 --lr-schedule step:4:0.5 --epochs 13" ;;
medium) model="--hidden 650 --embedding 650 --dropout 0.5 --bptt segment:35 --init-range 0.05"
        schedule="--lr 35 --clip-norm 0.142857 --lr-schedule step:6:0.8 --epochs 39" ;;
*) echo "run.sh: unknown configuration '$config' (small or medium)" >&2; exit 2 ;;
esac
data=$here/data
out=$here/runs/$config
# The paper's models have no other dropout than --dropout: the lm task's own defaults of
# locked and output dropout are turned off.
# shellcheck disable=SC2086  # $model, $schedule and $replace are lists of options
"$PYTHON" -m rnnkit train --task lm --unit word --doc-boundary eos \
    --train "$data/ptb.train.txt" --valid "$data/ptb.valid.txt" --out "$out" \
    --cell lstm --layers 2 $model --locked-dropout 0 --output-dropout 0 \
    --batch-size 20 --optimizer sgd $schedule $replace "$@"
"$PYTHON" -m rnnkit evaluate --checkpoint "$out" --data "$data/ptb.test.txt" --json \
    > "$out/test.json"
cat "$out/test.json"
