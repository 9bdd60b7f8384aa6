"""Shared pytest set-up.

Seeded randomness: every test runs with NumPy's global state, Python's
`random` and torch's generators seeded from one per-test seed, and can ask
for it as the `seed` fixture or for a NumPy Generator on it as `rng`. The
seed comes from FASTGNN_TEST_SEED:

    unset      a fixed seed per test, derived from its id (the same every run)
    <integer>  that seed for every test (re-run a failure with the seed it printed)
    random     a fresh seed per test and run (to explore; failures print theirs)

A failing test's report carries a "fastgnn test seed" section with the seed
and the command that repeats the run.

The quick loop: `pytest -m "not slow"` (about a minute on 2 cores once numba
has cached the CPU kernels; the first run compiles them). Besides the
tests marked slow in their files, the long ones listed in SLOW below are
marked here (measured with `pytest --durations=0`), and so is the tail of
every large parameter matrix: a parametrized test keeps its first
QUICK_PARAMS runnable cases in the quick loop. CI runs the quick loop (the
README's test command); a plain `pytest` runs everything (about 10 minutes on
2 cores with a cold numba cache; run it before a release and after touching
a kernel's CPU twin).
"""
import importlib.util
import os

# JAX preallocates 75% of a GPU by default: on a GPU machine the CUDA tests of
# the other xdist workers would then run out of memory
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import random
import secrets
import zlib

import numpy as np
import pytest

SEED_ENV = "FASTGNN_TEST_SEED"
_SEED = pytest.StashKey[int]()


def _seed_mode():
    value = os.environ.get(SEED_ENV, "").strip().lower()
    if value in ("", "random"):
        return value
    try:
        return int(value, 0) % 2**32
    except ValueError:
        raise pytest.UsageError(f"{SEED_ENV}={value!r}: expected an integer, 'random' or "
                                "nothing") from None


def seed_for(nodeid: str) -> int:
    """The seed a test with this id runs under (see the module docstring)."""
    mode = _seed_mode()
    if mode == "":
        return zlib.crc32(nodeid.encode())
    if mode == "random":
        return secrets.randbits(32)
    return mode


def pytest_report_header(config):
    mode = _seed_mode()
    how = {"": "fixed per test (from its id)", "random": "random per test"}.get(
        mode, f"{mode} for every test")
    return f"test seeds: {how}; set {SEED_ENV} to change (tests/conftest.py)"


@pytest.fixture(autouse=True)
def _seeded_randomness(request):
    """Seed NumPy's global state, `random` and torch with the test's seed."""
    value = seed_for(request.node.nodeid)
    request.node.stash[_SEED] = value
    request.node.user_properties.append(("seed", value))
    np.random.seed(value)
    random.seed(value)
    if importlib.util.find_spec("torch") is not None:
        import torch
        torch.manual_seed(value)
    return value


@pytest.fixture
def seed(_seeded_randomness):
    """The test's seed (an int below 2**32)."""
    return _seeded_randomness


@pytest.fixture
def rng(seed):
    """A NumPy Generator on the test's seed."""
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    value = item.stash.get(_SEED, None)
    if value is not None and report.failed:
        report.sections.append(("fastgnn test seed", (
            f"seed {value}; repeat with: {SEED_ENV}={value} python -m pytest '{item.nodeid}'")))
    return report


# Test files and functions of several seconds each on 2 cores.
SLOW = (
    "tests/test_torch_attention.py::test_dropout_expected_value",     # many dropout draws
    "tests/test_attention.py::test_attention_dropout_expected_value",
    "tests/test_packaging.py::test_importing_every_module_compiles_nothing_and_touches_no_gpu",
    "tests/test_packaging.py::test_fastgnn_works_on_the_cpu_without_cupy",    # subprocesses
    "tests/test_imports.py::test_the_cpu_path_and_the_cuda_loader_need_no_cupy",
    "tests/test_prewarm.py::test_prewarm_runs_every_job_in_order",
    "tests/test_segment.py::test_reference_vjp_by_finite_differences",
    "tests/test_torch_adapter.py::test_spmm_gradcheck",                       # gradchecks
    "tests/test_torch_adapter.py::test_spmm_bias_gradcheck_and_reference",
    "tests/test_torch_aggr.py::test_functional_gradcheck_and_aliases",
    "tests/test_bench.py::test_bench_failures_are_recorded",                  # bench runs
    "tests/test_bench.py::test_bench_new_graphs_plots_and_failures",
    "tests/test_bench.py::test_bench_baselines_absent_and_reasons",
    "tests/test_bench.py::test_bench_segment_family_cpu",
    "tests/test_datasets.py::test_real_graphs",                               # real files
    "tests/test_datasets.py::test_real_tu_and_graph_sets",
)
QUICK_PARAMS = 3
# files whose whole parameter matrix stays in the quick loop (and so in CI):
# every layer under torch.compile is part of what CI proves, and so is every
# case of the bad-input catalogues (milliseconds each)
FULL_MATRIX = ("tests/test_torch_compile.py", "tests/test_bad_inputs.py",
               "tests/test_bad_inputs_jax.py")


def _listed_slow(nodeid):
    return any(nodeid == key or nodeid.startswith((key + "::", key + "["))
               for key in SLOW)


def _skipped_at_collection(item):
    """True when a skip / skipif mark with a true condition skips the item."""
    for mark in item.iter_markers():
        if mark.name == "skip" or (mark.name == "skipif" and mark.args and
                                   all(isinstance(c, bool) and c for c in mark.args)):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    runnable = {}
    for item in items:
        if _listed_slow(item.nodeid):
            item.add_marker(slow)
            continue
        if (getattr(item, "callspec", None) is None or _skipped_at_collection(item)
                or item.nodeid.startswith(FULL_MATRIX)):
            continue
        key = item.nodeid.split("[", 1)[0]
        runnable[key] = runnable.get(key, 0) + 1
        if runnable[key] > QUICK_PARAMS:
            item.add_marker(slow)


@pytest.fixture(autouse=True)
def _fused_layer_paths(monkeypatch):
    """The drop-in layers switch to their fused Python autograd Functions
    (shared-input linears, add_bias) only above a size (FUSED_MIN_NUMEL);
    test graphs are small, so lower it to 0 and let every layer test check the
    fused paths, and the GEMM-form dispatch (gemm.MIN_NUMEL) likewise.
    test_torch_layers.py checks the size switch itself."""
    try:
        from fastgnn.torch import functional, gemm
    except ImportError:                 # torch not installed: nothing to switch
        return
    monkeypatch.setattr(functional, "FUSED_MIN_NUMEL", 0)
    monkeypatch.setattr(gemm, "MIN_NUMEL", 0)


@pytest.fixture
def set_tf32():
    """set_tf32(on): let fp32 CUDA matmuls use TF32 or not, through the API
    this torch has (matmul.fp32_precision, else allow_tf32); restored after
    the test."""
    import torch
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, name)

    def set_tf32(on: bool):
        setattr(matmul, name, ("tf32" if on else "ieee") if name == "fp32_precision" else on)
    yield set_tf32
    setattr(matmul, name, before)
