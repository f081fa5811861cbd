"""The package's modules form a one-way graph: layers, no import circles, no module that only re-exports another.

The order is written once, in docs/architecture.md between the ``layers:begin`` and ``layers:end`` markers:
one line per layer, lowest first, each line the module prefixes (``apexrl.replay.wire``) of that layer; a module
belongs to the layer of its longest matching prefix. Modules of one line are peers: they may not import each
other either. Every ``import`` and ``from ... import`` counts, those inside functions included (a lazy import is
still a dependency), except those under ``if __name__ == "__main__":`` (a module run as a command is an entry
point, the top layer). The package's root ``apexrl/__init__.py`` is its facade (it re-exports names of every
layer on first use) and is not checked as an importer; importing from it counts as importing the extension
``apexrl._core``, the only module it imports eagerly.

Within one prefix the layers allow any order, so circles are checked on their own: no module may reach itself
through the imports of the package. Here every import counts: module level, inside functions (a lazy import is
a circle the interpreter meets later, not none), under ``if TYPE_CHECKING:`` (a type-only import is still what
the module's meaning rests on; a circle through one is the same knot, hidden from the interpreter) and under
``if __name__ == "__main__":`` (run as ``python -m``, the module is loaded as ``__main__``; a module it imports
that imports it back loads it a second time under its own name). An import of one of the module's own
packages is not an edge: Python runs a package's ``__init__`` before any of its modules anyway, and a package
that gathers its modules' names imports them.

A module that only re-exports another (nothing but imports from one module, ``__all__``, and aliasing such as
``sys.modules[__name__] = ...``) is a second name for one definition: callers import the real module. A
package's ``__init__`` that gathers the names of several of its modules is the package's surface, not a
re-export of another module, and is allowed.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "apexrl"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def read_layers(text: str) -> list[list[str]]:
    """The layers written between the markers, lowest first."""
    m = re.search(r"<!-- layers:begin -->\n```\n(.*?)```\n<!-- layers:end -->", text, re.S)
    assert m, "docs/architecture.md has no layers:begin / layers:end block"
    layers = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            layers.append(line.split())
    return layers


LAYERS = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")} | {"apexrl._core": PACKAGE / "_core.pyi"}


def layer_of(module: str, layers: list[list[str]]) -> tuple[int, str]:
    """(layer index, the prefix that placed it); KeyError for a module no prefix covers."""
    best = None
    for i, line in enumerate(layers):
        for prefix in line:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (i, prefix)
    if best is None:
        raise KeyError(module)
    return best


def imported(module: str, source: str, *, main_block: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every apexrl module ``source`` imports; those under ``if __name__ == "__main__":`` only
    with ``main_block``."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree) if not main_block else ():
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            skip.update(id(n) for n in ast.walk(node))
    out = []
    package = module if MODULES.get(module, pathlib.Path()).name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "apexrl"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "apexrl":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                target = sub if sub in MODULES else base
                out.append((node.lineno, "apexrl._core" if target == "apexrl" else target))
    return sorted(set(out))


def violations(module: str, source: str, layers: list[list[str]]) -> list[str]:
    own, own_prefix = layer_of(module, layers)
    found = []
    for line, target in imported(module, source):
        there, prefix = layer_of(target, layers)
        if there > own or (there == own and prefix != own_prefix):
            found.append(f"{module}:{line} imports {target} ({prefix}, layer {there}) from layer {own} ({own_prefix})")
    return found


def test_every_module_has_a_layer():
    missing = []
    for module in MODULES:
        if module == "apexrl":  # the facade (see the module docstring)
            continue
        try:
            layer_of(module, LAYERS)
        except KeyError:
            missing.append(module)
    assert not missing, f"no layer in docs/architecture.md covers {missing}"


def test_no_module_imports_a_higher_layer_or_a_peer():
    found = []
    for module, path in sorted(MODULES.items()):
        if module == "apexrl" or path.suffix != ".py":
            continue
        found += violations(module, path.read_text(encoding="utf-8"), LAYERS)
    assert not found, "layer violations (docs/architecture.md, layers:begin):\n" + "\n".join(found)


def test_the_package_root_imports_only_the_extension_eagerly():
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in eager] == ["__future__", "apexrl._core"]


@pytest.mark.parametrize(
    "module, source",
    [
        ("apexrl.replay.wire.codec", "from apexrl.cli.main import main\n"),
        ("apexrl.replay.wire.codec", "def f():\n    import apexrl.launch.local\n"),
        ("apexrl.security.keys", "from apexrl.replay.wire import roles\n"),
        ("apexrl.replay.server.config", "from apexrl.replay.client.sharded import connect\n"),
        ("apexrl.replay.wire.codec", "from ..client import replay_client\n"),
    ],
)
def test_the_check_flags_a_synthetic_violation(module, source):
    assert violations(module, source, LAYERS), source


@pytest.mark.parametrize(
    "module, source",
    [
        ("apexrl.replay.client.sharded", "from apexrl.replay.wire import protocol as P\n"),
        ("apexrl.offline.loader", 'if __name__ == "__main__":\n    from apexrl.cli.loader import main\n'),
        ("apexrl.replay.server.control", "from apexrl import PrioritizedStore\n"),
        ("apexrl.replay.server.control", "from . import epoch\n"),
    ],
)
def test_the_check_passes_what_the_rules_allow(module, source):
    assert not violations(module, source, LAYERS), source


# ------------------------------------------------------------------------------------------------ import circles


def import_edges(module: str, source: str) -> set[str]:
    """The modules of the package ``module`` depends on (module docstring: every import, but its own packages)."""
    return {
        target
        for _, target in imported(module, source, main_block=True)
        if target != module and not module.startswith(target + ".")
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a, b, ..., a) through each group of modules that reach each other, the groups sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

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
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in sorted(groups):
        members, start = set(group), group[0]
        paths = {start: [start]}
        queue = [start]
        while queue:  # the shortest way back to the group's first module, inside the group
            v = queue.pop(0)
            for w in sorted(graph[v] & members):
                if w == start:
                    found.append(paths[v] + [start])
                    queue = []
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return found


def package_graph() -> dict[str, set[str]]:
    return {
        module: import_edges(module, path.read_text(encoding="utf-8"))
        for module, path in sorted(MODULES.items())
        if module != "apexrl" and path.suffix == ".py"
    }


def test_no_import_circle():
    found = circles(package_graph())
    assert not found, "import circles in python/apexrl:\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize(
    "sources",
    [
        {  # a lazy import closes the circle
            "apexrl.apex.actor": "def run():\n    from apexrl.apex.recurrent import RecurrentActor\n",
            "apexrl.apex.recurrent": "from apexrl.apex.actor import Actor\n",
        },
        {  # run as python -m apexrl.offline.loader, it would load itself twice
            "apexrl.offline.loader": 'if __name__ == "__main__":\n    from apexrl.cli.loader import main\n',
            "apexrl.cli.loader": "from apexrl.offline.loader import load\n",
        },
        {
            "apexrl.apex.learner": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from apexrl.apex import evaluator\n",
            "apexrl.apex.evaluator": "from . import metrics\n",
            "apexrl.apex.metrics": "from .learner import Learner\n",
        },
    ],
)
def test_the_check_flags_a_synthetic_circle(sources):
    graph = {m: import_edges(m, src) for m, src in sources.items()}
    (circle,) = circles(graph)
    assert set(circle) == set(sources) and circle[0] == circle[-1], circle


def test_the_check_passes_a_package_and_its_modules():
    graph = {
        "apexrl.agents": "from apexrl.agents.base import AGENTS\nfrom apexrl.agents import dqn\n",
        "apexrl.agents.base": "def agent_names():\n    import apexrl.agents\n",
        "apexrl.agents.dqn": "from apexrl.agents.base import AgentDef\n",
    }
    assert not circles({m: import_edges(m, src) for m, src in graph.items()})


# ------------------------------------------------------------------------------------------------- re-exports


def _is_aliasing(node: ast.stmt) -> bool:
    """``__all__ = ...``, ``sys.modules[...] = ...`` or ``globals().update(...)``: a re-export's bookkeeping."""
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(
            (isinstance(t, ast.Name) and t.id == "__all__")
            or (isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules")
            for t in targets
        )
    return isinstance(node, ast.Expr) and (
        isinstance(node.value, ast.Constant)  # a docstring
        or (isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "globals().update")
    )


def reexports(module: str, source: str) -> str | None:
    """The one module ``source`` only re-exports (module docstring), or None."""
    tree = ast.parse(source)
    sources: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            sources.update(a.name for a in node.names if a.name != "sys")
        elif isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                continue
            if node.level or (node.module or "").split(".")[0] == "apexrl":
                sources.update(t for _, t in imported(module, ast.unparse(node)))
            else:
                sources.add(node.module or "")
        elif not _is_aliasing(node):
            return None  # the module defines something of its own
    return sources.pop() if len(sources) == 1 else None


def test_no_module_only_reexports_another():
    found = [
        f"{module} only re-exports {target}"
        for module, path in sorted(MODULES.items())
        if path.suffix == ".py" and (target := reexports(module, path.read_text(encoding="utf-8")))
    ]
    assert not found, "import the real module instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "module, source, target",
    [
        (
            "apexrl.replay.codec",
            '"""The old path."""\nimport sys\n\nfrom apexrl.replay.wire import codec as _module\n\n'
            "sys.modules[__name__] = _module\n",
            "apexrl.replay.wire.codec",
        ),
        (
            "apexrl.params",
            "from __future__ import annotations\n\nfrom apexrl.params.service import ParamClient, ParamServer\n\n"
            '__all__ = ["ParamClient", "ParamServer"]\n',
            "apexrl.params.service",
        ),
        (
            "apexrl.replay.client",
            "from apexrl.replay.client import replay_client as _rc\nfrom .replay_client import *\n"
            "from apexrl.replay.client.replay_client import __all__ as __all__\n"
            "globals().update(vars(_rc))\n",
            "apexrl.replay.client.replay_client",
        ),
    ],
)
def test_the_check_flags_a_synthetic_reexport(module, source, target):
    assert reexports(module, source) == target


@pytest.mark.parametrize(
    "module, source",
    [
        ("apexrl.nets", "from apexrl.nets.atari import NatureTorso\nfrom apexrl.nets.mlp import MLP\n"),
        ("apexrl.apex.nstep", "from apexrl.replay.adders.transition import NStepBuffer\n\ndef stack(ts):\n    pass\n"),
        ("apexrl.apex", '"""The Ape-X loops."""\n'),
    ],
)
def test_the_check_passes_a_package_surface_and_a_module_of_its_own(module, source):
    assert reexports(module, source) is None
