"""The package's layers point one way: no module imports a module of a higher layer.

The order is written once, in docs/architecture.md between the ``layers:begin`` and ``layers:end`` markers:
one line per layer, lowest first, each line the module prefixes (``apexrl.replay.wire``) of that layer; a module
belongs to the layer of its longest matching prefix. Modules of one line are peers: they may not import each
other either. Every ``import`` and ``from ... import`` counts, those inside functions included (a lazy import is
still a dependency), except those under ``if __name__ == "__main__":`` (a module run as a command is an entry
point, the top layer). The package's root ``apexrl/__init__.py`` is its facade (it re-exports names of every
layer on first use) and is not checked as an importer; importing from it counts as importing the extension
``apexrl._core``, the only module it imports eagerly.
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


def imported(module: str, source: str) -> list[tuple[int, str]]:
    """(line, module) of every apexrl module ``source`` imports, but those under ``if __name__ == "__main__":``."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
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
