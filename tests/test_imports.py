"""The import graph of fastgnn's own modules, read from the source with `ast`
(nothing is imported): no import cycles, the layers in order (graph ->
ops -> backends -> kernels; the torch adapter on top), production code free of
the test helpers, and the CUDA backend imported only when a CuPy array needs it.

Every import statement counts, those inside functions too: a function-level
import only defers a cycle to the first call, it does not break it.
"""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (setup.cfg's package_dir)
PACKAGES = {"fastgnn": "fastgnn", "adapters/torch": "fastgnn.torch",
            "adapters/dgl": "fastgnn.dgl", "kernels_cuda": "fastgnn.kernels_cuda"}
TEST_HELPERS = "fastgnn.testing"


def _modules():
    """{module name: source path relative to ROOT} of every installed module."""
    mods = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join((package,) + parts)] = path.relative_to(ROOT).as_posix()
    return mods


def _skipped(node):
    """`if TYPE_CHECKING:` blocks never run."""
    if not isinstance(node, ast.If):
        return False
    return "TYPE_CHECKING" in (getattr(node.test, "id", None), getattr(node.test, "attr", None))


def _imports(tree):
    """[(node, at module level)] of every import statement that runs."""
    found = []

    def walk(node, top):
        for child in ast.iter_child_nodes(node):
            if _skipped(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, top))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, top and not nested)
    walk(tree, True)
    return found


def _targets(name, node, mods):
    """The fastgnn modules an import statement in module `name` loads. `from P
    import m` of a submodule m loads P.m (P itself is a parent package, already
    loading); of any other name it loads P."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    base = node.module or ""
    if node.level:
        package = name if mods[name].endswith("__init__.py") else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in mods:
            out.append(sub)
        elif base in mods:
            out.append(base)
    return out


def import_graph():
    """{module: {imported module: (line, at module level)}} over fastgnn's modules."""
    mods = _modules()
    graph = {}
    for name, rel in mods.items():
        tree = ast.parse((ROOT / rel).read_text(), filename=rel)
        edges = graph.setdefault(name, {})
        for node, top in _imports(tree):
            for target in _targets(name, node, mods):
                if target != name:
                    line, was_top = edges.get(target, (node.lineno, False))
                    edges[target] = (min(line, node.lineno), was_top or top)
    return graph, mods


def _cycles(graph):
    """[(a shortest cycle, a list of modules with first == last; every module of
    its strongly connected component)] for each component of more than one
    module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    cycles = []
    for comp in comps:               # a shortest cycle through the component's first module
        start = min(comp)
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in comp and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        path = [start]
        while last is not None:
            path.append(last)
            last = prev[last]
        cycles.append((path[::-1], sorted(comp)))
    return cycles


def _edge(graph, mods, a, b):
    line, top = graph[a][b]
    return f"{mods[a]}:{line} imports {b}" + ("" if top else " (inside a function)")


def _chain(graph, mods, cycle):
    steps = [f"{mods[a]}:{graph[a][b][0]}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [mods[cycle[-1]]])


def test_the_import_graph_sees_every_module_and_the_known_edges():
    graph, mods = import_graph()
    assert {"fastgnn", "fastgnn.ops.attention", "fastgnn.backends.cuda.loader",
            "fastgnn.torch", "fastgnn.torch.nn", "fastgnn.kernels_cuda"} <= set(graph)
    assert "fastgnn.graph" in graph["fastgnn"]                      # from .graph import Graph
    assert "fastgnn.backends.cpu" in graph["fastgnn.backends"]      # from . import cpu (lazy)
    assert graph["fastgnn.backends"]["fastgnn.backends.cpu"][1] is False
    assert "fastgnn.ops.spmm" in graph["fastgnn.torch.functional"]  # absolute import
    assert "fastgnn.torch.functional" in graph["fastgnn.torch.nn"]  # from . import functional


def test_the_cycle_finder_reports_a_file_chain():
    graph = {"a": {"b": (3, True)}, "b": {"c": (5, False)}, "c": {"a": (7, True)}, "d": {}}
    mods = {"a": "a.py", "b": "b.py", "c": "c.py", "d": "d.py"}
    ((cycle, comp),) = _cycles(graph)
    assert cycle == ["a", "b", "c", "a"] and comp == ["a", "b", "c"]
    assert _chain(graph, mods, cycle) == "a.py:3 -> b.py:5 -> c.py:7 -> a.py"
    assert _cycles({"a": {"b": (1, True)}, "b": {}}) == []


def test_no_import_cycles():
    graph, mods = import_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles (file:line of each import):\n" + "\n".join(
        f"  {_chain(graph, mods, c)}\n    (the circle holds {', '.join(mods[m] for m in comp)})"
        for c, comp in cycles)


def test_backends_import_neither_ops_nor_adapters():
    graph, mods = import_graph()
    bad = [_edge(graph, mods, a, b) for a in graph if a.startswith("fastgnn.backends")
           for b in graph[a] if b.startswith(("fastgnn.ops", "fastgnn.torch"))]
    assert not bad, "the backends sit below the ops and the adapters:\n" + "\n".join(bad)


def test_production_code_does_not_import_the_test_helpers():
    graph, mods = import_graph()
    bad = [_edge(graph, mods, a, b) for a in graph if a != TEST_HELPERS
           for b in graph[a] if b == TEST_HELPERS]
    assert not bad, f"{TEST_HELPERS} is for tests and benchmarks only:\n" + "\n".join(bad)


def test_graph_imports_no_op_or_backend_at_module_level():
    graph, mods = import_graph()
    bad = [_edge(graph, mods, "fastgnn.graph", b) for b, (_, top) in graph["fastgnn.graph"].items()
           if top and b.startswith(("fastgnn.ops", "fastgnn.backends", "fastgnn.torch"))]
    assert not bad, "fastgnn.graph sits below the ops and backends:\n" + "\n".join(bad)


def test_the_cpu_path_and_the_cuda_loader_need_no_cupy():
    """Without CuPy (poisoned in sys.modules), `import fastgnn`, a CPU spmm and
    edge softmax, and the CUDA loader and compile check all import; no CuPy
    import is even attempted, and no CUDA launcher module is loaded."""
    code = textwrap.dedent("""
        import builtins, sys
        blocked = ("cupy", "cupyx", "cupy_backends")
        for name in blocked:
            sys.modules[name] = None
        attempts = []
        real_import = builtins.__import__

        def recording_import(name, *args, **kwargs):
            if name.split(".")[0] in blocked:
                attempts.append(name)
            return real_import(name, *args, **kwargs)
        builtins.__import__ = recording_import

        import numpy as np
        import fastgnn
        g = fastgnn.Graph.from_edge_index(np.array([[0, 1, 2], [1, 2, 1]]), num_nodes=4)
        out = fastgnn.spmm(g, np.ones((4, 3), np.float32))
        assert out.shape == (4, 3) and out[1, 0] == 2 and out[3, 0] == 0
        assert fastgnn.edge_softmax(g, np.zeros((3, 2), np.float32)).shape == (3, 2)
        cuda = sorted(m for m in sys.modules if m.startswith("fastgnn.backends.cuda"))
        assert not cuda, f"the CPU path loaded {cuda}"
        import fastgnn.backends.cuda.loader
        import fastgnn.backends.cuda.compile_check
        assert not attempts, f"tried to import {attempts}"
        launchers = sorted(m for m in sys.modules if m.startswith("fastgnn.backends.cuda.")
                           and m.rsplit(".", 1)[-1] not in ("loader", "compile_check"))
        assert not launchers, f"the loader pulled in {launchers}"
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().endswith("ok")
