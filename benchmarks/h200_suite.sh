#!/usr/bin/env bash
# The full H200 suite with turbo-gnn as a baseline, in two device calls
# (each call is limited to 10 minutes; the machine keeps what was installed
# while it stays warm, so run the second call right after the first):
#
#   # on the project machine, once (ignored folders, carried to the device):
#   pip download --no-deps turbo-gnn==0.1.0rc4 -d .turbo
#   mkdir -p .data && cp <shared>/datasets/heterophilous/tolokers.npz \
#       <shared>/datasets/netrepo_edgelists/soc-brightkite.txt .data/ && \
#       cp -r <shared>/datasets/karateclub/node_level/github .data/
#
#   bash benchmarks/h200_suite.sh prepare   # call 1 (carry .turbo): build turbo-gnn
#                                           # in the background, GPU tests meanwhile
#   bash benchmarks/h200_suite.sh suite     # call 2 (carry .data): the suite, ~7 min
#
# Logs and JSON go under $OUT. The turbo-gnn build is CPU work and the GPU
# tests are not timed, so they share the machine; the suite runs alone.
. "$(dirname "$0")/h200_common.sh"     # $OUT, install, kernel-cache prewarm

case "${1:-}" in
prepare)
    sdist=$(ls .turbo/turbo_gnn-*.tar.gz 2>/dev/null | head -1)
    if [ -n "$sdist" ]; then
        rm -rf /tmp/turbo && mkdir -p /tmp/turbo && tar -xzf "$sdist" -C /tmp/turbo
        (cd /tmp/turbo/turbo_gnn-* && TURBO_GNN_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST=9.0 \
            MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index . \
            > "$OUT/turbo_build.log" 2>&1; echo "turbo-gnn build exit $?" >> "$OUT/turbo_build.log") &
        build=$!
    else
        echo "no .turbo/turbo_gnn-*.tar.gz: the suite will run without turbo-gnn"
        build=
    fi
    run_gpu_tests 400
    if [ -n "$build" ]; then
        wait "$build"
        tail -2 "$OUT/turbo_build.log"
        python3 -c "import turbo_gnn; print('turbo_gnn', turbo_gnn.__file__)"
    fi
    ;;
suite)
    timeout 560 python3 -m fastgnn.bench --suite full --budget-minutes 6.5 --no-progress \
        --out "$OUT/suite_h200.json" > "$OUT/suite.log" 2>&1
    tail -40 "$OUT/suite.log"
    ;;
*)
    echo "usage: bash benchmarks/h200_suite.sh prepare|suite" >&2
    exit 2
    ;;
esac
