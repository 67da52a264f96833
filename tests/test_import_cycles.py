"""No import cycles; imports only down the layers: codec <- storage <- service, codec <- client,
system <- service and client, service + client <- cli.

The import graph is read statically: every module of the ``tdreplay``
packages (the ``system``, ``codec``, ``storage``, ``service``, ``client`` and
``cli`` folders, and ``adapters/torchrl`` for ``tdreplay.torchrl``) is
parsed with :mod:`ast`, and each ``import`` / ``from ... import`` (relative
ones resolved) is an edge to the tdreplay module it names — to the submodule
when ``from package import name`` names one, else to the package.

Which imports count:

* **Cycles** count every import: module-level ones, those in function bodies
  (a deferred import that dodges a cycle at import time still ties the two
  modules into one design knot) and those under ``if TYPE_CHECKING:`` (a type
  is a dependency too). Cycles that remain are listed in :data:`KNOWN_CYCLES`,
  which the test holds accurate: a listed cycle that is gone fails it too, so
  the list only shrinks. :func:`test_no_import_cycles_at_import_time` holds the
  module-level imports alone to none at all.
* **Layers** are about what a package may know: every import counts there,
  in a function or under ``TYPE_CHECKING`` too (``tests/test_layering.py``
  checks the same rule at run time, by what importing a package loads). One
  module is exempt, :data:`ENTRY_POINT` (``python -m tdreplay.service``): a
  program's entry that nothing imports, running the command line above it.

The service uses storage through its public API only: ``from tdreplay.storage
import <name>`` with the name in ``tdreplay.storage.__all__``, never a storage
submodule (:func:`test_the_service_uses_only_the_storage_api`).

Parent packages are not edges: importing ``tdreplay.client.plans`` runs
``tdreplay/client/__init__`` first, but a submodule importing its partly
initialised parent is Python's normal package shape, not a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("system", "codec", "storage", "service", "client", "torchrl", "cli")
# The folder of each package, where it is not the package's own name.
FOLDERS: dict[str, str] = {"torchrl": "adapters/torchrl"}

# What each package may import of tdreplay (besides itself).
LAYERS: dict[str, frozenset[str]] = {
    "system": frozenset(),  # what tdreplay asks of the operating system
    "codec": frozenset(),
    "storage": frozenset({"codec"}),
    "service": frozenset({"storage", "codec", "system"}),
    "client": frozenset({"codec", "system"}),
    "torchrl": frozenset({"client", "codec", "system"}),  # an adapter on the client side
    # the command line: serve (the service's), and programs driving a server through the
    # public client as a user's script would, or reading a data root without one
    "cli": frozenset({"service", "client", "storage", "codec", "system"}),
}

# The one module outside the layers. `python -m tdreplay.service serve` is documented as the
# same thing as `tdreplay serve`, so service/__main__.py runs the command line's serve, which
# sits above the service. It is a program's entry point, not part of the service: nothing
# imports it (test_the_entry_point_is_imported_by_nothing), so the service's layer never
# reaches the command line through it. Exempt from the layers only; cycles still count it.
ENTRY_POINT = "tdreplay.service.__main__"

# Cycles still in the code, each as the set of modules it joins (a strongly connected
# component of the graph of every import, deferred and TYPE_CHECKING ones included): none.
# Add none: break a new cycle instead.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    runtime: bool  # module level and not under TYPE_CHECKING: runs when ``source`` is imported
    deferred: bool = False  # in a function's body: runs when the function is called


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Every tdreplay module by dotted name (``tdreplay.client.plans``; packages by their own)."""
    out = {}
    for pkg in PACKAGES:
        folder = root / FOLDERS.get(pkg, pkg)
        for path in sorted(folder.rglob("*.py")):
            parts = (pkg, *path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("tdreplay", *parts))] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(
    body: list[ast.stmt], runtime: bool = True, deferred: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """The import statements of ``body``, whether each runs at import time, and whether it
    stands in a function's body."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, runtime, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.body, False, deferred)
            yield from _statements(node.orelse, runtime, deferred)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _statements(node.body, False, True)
        else:  # class bodies, try/with/if/for blocks: they run where they stand
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    yield from _statements(
                        [child] if isinstance(child, ast.stmt) else child.body, runtime, deferred
                    )


def imports(modules: dict[str, Path]) -> list[Import]:
    """Every edge from a tdreplay module to a tdreplay module."""
    edges = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, runtime, deferred in _statements(ast.parse(path.read_text(), str(path)).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".")
                    up = node.level - 1 if is_package else node.level
                    base = base[: len(base) - up]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}"
                    targets.append(sub if sub in modules else prefix)
            for target in targets:
                # `import tdreplay.client.plans` names the deepest module that exists
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges.append(Import(name, target, node.lineno, runtime, deferred))
    return edges


def components(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_cycle(graph: dict[str, set[str]], comp: frozenset[str]) -> list[str]:
    """A shortest cycle through the component's first module, as ``[a, b, ..., a]``."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")


def runtime_graph(edges: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.runtime:
            graph[e.source].add(e.target)
    return graph


def package(module: str) -> str:
    return module.split(".")[1]


def test_the_walker_reads_each_kind_of_import(tmp_path: Path) -> None:
    """Guards the test itself: a walker that finds nothing would pass everything."""
    files = {
        "client/__init__.py": "from .a import A\n",
        "client/a.py": (
            "from typing import TYPE_CHECKING\n"
            "from . import b\n"  # a submodule: edge to it
            "from . import A\n"  # a name of the package: edge to the package
            "import tdreplay.codec.c\n"
            "if TYPE_CHECKING:\n    from .d import D\n"
            "else:\n    from ..codec import c\n"
            "try:\n    from .e import E\nexcept ImportError:\n    pass\n"
            "class A:\n    from .f import F\n    def g(self):\n        from ..storage import s\n"
        ),
        **{f"client/{m}.py": "" for m in "bdef"},
        "codec/__init__.py": "",
        "codec/c.py": "",
        "storage/__init__.py": "",
        "storage/s.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = {
        (e.target.removeprefix("tdreplay."), e.runtime, e.deferred)
        for e in imports(module_files(tmp_path))
        if e.source == "tdreplay.client.a"
    }
    assert got == {
        ("client.b", True, False),
        ("client", True, False),
        ("codec.c", True, False),
        ("client.d", False, False),
        ("client.e", True, False),
        ("client.f", True, False),
        ("storage.s", False, True),
    }


def test_the_walker_sees_the_modules_and_their_edges() -> None:
    modules = module_files()
    assert {"tdreplay.codec.arrow", "tdreplay.client.sync", "tdreplay.storage.table"} <= set(
        modules
    )
    edges = {(e.source, e.target) for e in imports(modules) if e.runtime}
    assert ("tdreplay.client.sync", "tdreplay.client.base") in edges  # from .base import ...
    assert ("tdreplay.client.aio", "tdreplay.client.dumps") in edges  # from . import dumps
    assert (
        "tdreplay.client.commands",
        "tdreplay.codec.arrow",
    ) in edges  # from ..codec import arrow
    # adapters/torchrl is read as tdreplay.torchrl
    assert ("tdreplay.torchrl.buffer", "tdreplay.client") in edges  # from tdreplay.client import
    assert ("tdreplay.torchrl.buffer", "tdreplay.torchrl.rows") in edges  # from . import rows
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert components(graph) == [frozenset("abc")]
    assert a_cycle(graph, frozenset("abc")) == ["a", "b", "c", "a"]


def full_graph(edges: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every import as an edge: module level, in functions, under ``TYPE_CHECKING``."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        graph[e.source].add(e.target)
    return graph


def test_no_import_cycles() -> None:
    modules = module_files()
    graph = full_graph(imports(modules), modules)
    found = set(components(graph))
    new = [" -> ".join(a_cycle(graph, c)) for c in sorted(found - KNOWN_CYCLES, key=sorted)]
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not new, "import cycles (break them; see the module doc):\n  " + "\n  ".join(new)
    assert not gone, f"no longer cycles: remove them from KNOWN_CYCLES: {gone}"


def test_no_import_cycles_at_import_time() -> None:
    modules = module_files()
    graph = runtime_graph(imports(modules), modules)
    cycles = [" -> ".join(a_cycle(graph, c)) for c in components(graph)]
    assert not cycles, cycles


def test_no_deferred_imports() -> None:
    """No tdreplay module is imported in a function's body: a deferred import hides a
    dependency from whoever reads the module's head (and, where it dodges a cycle, keeps
    the knot). Third-party optional dependencies (redis, minari) are not counted."""
    deferred = [
        f"{e.source} (line {e.line}) imports {e.target} in a function"
        for e in imports(module_files())
        if e.deferred
    ]
    assert not deferred, "deferred imports (import at the module's head):\n  " + "\n  ".join(
        deferred
    )


def test_client_has_no_cycles_even_through_type_checking_imports() -> None:
    """The client's twins, loader and writer meet in base.py and protocols, not in each other."""
    modules = module_files()
    graph: dict[str, set[str]] = {m: set() for m in modules if package(m) == "client"}
    for e in imports(modules):
        if e.source in graph and e.target in graph:
            graph[e.source].add(e.target)
    cycles = [" -> ".join(a_cycle(graph, c)) for c in components(graph)]
    assert not cycles, cycles


def test_imports_follow_the_layers() -> None:
    """Every import, run-time or not: a package imports itself and the layers below it only."""
    bad = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in imports(module_files())
        if package(e.target) != package(e.source)
        and package(e.target) not in LAYERS[package(e.source)]
        and e.source != ENTRY_POINT
    ]
    assert not bad, (
        "imports against the layering codec <- storage <- service, codec <- client <- torchrl, "
        "service + client <- cli:\n  " + ("\n  ".join(bad))
    )


def test_the_entry_point_is_imported_by_nothing() -> None:
    """:data:`ENTRY_POINT` is outside the layers because nothing imports it: a module that
    something imports is part of its package, and its imports are that package's."""
    modules = module_files()
    assert ENTRY_POINT in modules
    imported = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in imports(modules)
        if e.target == ENTRY_POINT
    ]
    assert not imported, imported


def storage_imports_of(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """Every import of tdreplay.storage in ``path``, anywhere in it: ``(line, module, name)``.

    ``name`` is what ``from module import name`` takes (``None`` for ``import module``).
    """
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tdreplay.storage" or alias.name.startswith("tdreplay.storage."):
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "tdreplay":
                for alias in node.names:
                    if alias.name == "storage":
                        yield node.lineno, "tdreplay.storage", None
            elif node.module == "tdreplay.storage" or node.module.startswith("tdreplay.storage."):
                for alias in node.names:
                    yield node.lineno, node.module, alias.name


def storage_api_misuses(root: Path, exported: set[str]) -> list[str]:
    """What the service under ``root`` takes from storage besides ``from tdreplay.storage import <exported>``."""
    bad = []
    for path in sorted((root / "service").rglob("*.py")):
        where = path.relative_to(root)
        for line, module, name in storage_imports_of(path):
            if module != "tdreplay.storage":
                why = f"{where}:{line} imports from {module} (a storage submodule)"
            elif name is None:
                why = f"{where}:{line} imports the storage package as a module"
            elif name not in exported:
                why = f"{where}:{line} imports {name!r}, not in tdreplay.storage.__all__"
            else:
                continue
            if why not in bad:  # one line per statement, however many names it takes
                bad.append(why)
    return bad


def test_the_storage_api_check_sees_each_misuse(tmp_path: Path) -> None:
    """Guards the check below: each way round the public API is caught, the API itself is not."""
    (tmp_path / "service" / "routes").mkdir(parents=True)
    (tmp_path / "service" / "ok.py").write_text("from tdreplay.storage import Table\n")
    (tmp_path / "service" / "routes" / "bad.py").write_text(
        "from tdreplay.storage.errors import SchemaError\n"
        "import tdreplay.storage.spec\n"
        "from tdreplay import storage\n"
        "def f():\n    from tdreplay.storage import _private\n"
    )
    assert storage_api_misuses(tmp_path, {"Table"}) == [
        "service/routes/bad.py:1 imports from tdreplay.storage.errors (a storage submodule)",
        "service/routes/bad.py:2 imports from tdreplay.storage.spec (a storage submodule)",
        "service/routes/bad.py:3 imports the storage package as a module",
        "service/routes/bad.py:5 imports '_private', not in tdreplay.storage.__all__",
    ]


def test_the_service_uses_only_the_storage_api() -> None:
    """The service imports ``from tdreplay.storage import <name in __all__>`` and nothing else of storage."""
    import tdreplay.storage

    exported = set(tdreplay.storage.__all__)
    assert exported <= set(vars(tdreplay.storage)), "storage's __all__ names what it lacks"
    bad = storage_api_misuses(REPO, exported)
    assert not bad, "export it from storage/__init__.py (__all__) instead:\n  " + "\n  ".join(bad)


def table_reaches(root: Path) -> list[str]:
    """Where the same-host door under ``root`` reaches into a table: ``<x>.table.<y>`` (a
    handle's table, and through it its spec, sampler or storage), or an import of ``Table``
    or ``TableHandle``. The door decodes frames into core operations and encodes what they
    give (a ``Shape`` for a slot's layout); the core alone touches tables."""
    bad = []
    for path in sorted((root / "service" / "shm").rglob("*.py")):
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "table"
            ):
                bad.append(f"{where}:{node.lineno} reads .table.{node.attr}")
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in ("Table", "TableHandle"):
                        bad.append(f"{where}:{node.lineno} imports {alias.name}")
    return bad


def test_the_table_reach_check_sees_each_misuse(tmp_path: Path) -> None:
    (tmp_path / "service" / "shm").mkdir(parents=True)
    (tmp_path / "service" / "shm" / "c.py").write_text(
        "from ..core.handle import TableHandle\n"
        "from tdreplay.storage import Table, InvalidRequest\n"
        "def f(handle, done):\n"
        "    done.table = 'name'\n"
        "    return handle.table.spec.torch_schema()\n"
    )
    assert table_reaches(tmp_path) == [
        "service/shm/c.py:1 imports TableHandle",
        "service/shm/c.py:2 imports Table",
        "service/shm/c.py:5 reads .table.spec",
    ]


def test_the_shared_memory_door_never_touches_a_table() -> None:
    bad = table_reaches(REPO)
    assert not bad, "ask the core (service/core) instead:\n  " + "\n  ".join(bad)


def private_lock_reaches(root: Path) -> list[str]:
    """Where code outside the table (``storage/table``) takes a table's private locks or
    hooks (``_cond``, ``_data_lock``, ``_before_write``): a checkpoint and an export consume
    ``Table.snapshot()`` and ``Table.items()`` instead."""
    bad = []
    for path in sorted(
        p for pkg in ("storage", "service", "adapters") for p in (root / pkg).rglob("*.py")
    ):
        where = path.relative_to(root)
        if where.parts[:2] == ("storage", "table") or where.name == "rwlock.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("_cond", "_data_lock", "_before_write")
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                bad.append(f"{where}:{node.lineno} takes .{node.attr}")
    return bad


def test_the_private_lock_check_sees_each_misuse(tmp_path: Path) -> None:
    (tmp_path / "storage" / "checkpoint").mkdir(parents=True)
    (tmp_path / "storage" / "table").mkdir(parents=True)
    (tmp_path / "storage" / "checkpoint" / "w.py").write_text(
        "def f(table):\n    with table._cond, table._data_lock.read():\n"
        "        table._before_write.append(None)\n"
    )
    (tmp_path / "storage" / "table" / "ok.py").write_text("def g(table):\n    table._cond\n")
    assert private_lock_reaches(tmp_path) == [
        "storage/checkpoint/w.py:2 takes ._cond",
        "storage/checkpoint/w.py:2 takes ._data_lock",
        "storage/checkpoint/w.py:3 takes ._before_write",
    ]


def test_nothing_outside_the_table_takes_its_locks() -> None:
    bad = private_lock_reaches(REPO)
    assert not bad, "use Table.snapshot() / Table.items() instead:\n  " + "\n  ".join(bad)
