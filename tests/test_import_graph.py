"""No import circles in ``interlock``, ``TYPE_CHECKING`` imports included.

Two modules that need each other share a narrow interface that lives below both (a Protocol of
the few calls one makes on the other: ``router/directory.py``, ``engine/control.py``'s
``ControlTarget``, ``cluster/fleet.py``'s ``Workers``, ``sim/planned.py``'s ``SimFleet``), never
the whole object that owns them. The layered contract in ``pyproject.toml`` (``lint-imports``)
keeps packages apart; this test keeps modules within a package from closing a loop.
"""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_package_has_no_import_circles() -> None:
    graph = grimp.build_graph("interlock", exclude_type_checking_imports=False)
    assert cycles(graph) == []


def test_the_check_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert cycles(graph) == [["p.a", "p.b"]]
