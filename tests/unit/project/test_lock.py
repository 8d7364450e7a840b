"""requirements.lock and pyproject.toml cannot drift apart.

pyproject.toml states the compatible ranges; requirements.lock the exact versions install.sh
installs, each with the sha256 of its files. A dependency added to pyproject without `make lock`,
or a pin outside its range, fails here rather than at someone's install.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import ROOT

LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)(\s|$)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def lock_entries() -> list[str]:
    """Each requirement of the lock as one line (continuations joined, comments dropped)."""
    entries: list[str] = []
    current = ""
    for raw in LOCK.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        current += " " + line.removesuffix("\\").strip()
        if not line.endswith("\\"):
            entries.append(current.strip())
            current = ""
    assert not current, "the lock ends inside a continued line"
    return entries


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def pinned() -> dict[str, Version]:
    versions: dict[str, Version] = {}
    for entry in lock_entries():
        match = PIN.match(entry)
        assert match, f"not an exact pin: {entry[:80]}"
        name = canonicalize_name(match["name"])
        assert name not in versions, f"{name} is pinned twice"
        versions[name] = Version(match["version"])
    return versions


def test_every_line_is_an_exact_pin_with_its_hashes() -> None:
    entries = lock_entries()
    assert len(entries) > 20
    for entry in entries:
        # no -e, URLs, index or find-links options: only name==version [; marker] --hash…
        assert PIN.match(entry), f"not an exact pin: {entry[:80]}"
        assert HASH.search(entry), f"no --hash for {entry.split()[0]}"
        for token in entry.split():
            if token.startswith("--"):
                assert HASH.fullmatch(token), f"{entry.split()[0]}: unexpected option {token}"


def test_the_lock_says_how_to_regenerate_it() -> None:
    head = LOCK.read_text().splitlines()[:3]
    assert any("make lock" in line for line in head), head
    assert "\nlock:" in (ROOT / "Makefile").read_text()


def test_every_pyproject_dependency_is_locked_inside_its_range(
    pyproject: dict[str, Any], pinned: dict[str, Version]
) -> None:
    project = pyproject["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    # the build backend too: install.sh builds the project (and sdists) with the locked one
    wanted += pyproject["build-system"]["requires"]
    assert len(wanted) >= 21
    for spec in wanted:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is in pyproject.toml but not in the lock: make lock"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{req.name}=={pinned[name]} in the lock is outside pyproject's {req.specifier}"
        )
    # an extra's own requirements are locked too (psycopg[binary] -> psycopg-binary)
    assert "psycopg-binary" in pinned
    # install.sh installs pip and setuptools from the lock before anything else
    assert {"pip", "setuptools"} <= set(pinned)


def test_every_runtime_dependency_has_a_range_with_an_upper_bound(
    pyproject: dict[str, Any],
) -> None:
    for spec in pyproject["project"]["dependencies"]:
        req = Requirement(spec)
        operators = {s.operator for s in req.specifier}
        assert operators & {"==", "<", "~="}, f"{req.name} has no upper bound: {req.specifier}"


def test_install_sh_installs_from_the_lock_with_hashes_only() -> None:
    script = (ROOT / "install.sh").read_text()
    step = script[script.index('step 3 "') : script.index('step 4 "')]
    installs = [line for line in step.splitlines() if '/bin/pip" install' in line]
    assert any("--require-hashes" in line and "requirements.lock" in line for line in installs)
    # the project itself adds nothing unlocked: no dependencies, no isolated build environment
    project = [line for line in installs if "-e ." in line]
    assert project, installs
    assert all("--no-deps" in line and "--no-build-isolation" in line for line in project)
    # every other pip install in the step checks hashes (no `pip install --upgrade pip`)
    assert all("--require-hashes" in line for line in installs if line not in project)
    # the "nothing to do" stamp changes with the lock
    assert "requirements.lock" in step.split("stamp=", 1)[1].split("\n", 2)[1]
