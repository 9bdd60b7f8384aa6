#!/usr/bin/env bash
# One device call's worth of checks on an H200 (see ../.library/device/):
# install this tree, run the GPU tests, the attention and overhead probes and
# the rmat20 benchmark of every family, writing logs and JSON under $OUT.
#
#   bash benchmarks/h200_check.sh            # tests + probes + rmat20 bench
#   SKIP_TESTS=1 bash benchmarks/h200_check.sh
#
# Carry .data (the real graphs) when the bench needs them; this script only
# uses generated graphs.
set -u
OUT=${OUT:-/tmp/fastgnn-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
# every kernel module compiled once, on every core, into CuPy's disk cache
# (otherwise each pytest-xdist worker and the bench compile on first use)
timeout 240 python3 -m fastgnn.backends.cuda.prewarm > "$OUT/prewarm.log" 2>&1
tail -1 "$OUT/prewarm.log"
if [ -z "${SKIP_TESTS:-}" ]; then
    # -v: one line per test, so a run cut short by the timeout still names
    # its failures. With pytest-xdist (on the H200 image) 8 workers share the
    # GPU: 700 tests in about 200 s in session 4 (about 300 s serially).
    PAR=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 420 python3 -m pytest -v $PAR -m gpu -p no:cacheprovider -rf --maxfail=30 tests \
        > "$OUT/gpu_tests.log" 2>&1
    grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -30
    tail -1 "$OUT/gpu_tests.log"
fi
timeout 90 python3 benchmarks/probe_attention.py 20 > "$OUT/probe_attention.log" 2>&1
cat "$OUT/probe_attention.log"
timeout 90 python3 benchmarks/profile_overhead.py 14 200 > "$OUT/overhead.log" 2>&1
grep "==" "$OUT/overhead.log"
timeout 240 python3 -m fastgnn.bench --graphs rmat20 --width 128 --heads 4 --dtypes fp32 bf16 \
    --impls fastgnn --repeats 10 --warmup 2 --no-progress --no-plots \
    --out "$OUT/rmat20_fastgnn.json" > "$OUT/bench.log" 2>&1
grep "| rmat20" "$OUT/bench.log" | cut -c1-120
