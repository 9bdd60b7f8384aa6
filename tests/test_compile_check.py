"""The compile check's progress lines and verdict, with the NVRTC compile
replaced by a stub (the real check runs in CI: `python -m
fastgnn.backends.cuda.compile_check`)."""
import multiprocessing

import pytest

from fastgnn.backends.cuda import compile_check

pytestmark = pytest.mark.skipif(multiprocessing.get_start_method() != "fork",
                                reason="the stub reaches the worker processes through fork")


def _stub(spills):
    def compile_family(family, vtype, itype, names, arch="sm_90"):
        return [(f"{family}_kernel_{i}", 40, spills, spills) for i in range(len(names))], len(names)
    return compile_family


@pytest.fixture
def jobs(monkeypatch):
    jobs = [("spmm", "float32", "int32", ["a", "b"]), ("segment", "float16", "int64", ["c"]),
            ("attention", "bfloat16", "int32", ["d", "e", "f"])]
    monkeypatch.setattr(compile_check, "instantiations", lambda: jobs)
    return jobs


def test_one_line_per_module(jobs, monkeypatch, capsys):
    monkeypatch.setattr(compile_check, "compile_family", _stub(0))
    assert compile_check.main(["--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "compiling 3 modules (6 kernel instantiations) for sm_90 on 2 processes"
    done = [line for line in out if line.startswith("[")]
    assert [line[:5] for line in done] == ["[1/3]", "[2/3]", "[3/3]"]
    assert {line.split("]")[1].split(":")[0].strip() for line in done} == {
        "spmm float32 int32", "segment float16 int64", "attention bfloat16 int32"}
    assert any("3 kernels in" in line for line in done)
    assert out[-1].startswith("compiled 6 kernel instantiations for sm_90 in ")


def test_spills_fail(jobs, monkeypatch, capsys):
    monkeypatch.setattr(compile_check, "compile_family", _stub(8))
    assert compile_check.main(["--family", "spmm", "--jobs", "1"]) == 1
    captured = capsys.readouterr()
    assert "[1/1] spmm float32 int32: 2 kernels in" in captured.out
    assert "spmm_kernel_0 spills 8 B stores / 8 B loads" in captured.err


def test_quick_covers_every_kernel_template():
    """--quick builds every kernel template (the name before its template
    arguments) of every family at least once, and each index width."""
    from fastgnn.backends.cuda.loader import instantiations

    def templates(jobs):
        return {(fam, name.split("<")[0]) for fam, _vt, _it, names in jobs for name in names}

    every = instantiations()
    quick = [j for j in every if (j[1], j[2]) in compile_check.QUICK]
    assert templates(quick) == templates(every)
    assert {it for _f, _v, it, _n in quick} == {it for _f, _v, it, _n in every}
    assert {fam for fam, *_ in quick} == {fam for fam, *_ in every}


def test_quick_compiles_only_its_modules(monkeypatch, capsys):
    jobs = [("spmm", "float32", "int32", ["a"]), ("spmm", "float64", "int32", ["a"]),
            ("spmm", "bfloat16", "int64", ["b"]), ("spmm", "float16", "int64", ["b"])]
    monkeypatch.setattr(compile_check, "instantiations", lambda: jobs)
    monkeypatch.setattr(compile_check, "compile_family", _stub(0))
    assert compile_check.main(["--jobs", "1", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "compiling 2 modules (2 kernel instantiations)" in out
    done = {line.split("]")[1].split(":")[0].strip() for line in out.splitlines()
            if line.startswith("[")}
    assert done == {"spmm float32 int32", "spmm bfloat16 int64"}
