"""Packaging and set-up checks (CPU only): the installed import names, kernel
sources shipped as package data, nothing heavy at import time, and the README's
set-up lines kept in step with CI's `.ci/run`."""
import configparser
import importlib
import importlib.resources
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
KERNELS = ROOT / "kernels_cuda"

# The README's two set-up lines. Changing either is deliberate: change README.md
# and this file together, and for the test line .ci/run too (it runs it verbatim).
MAIN_JOB_CMD = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
                "&& pip install -e \".[bench,pyg$(command -v nvidia-smi >/dev/null && echo ,cuda13)]\" "
                "&& python -m fastgnn.bench --quick")
TEST_CMD = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
            "&& pip install -e '.[test,compile-check]' "
            "&& python -m fastgnn.backends.cuda.compile_check --quick && python -m pytest -q -m \"not slow\" -n auto --dist loadfile")

# README's DGL line: the DGL adapter's own environment (DGL's wheels support
# torch 2.0-2.2 and numpy < 2) and its tests; .ci/run runs it after TEST_CMD.
DGL_INSTALL = ('python3 -m venv .venv-dgl && .venv-dgl/bin/pip install torch==2.2.1 "numpy<2" '
               'dgl==2.1.0 torchdata==0.7.1 pandas pyyaml pydantic numba pytest pytest-xdist')
DGL_TEST = ('.venv-dgl/bin/pip install --no-deps -e . && .venv-dgl/bin/python -c "import fastgnn.dgl" '
            '&& .venv-dgl/bin/python -m pytest -q -n auto tests/test_dgl.py tests/test_bad_inputs_dgl.py')
DGL_CMD = f"{DGL_INSTALL} && {DGL_TEST}"

OPTIONAL_THIRD_PARTY = ("jax", "jaxlib", "flax", "dgl")   # adapters whose framework CI may lack


def _run_python(code, cwd=ROOT, timeout=300):
    """Run `code` in a fresh interpreter; returns stdout, fails with its stderr."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _fenced_blocks(text):
    """[(info string, body, start offset)] of every ``` block in a Markdown text."""
    return [(m.group(1).strip(), m.group(2), m.start())
            for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S)]


# ------------------------------------------------------------------ imports
def test_import_fastgnn():
    import fastgnn
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", fastgnn.__version__)
    for name in ("Graph", "spmm", "spmm_fwd", "spmm_bwd", "gcn_norm", "gpu_available"):
        assert hasattr(fastgnn, name), f"fastgnn.{name} is missing"


def test_import_fastgnn_torch():
    pytest.importorskip("torch")
    mod = importlib.import_module("fastgnn.torch")
    assert mod.__name__ == "fastgnn.torch"
    # adapters/torch is mapped into the fastgnn namespace, never installed as `adapters`
    assert Path(mod.__file__).parent.name == "torch"


def test_torch_adapter_exports_what_the_readme_promises():
    pytest.importorskip("torch")
    mod = importlib.import_module("fastgnn.torch")
    missing = [n for n in ("spmm", "to_graph", "GCNConv", "SAGEConv", "GINConv")
               if not hasattr(mod, n)]
    assert not missing, f"fastgnn.torch lacks {missing} (README's usage section names them)"


def test_kernel_sources_are_package_data():
    sources = sorted(p.name for p in KERNELS.glob("*.cu*") if p.suffix in (".cu", ".cuh"))
    if not any(n.endswith(".cu") for n in sources):
        pytest.skip("no .cu files in kernels_cuda/ yet")
    shipped = importlib.resources.files("fastgnn.kernels_cuda")
    names = {p.name for p in shipped.iterdir()}
    missing = [n for n in sources if n not in names]
    assert not missing, f"fastgnn.kernels_cuda lacks {missing}: check package_data in setup.cfg"
    for n in sources:
        assert shipped.joinpath(n).read_text() == (KERNELS / n).read_text(), n


def _can_build_wheels():
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(v) for v in re.findall(r"\d+", setuptools.__version__)[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.mark.skipif(not _can_build_wheels(), reason="needs setuptools>=70.1 or wheel")
def test_wheel_holds_only_the_fastgnn_namespace(tmp_path):
    """A regular (non-editable) wheel: everything under fastgnn/, kernels included,
    nothing generic such as `adapters` or `kernels_cuda` at top level."""
    src, out = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    out.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "setup.py", "README.md", "LICENSE",
                 "MANIFEST.in"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("fastgnn", "adapters", "kernels_cuda"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    build = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", build, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"wheel build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    wheel = out / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if top_level:
            assert zf.read(top_level[0]).decode().split() == ["fastgnn"]
    stray = [n for n in names if not (n.startswith("fastgnn/") or ".dist-info/" in n)]
    assert not stray, f"wheel installs files outside the fastgnn package: {stray}"
    for n in ("fastgnn/__init__.py", "fastgnn/torch/__init__.py", "fastgnn/torch/native.cpp",
              "fastgnn/kernels_cuda/__init__.py"):
        assert n in names, f"{n} missing from the wheel"
    kernels = [p.name for p in KERNELS.iterdir() if p.suffix in (".cu", ".cuh")]
    missing = [k for k in kernels if f"fastgnn/kernels_cuda/{k}" not in names]
    assert not missing, f"kernel sources missing from the wheel: {missing}"


# ------------------------------------------------------- nothing at import
def test_import_fastgnn_pulls_in_no_gpu_runtime_or_framework():
    out = _run_python("""
        import sys
        import fastgnn
        heavy = ("cupy", "cupyx", "cupy_backends", "torch", "jax", "dgl")
        print(sorted({m.split(".")[0] for m in sys.modules} & set(heavy)))
    """)
    assert out.strip() == "[]", f"`import fastgnn` imported {out.strip()}"


def test_fastgnn_works_on_the_cpu_without_cupy():
    out = _run_python("""
        import sys
        sys.modules["cupy"] = None      # simulate a machine without CuPy
        import numpy as np
        import fastgnn
        assert fastgnn.gpu_available() is False
        g = fastgnn.Graph.from_edge_index(np.array([[0, 1, 2], [1, 2, 1]]), num_nodes=4)
        out = fastgnn.spmm(g, np.ones((4, 3), np.float32), reduce="mean")
        assert out.shape == (4, 3) and (out[1] == 1).all() and (out[3] == 0).all()
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_importing_every_module_compiles_nothing_and_touches_no_gpu():
    """Import every fastgnn module with CuPy's compile and device entry points
    and Numba's compiler booby-trapped; none may be called at import time."""
    out = _run_python("""
        import importlib, pkgutil, sys, traceback
        calls = []

        def trap(obj, attr, label):
            if obj is None or not hasattr(obj, attr):
                return
            orig = getattr(obj, attr)
            def called(*a, **k):
                calls.append(label)
                return orig(*a, **k)
            setattr(obj, attr, called)

        try:
            import cupy
        except Exception:
            cupy = None
        if cupy is not None:
            import cupy.cuda.compiler as compiler
            trap(cupy, "RawModule", "cupy.RawModule")
            trap(cupy, "RawKernel", "cupy.RawKernel")
            trap(compiler, "compile_using_nvrtc", "cupy compile_using_nvrtc")
            trap(compiler, "compile_using_nvcc", "cupy compile_using_nvcc")
            trap(cupy.cuda, "is_available", "cupy.cuda.is_available")
            trap(cupy.cuda.runtime, "getDeviceCount", "cudaGetDeviceCount")
            trap(cupy.cuda.runtime, "setDevice", "cudaSetDevice")
            try:
                from cupy_backends.cuda.libs import nvrtc
                trap(nvrtc, "compileProgram", "nvrtcCompileProgram")
            except Exception:
                pass
        try:
            import numba.core.dispatcher as nd
            trap(nd.Dispatcher, "compile", "numba Dispatcher.compile")
        except ImportError:
            pass

        import fastgnn
        names = ["fastgnn"]
        packages = [fastgnn]
        try:
            import fastgnn.torch
            packages.append(fastgnn.torch)
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
        try:
            import fastgnn.jax
            packages.append(fastgnn.jax)
        except ModuleNotFoundError as e:
            if e.name not in ("jax", "jaxlib"):
                raise
        try:
            import fastgnn.dgl
            packages.append(fastgnn.dgl)
        except ModuleNotFoundError as e:
            if e.name != "dgl":
                raise
        for pkg in list(packages):
            for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".",
                                              onerror=lambda n: None):
                names.append(info.name)
        skipped, failed = [], []
        for name in sorted(set(names)):
            if name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] in OPTIONAL:
                    skipped.append(name)
                else:
                    failed.append(f"{name}: {traceback.format_exc()}")
            except Exception:
                failed.append(f"{name}: {traceback.format_exc()}")
        assert not failed, "\\n".join(failed)
        assert not calls, f"called at import time: {calls}"
        print("imported", len(names) - len(skipped), "skipped", skipped)
    """.replace("OPTIONAL", repr(OPTIONAL_THIRD_PARTY)))
    assert "imported" in out


# --------------------------------------------------- README and CI in step
def test_readme_starts_with_the_two_setup_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# "), "README must start with a one-line title"
    blocks = _fenced_blocks(text)
    assert len(blocks) >= 2
    (info_a, body_a, start_a), (info_b, body_b, start_b) = blocks[:2]
    assert not re.search(r"^#{2,} ", text[:start_b], re.M), \
        "the two set-up commands must come before the first section heading"
    assert info_a in ("bash", "sh", "shell", "console") and info_b == info_a
    assert body_a.strip() == MAIN_JOB_CMD, "README's first command (main job) changed"
    assert body_b.strip() == TEST_CMD, "README's second command (tests) changed"
    assert "\n" not in body_a.strip() and "\n" not in body_b.strip(), "one line each"


def test_ci_runs_the_readme_test_command_then_the_dgl_line():
    text = CI_RUN.read_text()
    assert os.access(CI_RUN, os.X_OK), ".ci/run must be executable"
    assert re.search(r"^set -euo pipefail$", text, re.M)
    code = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    main = code[-3]
    assert main.startswith(TEST_CMD), ".ci/run's main line must be the README's test command"
    # `a && b` is exempt from `set -e`: only an explicit exit (or nothing) may follow
    assert main[len(TEST_CMD):].strip() in ("", "|| exit $?"), main
    # README's DGL line in two halves: its dependencies installed in the
    # background from before the main line, waited for after it (failing the
    # run), then fastgnn's install and the tests
    assert f"( {DGL_INSTALL} ) > \"$dgl_log\" 2>&1 &" in code[:-3]
    assert code[-2].startswith('wait "$dgl_install" || {') and code[-2].endswith("exit 1; }")
    assert code[-1] == f"{DGL_TEST} || exit $?", code[-1]
    dgl_blocks = [b for info, b, _ in _fenced_blocks(README.read_text()) if info == "bash"
                  and b.strip() == DGL_CMD]
    assert dgl_blocks, "README's DGL section lost the line CI runs (DGL_CMD)"
    # the main environment has no dgl: a DGL test file off the DGL line never runs
    dgl_files = [f"tests/{f.name}" for f in sorted((ROOT / "tests").glob("test_*.py"))
                 if re.search(r"^\w+ = pytest\.importorskip\(.dgl.\)", f.read_text(), re.M)]
    assert dgl_files and all(f in DGL_TEST.split() for f in dgl_files), (dgl_files, DGL_TEST)
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(CI_RUN)], check=True)


def test_setup_commands_name_real_extras_and_modules():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    for cmd in (MAIN_JOB_CMD, TEST_CMD):
        # the main job's "$(... && echo ,cuda13)" adds an extra only on GPU machines
        plain = re.sub(r"\$\(command -v nvidia-smi >/dev/null && echo ,(\w+)\)", r",\1", cmd)
        for group in re.findall(r"\.\[([^\]]+)\]", plain):
            unknown = set(group.split(",")) - extras
            assert not unknown, f"unknown extras {unknown} in {cmd!r}"
    assert "cuda13" in extras  # the README's GPU note
    for module in ("fastgnn.bench.__main__", "fastgnn.backends.cuda.compile_check"):
        assert importlib.util.find_spec(module) is not None, f"{module} does not exist"


def _readme_tested_blocks():
    """The python blocks README.md marks with `<!-- test: ... -->` above them."""
    text = README.read_text()
    blocks = []
    start = text.find("<!-- test:")
    while start >= 0:
        info, body, _ = next(b for b in _fenced_blocks(text[start:]))
        assert info == "python", "a README block marked as tested must be python"
        blocks.append(body)
        start = text.find("<!-- test:", start + 1)
    return blocks


def test_every_readme_python_block_is_tested():
    """No README python example escapes test_readme_examples_run: each has the
    `<!-- test: ... -->` marker on the line above it."""
    text = README.read_text()
    for info, body, start in _fenced_blocks(text):
        if info == "python":
            above = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
            assert above.startswith("<!-- test:"), \
                f"README python block at line {text[:start].count(chr(10)) + 1} is not marked tested"


def test_readme_report_commands_run():
    """README's commands that rebuild its tables from the committed results
    (`python -m fastgnn.bench.report ...`) run as written and print a table."""
    text = README.read_text()
    commands = [body.replace("\\\n", " ") for info, body, _ in _fenced_blocks(text)
                if info == "bash" and body.startswith("python -m fastgnn.bench.report")]
    assert commands, "README lost its report commands"
    for cmd in commands:
        run = subprocess.run([sys.executable, *shlex.split(cmd)[1:]], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{cmd}: {run.stderr[-2000:]}"
        assert "\n|---|" in run.stdout, f"{cmd}: no table printed"


def test_readme_examples_run():
    """Every marked README example runs as written: the arrays one, the PyG
    swap and the torch.compile one (the last two need torch and PyG), the
    JAX one (needs jax) and the DGL one (where dgl is installed)."""
    blocks = _readme_tested_blocks()
    assert len(blocks) >= 3, "README lost one of its tested usage examples"
    for i, body in enumerate(blocks):
        if "import dgl" in body and importlib.util.find_spec("dgl") is None:
            continue        # DGL's example: tests/test_dgl.py runs it in DGL's environment
        if "torch" in body and "import dgl" not in body:
            pytest.importorskip("torch_geometric")
        if "jax" in body:
            pytest.importorskip("jax")
        if "flax" in body and importlib.util.find_spec("flax") is None:
            continue        # Flax's example: needs the flax extra

        exec(compile(body, f"README.md example {i + 1}", "exec"), {"__name__": "readme_example"})


def test_readme_bench_commands_run_on_the_cpu(tmp_path):
    """README's `fastgnn bench` command lines that run on a CPU run as written
    (from an empty directory, the own-graph command on a small generated
    edge list at its path) and end with the summary; a line marked GPU runs
    where CUDA is available. (The first set-up command, the main job, is
    CI's own run.)"""
    pytest.importorskip("torch_geometric")
    import torch
    lines = [line.split("#")[0].strip() + ("  # GPU" if "# GPU" in line else "")
             for info, body, _ in _fenced_blocks(README.read_text()) if info == "bash"
             for line in body.replace("\\\n", " ").splitlines()
             if line.startswith(("fastgnn bench", "python -m fastgnn.bench ")) and
             not line.startswith("python -m fastgnn.bench.report")]
    assert any("--suite minibatch --quick" in line for line in lines), lines
    assert any("file:path/to/graph.txt" in line for line in lines), lines
    rng = np.random.default_rng(0)
    (tmp_path / "path" / "to").mkdir(parents=True)
    np.savetxt(tmp_path / "path" / "to" / "graph.txt",
               np.stack([rng.integers(0, 60, 300), rng.integers(0, 60, 300)], 1), fmt="%d")
    ran = 0
    for line in lines:
        if line.endswith("# GPU") and not torch.cuda.is_available():
            continue
        argv = shlex.split(line.replace("  # GPU", ""))
        argv = argv[3:] if argv[0] == "python" else argv[2:]
        run = subprocess.run([sys.executable, "-m", "fastgnn.bench", *argv], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{line}: {run.stderr[-2000:]}"
        assert "fastgnn against" in run.stdout or "| workload |" in run.stdout, \
            f"{line}: no summary at the end:\n{run.stdout[-2000:]}"
        ran += 1
    assert ran >= 2
