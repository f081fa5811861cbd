"""``.ci/run`` builds the package without pip's build isolation (so that its build directory stays usable for the
C++ unit tests), so it installs pyproject.toml's build requirements itself: each must be there, as declared."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_installs_the_build_requirements_pyproject_declares():
    # Python 3.10 has no tomllib: the one line of [build-system] read by hand.
    declared = re.search(r"^requires = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared, "pyproject.toml has no build-system requires line"
    requires = re.findall(r'"([^"]+)"', declared.group(1))
    script = (ROOT / ".ci" / "run").read_text()
    installs = " ".join(line for line in script.splitlines() if re.match(r"\s*python -m pip install", line))
    assert requires, "pyproject.toml declares no build requirements"
    for requirement in requires:
        assert f"'{requirement}'" in installs, f".ci/run does not install the build requirement {requirement!r}"
    assert "--no-build-isolation" in script
