"""The house rules of docs/LAYOUT.md, checked on the source: no import cycle anywhere, no lower layer importing a
higher one, and the torch-free layers free of torch, triton and sympy. Every import counts, including those inside
functions: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("formats", "loader", "packager", "exporter", "serving")

# Layers, lowest first: a module may import its own layer and those listed before it. Within the exporter the
# rooms are ranked the same way; a room missing here is an error, so a new room has to be placed on purpose.
LAYERS = ["formats", "loader", "packager", "serving", "exporter"]  # serving: beside the exporter, never importing it
ROOMS = [
    {"errors"},                                     # typed errors, shared by every room
    {"options", "progress"},                        # option records and the progress reporter, passed as values
    {"build_cache"},                                # the content-addressed kernel cache
    {"ir"},                                         # the loop IR and the kernel list
    {"front"},                                      # model file, dynamic spec, capture, relations, autograd
    {"lower"},                                      # FX graph -> loop IR
    {"schedule"},                                   # fuse, attention, split-K, memory plan
    {"cpu", "cuda"},                                # codegen and build per target (never each other)
    {"package"},                                    # manifest and member bytes from the pipeline's results
    {"check"},                                      # --verify, the Triton interpreter, ONNX
    {"pipeline"},                                   # the stage lists
    {"tune", "blockers"},                           # tools over the pipeline: --autotune measures, --report lists blockers
    {"__init__"},                                   # the public API: export(), which may call the tuning tool
    {"prebuild"},                                   # many exports in one call, for CI
    {"cli"},                                        # the command line
]
TORCH_FREE = {"formats", "loader", "packager", "serving"}
HEAVY = {"torch", "triton", "sympy"}

def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__" and len(parts) > 1:
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _imports(mod: str, path: Path, mods: dict) -> tuple[set[str], set[str]]:
    """(our modules it imports, third-party top-level names it imports)."""
    ours, third = set(), set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")[: len(mod.split(".")) - (0 if is_pkg else 1)]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        for n in names:
            n = n.removeprefix("tcexport.")
            if n.split(".")[0] in PACKAGES:
                while n not in mods and "." in n:
                    n = n.rsplit(".", 1)[0]
                if n in mods and n != mod:
                    ours.add(n)
            elif n and not n.startswith("tcexport"):
                third.add(n.split(".")[0])
    return ours, third


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return mods, {m: _imports(m, p, mods) for m, p in mods.items()}


def _rank(mod: str) -> tuple[int, int]:
    parts = mod.split(".")
    layer = LAYERS.index(parts[0])
    if parts[0] != "exporter":
        return layer, 0
    room = parts[1] if len(parts) > 1 else "__init__"
    for k, rooms in enumerate(ROOMS):
        if room in rooms:
            return layer, k
    raise AssertionError(f"exporter/{room} is not placed in tests/test_layers.py ROOMS (and docs/LAYOUT.md)")


def _violations(graph) -> set[str]:
    mods, deps = graph
    out = set()
    for m, (ours, third) in deps.items():
        for d in ours:
            (ml, mr), (dl, dr) = _rank(m), _rank(d)
            same_rank_sibling = ml == dl and mr == dr and m.split(".")[:2] != d.split(".")[:2]
            if dl > ml or (dl == ml and dr > mr) or (same_rank_sibling and m.startswith("exporter.")):
                out.add(f"{m} -> {d}")
        if m.split(".")[0] in TORCH_FREE:
            out |= {f"{m} -> {t}" for t in third & HEAVY}
    return out | {"cycle: " + " -> ".join(c) for c in _cycles(deps)}


def _cycles(deps) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in deps:
        if v not in index:
            visit(v)
    return out


def test_no_cycle_and_layers_respected(graph):
    found = sorted(_violations(graph))
    assert not found, "imports that break docs/LAYOUT.md:\n  " + "\n  ".join(found)


def test_rule_catches_a_cycle_and_an_upward_import():
    deps = {"exporter.ir.a": ({"exporter.lower.b"}, set()), "exporter.lower.b": ({"exporter.ir.a"}, set()),
            "formats.x": ({"loader.y"}, {"torch"}), "loader.y": (set(), set())}
    found = _violations((None, deps))
    assert "exporter.ir.a -> exporter.lower.b" in found
    assert "formats.x -> loader.y" in found and "formats.x -> torch" in found
    assert any(v.startswith("cycle: ") for v in found)


# Longer than the house limits, each for a reason.
LONG: dict[str, str] = {}
MAX_FILE_LINES, MAX_FUNCTION_LINES = 800, 80


def test_files_and_functions_stay_small():
    """A file past ~800 lines or a function past ~80 is a concept that wants its own name (STYLE.md #9)."""
    found = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel, src = f.relative_to(ROOT).as_posix(), f.read_text()
            if src.count("\n") > MAX_FILE_LINES and rel not in LONG:
                found.append(f"{rel}: {src.count(chr(10))} lines")
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG:
                        found.append(f"{rel}:{node.name}: {length} lines")
    assert not found, "split these, or name the reason in LONG:\n  " + "\n  ".join(found)


def test_every_package_folder_is_installed():
    """A room missing from pyproject's ``packages`` works in a checkout but not in an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"tcexport." + ".".join(f.parent.relative_to(ROOT).parts) for pkg in PACKAGES
             for f in (ROOT / pkg).rglob("__init__.py")}
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"
