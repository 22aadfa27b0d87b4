"""The documentation stays whole: every relative link and anchor in the Markdown a user reads
resolves, every page of docs/ is reachable from the README, the README stays short, and
BENCHMARKS.md has a section, with its command, for every benchmark script in bench/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "BENCHMARKS.md",
        ROOT / "deploy" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
#: Scripts in bench/ that other benchmarks use and that print no figures of their own.
BENCH_HELPERS = {"__init__", "harness", "byte_relay", "replay_upstream", "tool_loop"}
#: The README is for a user: what it is, how to run it, where the details are.
README_MAX_LINES = 250

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """The anchors a page offers: explicit `<a id>`s and GitHub's slug of every heading."""
    text = _FENCE.sub("", page.read_text())
    anchors = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_FENCE.sub("", page.read_text()))
        if not re.match(r"[a-z]+:", target)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    links = _links(page)
    for target in links:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(ROOT)}: {target} names no file"
        if anchor:
            assert linked.suffix == ".md", f"{page.relative_to(ROOT)}: anchor into {path}"
            assert anchor in _anchors(linked), f"{page.relative_to(ROOT)}: no anchor {target}"


def test_the_anchor_reader_sees_headings_and_ids() -> None:
    # The check above is only as good as this: a heading's slug and an explicit id are seen,
    # a made-up anchor is not.
    anchors = _anchors(ROOT / "deploy" / "README.md")
    assert "guided-decoding-why-the-trtllm-configs-load-xgrammar" in anchors
    assert "metrics" in anchors
    assert "no-such-section" not in anchors
    assert "store_cost" in _anchors(ROOT / "BENCHMARKS.md")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _links(ROOT / "README.md")}
    for page in (ROOT / "docs").glob("*.md"):
        assert page.resolve() in linked, f"README.md does not link {page.relative_to(ROOT)}"


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to docs/"


def test_benchmarks_has_a_section_with_its_command_per_script() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    sections = dict(re.findall(r'<a id="([^"]+)"></a>\n(.*?)(?=\n<a id="|\Z)', text, re.S))
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py")} - BENCH_HELPERS
    assert scripts, "no benchmark scripts found"
    for script in sorted(scripts):
        assert script in sections, f"BENCHMARKS.md has no section for bench/{script}.py"
        assert f"bench/{script}.py" in sections[script], f"section {script} names no command"


#: The word "issue" followed by a number: a reader of the code has no issue tracker to look
#: those up in; a comment states the fact or the reason instead.
_HISTORY = re.compile(r"\bissues? #?[0-9]+", re.I)


def test_nothing_cites_our_issue_numbers() -> None:
    places = [ROOT / "proxy", ROOT / "tests", ROOT / "bench", ROOT / "docs", ROOT / "deploy"]
    files = [path for place in places for path in place.rglob("*") if path.is_file()]
    files += [ROOT / name for name in ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md")]
    found = []
    for path in files:
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml", ".json"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _HISTORY.search(line) and path != Path(__file__):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
