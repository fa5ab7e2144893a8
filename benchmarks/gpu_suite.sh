#!/bin/sh
# The prepared GPU run: every check that needs a CUDA device, in one call of a few
# minutes, its tables in one file (OUT/tables.md) and its logs beside it.
#
#   sh benchmarks/gpu_suite.sh OUT [ptb]
#
# 1. the CUDA test tier (pytest -m gpu);
# 2. benchmarks/gpu_check.py: every cell form on every path against the CPU float64
#    oracle, and layer speed against torch.nn (cuDNN);
# 3. benchmarks/bench_tasks.py --device cuda: every task's training step (and seq2seq
#    decoding) against the same model written plainly on torch.nn, both on the GPU;
# 4. with "ptb": the Penn Treebank small configuration (recipes/ptb_lm) on the GPU, to the
#    end or to the time left; its data must already be in recipes/ptb_lm/data (the
#    recipe's setup.sh, run where the corpus package can be installed).
#
# From the repository root, with a Python that has torch (PYTHON, default python3) and
# rnnkit's sources on the path (this script puts src/ first). Each part has a time limit
# and the Penn Treebank run gets what is left of BUDGET seconds (default 560), so that the
# whole run ends inside one 10-minute device call; a part that fails is recorded, and the
# next one runs.
set -u
out=${1:?usage: sh benchmarks/gpu_suite.sh OUT [ptb]}
ptb=${2:-}
PYTHON=${PYTHON:-python3}
budget=${BUDGET:-560}
start=$(date +%s)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
# The device returns at most 8 files from OUT: the machine, the build and each part's exit
# status share one (machine.txt, shown at the top of tables.md); the others are
# pytest_gpu.txt, gpu_check.json/.log, bench_tasks.json/.log, ptb_small.log, tables.md.
status="$out/machine.txt"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
    "$PYTHON" -c "import triton; print('triton', triton.__version__)" || true
    # what rnnkit imports (numpy, safetensors, tqdm; matplotlib for reports), the Triton
    # steps (triton) and the tier (pytest): a missing one is named here, not guessed at
    "$PYTHON" -c "import importlib.util as u; m=[n for n in ('numpy','safetensors','tqdm','matplotlib','triton','pytest') if u.find_spec(n) is None]; print('missing:', ' '.join(m) or 'none')"
} > "$out/machine.txt" 2>&1
# The compiled CPU loop, built once before the timed parts (the tier's CPU references
# would otherwise build it inside the tier's time limit: ~30 s on a fresh machine).
timeout 60 "$PYTHON" -m rnnkit build-native >> "$status" 2>&1
echo "build-native: exit $?" >> "$status"
# Only the files that hold gpu-marked tests: collecting all of tests/ imports test-only
# packages (hypothesis, scikit-learn, ...) that a GPU machine may lack, and one collection
# error stops the whole run before any test.
gpu_files=$(grep -rlE "pytest[.]mark[.]gpu" tests --include="test_*.py" | sort)
# shellcheck disable=SC2086  # the file list is split on purpose
timeout 200 "$PYTHON" -m pytest -v -rf --durations=15 -m gpu -p no:cacheprovider \
    --continue-on-collection-errors $gpu_files > "$out/pytest_gpu.txt" 2>&1
echo "pytest -m gpu: exit $?" >> "$status"
# shorter timed blocks than its default: ~200 contenders inside the part's limit; the
# result file is rewritten after every row, so a stop at the limit keeps what was measured
timeout 210 "$PYTHON" benchmarks/gpu_check.py --rounds 3 --block 0.1 \
    --out "$out/gpu_check.json" 2> "$out/gpu_check.log"
echo "gpu_check: exit $?" >> "$status"
timeout 100 "$PYTHON" benchmarks/bench_tasks.py --device cuda --quick \
    --out "$out/bench_tasks.json" > "$out/bench_tasks.log" 2>&1
echo "bench_tasks --device cuda: exit $?" >> "$status"
if [ "$ptb" = ptb ]; then
    left=$((budget - ($(date +%s) - start) - 15))  # 15 s for the tables below
    [ "$left" -lt 30 ] && left=30
    PYTHON=$PYTHON timeout "$left" sh recipes/ptb_lm/run.sh small --device cuda \
        > "$out/ptb_small.log" 2>&1
    echo "ptb small: exit $? (124: stopped at its time limit)" >> "$status"
fi
rm -f "$out"/*.part  # a result file cut off mid-write (its last whole version stays)
"$PYTHON" benchmarks/gpu_tables.py "$out" > "$out/tables.md"
cat "$out/tables.md"
