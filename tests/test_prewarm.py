"""fastgnn.backends.cuda.prewarm: the job list, the worker plumbing (with a
stand-in compile function on the CPU) and, on a GPU, one real module."""
import pytest

pytest.importorskip("cupy")

from fastgnn import gpu_available  # noqa: E402
from fastgnn.backends.cuda import loader, prewarm  # noqa: E402


def test_modules_cover_every_instantiated_module():
    jobs = prewarm.modules()
    assert sorted(jobs) == sorted((f, v, i) for f, v, i, _ in loader.instantiations())


def test_modules_filter():
    jobs = prewarm.modules(["attention"], ["float32", "bfloat16"], ["int32"])
    assert jobs == [("attention", "float32", "int32"), ("attention", "bfloat16", "int32")]
    for kw, name in (({"families": ["attn"]}, "family"), ({"vtypes": ["float8"]}, "vtype"),
                     ({"itypes": ["int16"]}, "itype")):
        with pytest.raises(ValueError, match=name):
            prewarm.modules(**kw)
    with pytest.raises(SystemExit):
        prewarm.main(["--family", "nope"])


def _fake_compile(job):
    return job, float(len(job[0]))


def test_prewarm_runs_every_job_in_order():
    jobs = prewarm.modules(["spmm", "segment"], ["float32"], ["int32", "int64"])
    expected = [(j, float(len(j[0]))) for j in jobs]
    assert prewarm.prewarm(jobs, workers=1, compile_fn=_fake_compile) == expected
    assert prewarm.prewarm(jobs, workers=2, compile_fn=_fake_compile) == expected   # processes


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA device visible to CuPy")
def test_gpu_compile_module():
    (job, seconds), = prewarm.prewarm([("spmm", "float32", "int32")], workers=1)
    assert job == ("spmm", "float32", "int32") and seconds >= 0
    assert loader.get_function("spmm", "float32", "int32",
                               loader.KERNELS["spmm"]("float32", "int32")[0]) is not None
