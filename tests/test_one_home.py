"""Each fact declared once, each concern in its one home — read from the source with `ast`, so a
second declaration fails here rather than drifting apart from the first:

- metric families and the registry's exposition are made only in `proxy/metrics/`;
- a string `input` becomes a user message only in `proxy/harmony/request/inputs.py`;
- the GenAI conventions' values and the stream limit's error code are written once.

The simulator is left out of the last two: it stands in for upstream, whose own values (its
`owned_by`, its reading of a string input) it copies, and they are not the proxy's."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"
#: What makes a metric family or writes a registry out.
METRIC_MAKERS = frozenset(
    {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum", "generate_latest"}
)
#: Facts written as one string constant, exactly once.
FACTS = ("too_many_streams", "tensorrt_llm", "chat")


def modules(*, simulator: bool = True) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if not simulator and relative.startswith("proxy/simulator/"):
            continue
        yield relative, ast.parse(path.read_text(), relative)


def test_metric_families_are_made_only_in_the_metrics_package() -> None:
    outside = [
        f"{name}: {alias.name} from {node.module}"
        for name, tree in modules()
        if not name.startswith("proxy/metrics/")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client")
        for alias in node.names
        if alias.name in METRIC_MAKERS
    ]
    assert outside == [], "declare metric families in proxy/metrics/ (families.py)"


def _user_message(node: ast.AST) -> bool:
    """A dict display `{"role": "user", "content": text}` (with or without `type`): a message
    made of a text held in a variable."""
    if not isinstance(node, ast.Dict):
        return False
    pairs = {
        key.value: value
        for key, value in zip(node.keys, node.values, strict=True)
        if isinstance(key, ast.Constant)
    }
    role = pairs.get("role")
    return (
        isinstance(role, ast.Constant)
        and role.value == "user"
        and "content" in pairs
        and isinstance(pairs["content"], ast.Name)
    )


def test_a_string_input_becomes_a_user_message_in_one_place() -> None:
    found = [
        f"{name}:{node.lineno}"
        for name, tree in modules(simulator=False)
        for node in ast.walk(tree)
        if _user_message(node)
    ]
    assert [place.partition(":")[0] for place in found] == ["proxy/harmony/request/inputs.py"], (
        f"use proxy.harmony.request.inputs.as_items, not {found}"
    )


def test_each_fact_is_written_once() -> None:
    seen = Counter(
        (node.value, name)
        for name, tree in modules(simulator=False)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in FACTS
    )
    places = {fact: [name for (value, name) in seen if value == fact] for fact in FACTS}
    assert places == {
        "too_many_streams": ["proxy/server/deps.py"],
        "tensorrt_llm": ["proxy/semconv.py"],
        "chat": ["proxy/semconv.py"],
    }
    assert all(count == 1 for count in seen.values()), seen
