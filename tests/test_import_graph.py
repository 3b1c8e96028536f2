"""No import circles between modules of veronica, waggle and learning (issue 29).

A circle makes a newcomer read both modules to understand either, and makes import order matter.
The graph is grimp's (import-linter's): it parses every import statement, the ones inside functions
(lazy imports) and under TYPE_CHECKING included, so a circle hidden behind a lazy import counts too.
A package's __init__ importing its own submodules is an edge like any other.
"""
from __future__ import annotations

import grimp

PACKAGES = ("veronica", "waggle", "learning")


def circles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), each sorted."""
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
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def shortest_circle(graph, component: list[str]) -> list[str]:
    """One shortest circle through the component, as a closed path a -> ... -> a."""
    best: list[str] | None = None
    inside = set(component)
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & inside):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back and (best is None or len(back) + 1 < len(best)):
                best = [importer, *back]
    return best or component


def describe(graph, path: list[str]) -> str:
    steps = []
    for importer, imported in zip(path, path[1:]):
        lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
        steps.append(f"{importer} -> {imported} (line {', '.join(map(str, lines))})")
    return "\n    ".join(steps)


def test_circles_finds_a_circle():
    """The finder itself: a graph with a circle a -> b -> c -> a and a tail c -> d."""
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["a", "b", "c"]]
    assert shortest_circle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_circles():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    found = circles(graph)
    assert not found, "import circles (each component's modules, then one shortest circle through it; break it by " \
        "moving code down or passing a value in):\n" + "\n".join(
            f"  {', '.join(c)}\n    {describe(graph, shortest_circle(graph, c))}" for c in found)
