#!/usr/bin/env bash
# GPU check of this checkout on a machine with torch, PyG and CuPy already
# installed: install the tree without dependencies, compile every kernel
# module into CuPy's disk cache, run the GPU-marked tests, then the rmat20
# benchmark of fastgnn's implementations (every family, fp32 and bf16).
# Logs and JSON go under $OUT (default /tmp/fastgnn-out).
#
#   bash benchmarks/dev/gpu_check.sh                   # tests + rmat20 bench
#   SKIP_TESTS=1 bash benchmarks/dev/gpu_check.sh      # bench only
#   LAYERS_VS_PYG=1 bash benchmarks/dev/gpu_check.sh   # + the layers against PyG
set -u
OUT=${OUT:-/tmp/fastgnn-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
# compiled once, on every core: otherwise each pytest-xdist worker and the
# bench compile every module on first use
timeout 240 python3 -m fastgnn.backends.cuda.prewarm > "$OUT/prewarm.log" 2>&1
tail -1 "$OUT/prewarm.log"
# the full NVRTC compile check (every value and index type; CI runs --quick)
if python3 -c "import cupy_backends.cuda.libs.nvrtc" 2>/dev/null; then
    timeout 240 python3 -m fastgnn.backends.cuda.compile_check > "$OUT/compile_check.log" 2>&1
    tail -1 "$OUT/compile_check.log"
fi

if [ -z "${SKIP_TESTS:-}" ]; then
    # -v: one line per test, so a run cut short by the timeout still names its
    # failures; with pytest-xdist 8 workers share the GPU (about 1000 tests in
    # ~2 minutes on an H200)
    par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 420 python3 -m pytest -v $par -m gpu -p no:cacheprovider -rf --maxfail=30 tests \
        > "$OUT/gpu_tests.log" 2>&1
    grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -30
    tail -1 "$OUT/gpu_tests.log"
fi

timeout 240 python3 -m fastgnn.bench --graphs rmat20 --width 128 --heads 4 --dtypes fp32 bf16 \
    --impls fastgnn --repeats 10 --warmup 2 --no-progress --no-plots \
    --out "$OUT/rmat20_fastgnn.json" > "$OUT/bench.log" 2>&1
grep "| rmat20" "$OUT/bench.log" | cut -c1-120

# the drop-in layers against PyG on rmat20 (~2 min; PyG's attention layers dominate)
if [ -n "${LAYERS_VS_PYG:-}" ]; then
    timeout 240 python3 -m fastgnn.bench --graphs rmat20 --width 128 --heads 4 --dtypes fp32 \
        --ops none --layers GATv2Conv TransformerConv GATConv SAGEConv GCNConv \
        --lean-above 1500000 --repeats 5 --warmup 1 --no-progress --no-plots \
        --out "$OUT/layers_rmat20.json" > "$OUT/layers.log" 2>&1
    grep "| rmat20" "$OUT/layers.log" | cut -c1-150
fi
