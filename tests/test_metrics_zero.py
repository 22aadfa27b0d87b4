"""Metrics from the first scrape: every series the Grafana dashboard or an
alert rule selects exists in a fresh proxy's `/metrics`, before any traffic, so panels never show
"No data" and `rate()`/`increase()` see the first failure. The label sets come from the code's
own fixed sets; the second half checks those sets against the code that uses them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings
from proxy.harmony.constraint import CONSTRAINT_KINDS
from proxy.harmony.stream.events import ITEM_EVENT_TYPES
from proxy.harmony.stream.record import MALFORMED_KINDS
from proxy.metrics.serving import COMPACTION_TRIGGERS, HTTP_LIMIT_KINDS, UPSTREAM_ERROR_KINDS
from proxy.server.app import create_app
from tests.deploy_support import dashboard_queries, rule_queries, substitute
from tests.live import LiveServer
from tests.upstream_double import UpstreamDouble
from tests.workers_support import start_workers

ROOT = Path(__file__).resolve().parent.parent
#: Labels Prometheus adds when it scrapes; not on the proxy's own samples.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod"})
MODELS = ("openai/gpt-oss-120b",)

Sample = tuple[str, dict[str, str]]


@pytest.fixture(scope="module", params=["one process", "two workers"])
def fresh(
    request: pytest.FixtureRequest, encoding: HarmonyEncoding, tmp_path_factory: Any
) -> list[Sample]:
    """The samples of a just-started proxy's /metrics: nothing served yet. With worker
    processes: what a `serve --workers 2` answers, read from every process's
    multiprocess files."""
    double = UpstreamDouble()
    with LiveServer(double) as upstream:
        if request.param == "two workers":
            folder = tmp_path_factory.mktemp("workers")
            flags = ("--metrics-models", ",".join(MODELS), "--data-dir", str(folder / "data"))
            workers = start_workers(upstream.url, folder / "proxy.log", *flags)
            try:
                text = httpx.get(workers.url + "/metrics", timeout=5).text
            finally:
                workers.process.stop()
        else:
            settings = Settings(upstream_url=upstream.url, metrics_models=MODELS)
            app = create_app(settings, encoding, registry=CollectorRegistry())
            with LiveServer(app) as proxy:
                text = httpx.get(proxy.url + "/metrics", timeout=5).text
    return [
        (sample.name, dict(sample.labels))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def selectors(expr: str) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _matches(op: Any, value: str, actual: str | None) -> bool:
    actual = actual or ""
    if op == promql_parser.MatchOp.Equal:
        return actual == value
    if op == promql_parser.MatchOp.NotEqual:
        return actual != value
    matched = re.fullmatch(value, actual) is not None
    return matched if op == promql_parser.MatchOp.Re else not matched


def wanted(selector: Any) -> list[list[tuple[Any, str, str]]]:
    """The label matchers a sample must meet, once per alternative of an `a|b|c` regex (each
    alternative must exist on its own: `outcome=~"upstream_error|failed"` needs both)."""
    plain = [
        (m.op, m.name, m.value)
        for m in selector.matchers.matchers
        if m.name not in TARGET_LABELS and m.name != "__name__"
    ]
    variants = [plain]
    for op, name, value in plain:
        if op == promql_parser.MatchOp.Re and re.fullmatch(r"[\w.|]+", value) and "|" in value:
            alternatives = value.split("|")
            variants = [
                [
                    (promql_parser.MatchOp.Equal, name, alt) if (n == name) else (o, n, v)
                    for o, n, v in variant
                ]
                for variant in variants
                for alt in alternatives
            ]
    return variants


QUERIES = dashboard_queries() + rule_queries()


@pytest.mark.parametrize("query", QUERIES, ids=lambda query: query.where)
def test_every_selected_series_exists_before_any_traffic(fresh: list[Sample], query: Any) -> None:
    for selector in selectors(substitute(query.expr)):
        for matchers in wanted(selector):
            present = [
                labels
                for name, labels in fresh
                if name == selector.name
                and all(_matches(op, value, labels.get(label)) for op, label, value in matchers)
            ]
            assert present, f"{selector.name} {matchers}: no series at start-up"


def test_the_fixed_label_sets_are_exported_whole(fresh: list[Sample]) -> None:
    def values(name: str, label: str) -> set[str]:
        return {labels[label] for sample, labels in fresh if sample == name}

    assert values("proxy_upstream_errors_total", "kind") == set(UPSTREAM_ERROR_KINDS)
    assert values("proxy_malformed_outputs_total", "kind") == set(MALFORMED_KINDS)
    assert values("proxy_http_limits_total", "kind") == set(HTTP_LIMIT_KINDS)
    assert values("proxy_recovered_events_total", "type") == set(ITEM_EVENT_TYPES)
    assert values("proxy_requests_total", "model") == {"other", *MODELS}
    assert values("proxy_constraint_refusals_total", "constraint") == set(CONSTRAINT_KINDS)
    assert values("proxy_constraint_violations_total", "constraint") == set(CONSTRAINT_KINDS)
    assert values("proxy_constraint_violations_total", "enforced") == {"true", "false"}
    assert values("proxy_compactions_total", "trigger") == set(COMPACTION_TRIGGERS)
    assert values("proxy_compactions_total", "outcome") == {"ok", "failed"}
    assert ("proxy_upstream_guided_decoding", {}) in fresh
    assert values("proxy_tokens_total", "channel") == {
        "reasoning",
        "final",
        "commentary",
        "tool_call",
    }


# -- the sets match the code that counts them ----------------------------------------------------


def _tree(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text())


def _core_nodes() -> Iterator[ast.AST]:
    """The per-token machine and the stream around it (two modules: stream/machine.py and
    stream/repair.py)."""
    for module in ("proxy/harmony/stream/repair.py", "proxy/harmony/stream/machine.py"):
        yield from ast.walk(_tree(module))


def test_malformed_kinds_cover_what_the_core_counts() -> None:
    counted: set[str] = set()
    for node in _core_nodes():
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "_malformed"
            and isinstance(node.slice, ast.Constant)
        ):
            counted.add(node.slice.value)
        if (  # `self._departed("kind")`: counted where our parse departs from upstream's
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "_departed"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            counted.add(node.args[0].value)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_STATE_ERRORS" for t in node.targets
        ):
            assert isinstance(node.value, ast.Dict)
            counted |= {v.value for v in node.value.values if isinstance(v, ast.Constant)}
    assert len(counted) >= 5
    assert counted == set(MALFORMED_KINDS)


def test_upstream_error_kinds_cover_every_code() -> None:
    """`FrameError(code, …)` and `UpstreamError(…, code=…)` codes of the upstream clients and
    the repaired route, as `proxy_upstream_errors_total` counts them."""
    codes: set[str] = set()
    for path in (
        "proxy/upstream/client.py",
        "proxy/upstream/completions.py",
        "proxy/upstream/frames.py",
    ):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            if node.func.id == "FrameError" and isinstance(node.args[0], ast.Constant):
                codes.add(node.args[0].value)
            if node.func.id == "UpstreamError":
                codes |= {
                    k.value.value
                    for k in node.keywords
                    if k.arg == "code" and isinstance(k.value, ast.Constant)
                }
    codes |= {"upstream_incomplete"}  # the repaired route's own (`Exchange._fail`)
    kinds = {"timeout" if code == "upstream_timeout" else code for code in codes}
    assert kinds == set(UPSTREAM_ERROR_KINDS)


def test_item_event_types_cover_what_the_core_emits() -> None:
    emitted = {
        node.value
        for node in ast.walk(_tree("proxy/harmony/stream/events.py"))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"response\.[a-z_]+\.[a-z_]+", node.value)
    }
    stages = {"in_progress", "completed"}  # web_search_event's stages (items.py)
    emitted |= {f"response.web_search_call.{stage}" for stage in stages}
    assert emitted == set(ITEM_EVENT_TYPES)
