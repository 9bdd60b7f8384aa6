"""The per-test seeds of conftest.py: fixed per test by default, set by
FASTGNN_TEST_SEED, printed with a failure."""
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

FAILING = '''
import numpy as np

def test_draws(seed, rng):
    print("drew", seed, np.random.randint(1 << 30), rng.integers(1 << 30))
    assert False
'''


def _run(folder, env_seed):
    env = {k: v for k, v in os.environ.items() if k != "FASTGNN_TEST_SEED"}
    if env_seed is not None:
        env["FASTGNN_TEST_SEED"] = env_seed
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_failing.py"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


def _drawn(out):
    line = next(line for line in out.splitlines() if line.startswith("drew "))
    return [int(v) for v in line.split()[1:]]


@pytest.mark.slow        # two pytest runs in subprocesses, each importing torch
def test_seed_is_fixed_settable_and_printed(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_failing.py").write_text(FAILING)

    out = _run(tmp_path, None)
    seed, global_draw, rng_draw = _drawn(out)
    assert seed == zlib.crc32(b"test_failing.py::test_draws")
    assert global_draw == np.random.RandomState(seed).randint(1 << 30)
    assert rng_draw == np.random.default_rng(seed).integers(1 << 30)
    assert "fastgnn test seed" in out
    assert f"FASTGNN_TEST_SEED={seed} python -m pytest 'test_failing.py::test_draws'" in out
    assert _drawn(_run(tmp_path, "12345"))[0] == 12345
