"""ARCHITECTURE.md stays in step with the tree and with the lint configuration: its module map
lists every package and module under `proxy/` (and nothing that is not there), and its floors
are the ones pyproject.toml's import-linter contracts enforce, in the same order."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "ARCHITECTURE.md").read_text()


def section(title: str) -> str:
    """The text of the `## title` section."""
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else len(DOC)]


def tree() -> set[str]:
    """Every module (`proxy/a/b.py`) and package (`proxy/a/`) under proxy/."""
    found = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py":
            found.add(relative.removesuffix("__init__.py"))
        else:
            found.add(relative)
    return found


def mapped() -> list[str]:
    """The first column of the module map's table rows."""
    return re.findall(r"^\| `(proxy/[^`]*)` \|", section("Module map"), re.MULTILINE)


def test_the_module_map_lists_every_module_once() -> None:
    listed = mapped()
    assert len(listed) == len(set(listed)), "listed twice: " + ", ".join(
        sorted({name for name in listed if listed.count(name) > 1})
    )
    missing = sorted(tree() - set(listed))
    stale = sorted(set(listed) - tree())
    assert not missing, f"add to ARCHITECTURE.md's module map: {missing}"
    assert not stale, f"remove from ARCHITECTURE.md's module map (no such module): {stale}"


def contract_layers(contract_id: str) -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["id"] == contract_id:
            return [[part.strip() for part in layer.split("|")] for layer in contract["layers"]]
    raise AssertionError(f"no import-linter contract {contract_id!r}")


def documented_floors(table_after: str) -> list[list[str]]:
    """The floors of the first table after the line containing `table_after`, top down."""
    text = section("Layers")
    rows = text[text.index(table_after) :].split("\n\n")[1]
    floors = []
    for row in rows.splitlines()[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip("|"))]
        floors.append(re.findall(r"`([\w.]+)`", cells[1]))
    return floors


def test_the_floors_are_the_lint_configurations() -> None:
    assert documented_floors("contract `proxy`") == contract_layers("proxy")
    assert documented_floors("contract `server`") == contract_layers("server")
