#!/usr/bin/env bash
# GPU check of the new-graph path on a machine with torch, PyG and CuPy
# installed, in one call of at most 10 minutes: install the tree without
# dependencies, build the native backward node and compile every kernel
# module first (so nothing timed compiles), then the new-graph probe (with
# its per-phase host times) on small graphs and on sampled batches, the mini-batch suite and the GPU tests, each
# under its own time limit. Logs and JSON go under $OUT (default
# /tmp/fastgnn-out).
#
#   bash benchmarks/dev/gpu_minibatch_check.sh
#   PROBE_FLAGS="--gc-off --profile" bash benchmarks/dev/gpu_minibatch_check.sh
#   SKIP_SUITE=1 / SKIP_TESTS=1 ...                  # leave a part out
#   FIRST_TESTS="tests/test_graph.py" ...            # these tests before the timings
#   TEST_FILES="tests/test_attention.py" ...         # the GPU tests of these files only
#   SKIP_PREWARM=1 ...                               # kernels compile on first use (the
#                                                    # probe's untimed steps) instead
set -u
OUT=${OUT:-/tmp/fastgnn-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
# test-only wheels carried in .whl/ (hypothesis, pytest-xdist) when the image lacks them
ls .whl/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-deps .whl/*.whl >> "$OUT/pip.log" 2>&1
timeout 90 python3 -m fastgnn.torch.native > "$OUT/native.log" 2>&1
tail -1 "$OUT/native.log"
if [ -z "${SKIP_PREWARM:-}" ]; then
    timeout 120 python3 -m fastgnn.backends.cuda.prewarm > "$OUT/prewarm.log" 2>&1
    tail -1 "$OUT/prewarm.log"
fi

if [ -n "${FIRST_TESTS:-}" ]; then
    # a few test files first (what the change at hand touches), before anything is timed
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf $FIRST_TESTS \
        > "$OUT/first_tests.log" 2>&1
    grep -E "^FAILED|^ERROR" "$OUT/first_tests.log" | head -20
    tail -1 "$OUT/first_tests.log"
fi

timeout ${PROBE_S:-60} python3 benchmarks/dev/probe_new_graph.py GCN SAGE-max GAT --phases \
    ${PROBE_FLAGS:-} > "$OUT/probe.log" 2>&1
grep -v "^ \{4,\}" "$OUT/probe.log" | grep -E "nodes|host ms|profiled" | head -20
timeout ${PROBE_S:-60} python3 benchmarks/dev/probe_new_graph.py GCN SAGE-max GAT --phases \
    --sampled ${PROBE_GRAPH:-rmat20e50} ${PROBE_FLAGS:-} > "$OUT/probe_sampled.log" 2>&1
grep -v "^ \{4,\}" "$OUT/probe_sampled.log" | grep -E "nodes|host ms|profiled|Error" | head -20

if [ -z "${SKIP_SUITE:-}" ]; then
    timeout ${SUITE_S:-200} python3 -m fastgnn.bench --suite minibatch --no-progress \
        --out "$OUT/minibatch.json" > "$OUT/minibatch.log" 2>&1
    tail -16 "$OUT/minibatch.log"
fi

if [ -z "${SKIP_TESTS:-}" ]; then
    par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    FASTGNN_PROPERTY_EXAMPLES=300 timeout ${TESTS_S:-170} python3 -m pytest -q $par -m gpu -p no:cacheprovider -rf \
        --maxfail=30 ${TEST_FILES:-tests} > "$OUT/gpu_tests.log" 2>&1
    grep -E "^FAILED|^ERROR" "$OUT/gpu_tests.log" | head -30
    tail -1 "$OUT/gpu_tests.log"
fi
