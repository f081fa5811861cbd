"""python/apexrl/_core.pyi keeps up with the extension: the same public names, module-level and per class."""

from __future__ import annotations

import ast
import pathlib

from apexrl import _core

STUB = pathlib.Path(_core.__file__).resolve().parent / "_core.pyi"
if not STUB.exists():  # an editable install: the extension is built elsewhere, the stub is in the source tree
    STUB = pathlib.Path(__file__).resolve().parents[1] / "python" / "apexrl" / "_core.pyi"


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def stub_names() -> tuple[set[str], dict[str, set[str]]]:
    """The stub's module-level names and each class's member names."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {
                n.name if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else n.target.id
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
            }
    return names, members


def test_the_stub_names_every_public_name_of_the_extension_and_no_other():
    names, _ = stub_names()
    real = public(dir(_core))
    assert real - names == set(), f"_core.pyi lacks {sorted(real - names)}"
    assert public(names) - real == set(), f"_core.pyi names what _core does not have: {sorted(public(names) - real)}"


def test_each_stubbed_class_names_the_public_members_of_the_extension_class():
    _, members = stub_names()
    missing, extra = {}, {}
    for cls, stubbed in members.items():
        own = getattr(_core, cls)
        real = public(n for n in dir(own) if n not in dir(object) and n not in dir(BaseException))
        if real - stubbed:
            missing[cls] = sorted(real - stubbed)
        if public(stubbed) - real:
            extra[cls] = sorted(public(stubbed) - real)
    assert not missing, f"_core.pyi classes lack {missing}"
    assert not extra, f"_core.pyi classes name members the extension lacks: {extra}"
