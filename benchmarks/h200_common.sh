# Sourced by benchmarks/h200_check.sh and h200_suite.sh: the set-up every
# H200 device call starts with, and the GPU test run both use.
#
# Set-up: $OUT (logs, JSON) exists, this tree is installed without
# dependencies (the H200 image has torch, PyG, CuPy), and every kernel module
# is compiled once, on every core, into CuPy's disk cache (otherwise each
# pytest-xdist worker and the bench compile on first use).
set -u
OUT=${OUT:-/tmp/fastgnn-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 240 python3 -m fastgnn.backends.cuda.prewarm > "$OUT/prewarm.log" 2>&1
tail -1 "$OUT/prewarm.log"

# run_gpu_tests SECONDS: the GPU-marked tests into $OUT/gpu_tests.log, then
# their failures and summary line. -v: one line per test, so a run cut short
# by the timeout still names its failures. With pytest-xdist (on the H200
# image) 8 workers share the GPU: 700 tests in about 200 s in session 4
# (about 300 s serially).
run_gpu_tests() {
    local par
    par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout "$1" python3 -m pytest -v $par -m gpu -p no:cacheprovider -rf --maxfail=30 tests \
        > "$OUT/gpu_tests.log" 2>&1
    grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -30
    tail -1 "$OUT/gpu_tests.log"
}
