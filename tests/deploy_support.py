"""Helpers of the deployment tests: the dashboard's and the alert rules' PromQL, the metric names
they use, and the traffic that makes a proxy in front of the simulator export every metric.

Used by tests/test_deploy.py (static checks, the names against a scraped /metrics) and
tests/test_prometheus_e2e.py (a real Prometheus evaluating every query).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import yaml
from openai_harmony import HarmonyEncoding
from prometheus_client.parser import text_string_to_metric_families

from tests.harmony import MODEL, ids_of

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana/dashboards/responses-repair-proxy.json"
RULES = DEPLOY / "prometheus/rules/responses-repair-proxy.rules.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus/prometheus.yml"

#: Dashboard rows whose every query must return data once the proxy served traffic.
ROWS_WITH_DATA = ("Traffic", "Latency", "Recovery")

#: What the dashboard's variables stand for when evaluated outside Grafana: "All" for the
#: multi-value variables (their `allValue`), a fixed window for `$__rate_interval`.
ALL = ".+"


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard or the rules, and where it comes from."""

    where: str  # "row / panel / refId", or "alert NAME"
    expr: str
    row: str = ""


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every panel with the title of the row it sits under (collapsed rows nest theirs)."""
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            for inner in panel.get("panels", []):
                yield row, inner
        else:
            yield row, panel


def dashboard_panels() -> list[tuple[str, dict[str, Any]]]:
    return list(_panels(load_dashboard()))


def dashboard_queries() -> list[Query]:
    queries = []
    for row, panel in _panels(load_dashboard()):
        for target in panel.get("targets", []):
            where = f"{row} / {panel['title']} / {target['refId']}"
            queries.append(Query(where, target["expr"], row))
    return queries


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, series selector, label) of every `label_values(selector, label)` variable."""
    found = []
    for variable in load_dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(query)
        assert match, f"variable {variable['name']}: not label_values(selector, label): {query}"
        found.append((variable["name"], match["selector"], match["label"]))
    return found


def load_rules() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return data


def rule_queries() -> list[Query]:
    return [
        Query(f"alert {rule.get('alert') or rule.get('record')}", rule["expr"])
        for group in load_rules()["groups"]
        for rule in group["rules"]
    ]


def substitute(expr: str, rate_interval: str = "1m") -> str:
    """The expression as Grafana would send it with "All" selected."""
    for name in ("$job", "$instance", "${job}", "${instance}"):
        expr = expr.replace(name, ALL)
    expr = expr.replace("$__rate_interval", rate_interval)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (parsed, so label values and functions never count)."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def exported_names(exposition: str) -> set[str]:
    """Sample names a /metrics text exports, including those of families that have no sample
    yet (a labelled counter before its first event): counters as `_total`, histograms as
    `_bucket`/`_count`/`_sum`."""
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
        "info": ("_info",),
        "summary": ("", "_count", "_sum", "_created"),
    }
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


# -- traffic -----------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]

#: A final message without its <|end|> before the next one: malformed model output the proxy
#: handles (counted in proxy_malformed_outputs_total).
MALFORMED = (
    "<|channel|>final<|message|>Hello<|start|>assistant<|channel|>final<|message|>Bye<|return|>"
)


def send_traffic(url: str, encoding: HarmonyEncoding) -> dict[str, int]:
    """One round of everything the dashboard shows, through the proxy at `url`: streamed and
    non-streamed answers, a tool call, malformed model output, an upstream HTTP error, a stream
    upstream cuts, a client error, a client that goes away, a pass-through request and the
    health endpoints. Returns the status of each request."""
    statuses: dict[str, int] = {}
    ask = {"model": MODEL, "input": "Where is my order #W2378156?"}
    with httpx.Client(base_url=url, timeout=30) as client:
        statuses["healthz"] = client.get("/healthz").status_code
        statuses["readyz"] = client.get("/readyz").status_code
        statuses["models"] = client.get("/v1/models").status_code  # passed through

        def post(name: str, body: dict[str, Any], **headers: str) -> None:
            answer = client.post("/v1/responses", json=body, headers=headers)
            statuses[name] = answer.status_code

        post("stream", {**ask, "stream": True})
        post("stream_uneven", {**ask, "stream": True}, **{"X-Sim-Uneven": "on"})
        post("non_stream", ask)
        post("tool_call", {**ask, "stream": True, "tools": TOOLS})
        replay = ",".join(map(str, ids_of(encoding, MALFORMED)))
        post("malformed", {**ask, "stream": True}, **{"X-Sim-Replay": replay})
        post("upstream_http_error", {**ask, "stream": True}, **{"X-Sim-Fault": "http:500"})
        post("upstream_cut", {**ask, "stream": True}, **{"X-Sim-Fault": "cut@5"})
        post("client_error", {"model": MODEL, "input": 42})
        with client.stream(
            "POST",
            "/v1/responses",
            json={**ask, "stream": True},
            headers={"X-Sim-Tokens": "4000"},
        ) as answer:
            statuses["client_disconnect"] = answer.status_code
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    break  # go away after the first event
    return statuses


EXPECTED_STATUSES = {
    "healthz": 200,
    "readyz": 200,
    "models": 200,
    "stream": 200,
    "stream_uneven": 200,
    "non_stream": 200,
    "tool_call": 200,
    "malformed": 200,
    "upstream_http_error": 502,
    "upstream_cut": 200,  # the stream started; it ends with response.failed
    "client_error": 400,
    "client_disconnect": 200,
}
