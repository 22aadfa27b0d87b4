"""End to end with a real Prometheus: `responses-repair-proxy serve` with its built-in
simulator in a subprocess, Debian's `prometheus` scraping it every second with the shipped
scrape config and alert rules, two rounds of traffic, then every dashboard query and every alert
expression evaluated through Prometheus's HTTP API. The Traffic, Latency and Recovery rows must
return data; Prometheus must evaluate every rule without error.

`prometheus` missing is a failure, not a skip: CI installs it (`apt-get install -y prometheus`).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai_harmony import HarmonyEncoding
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy_support import (
    EXPECTED_STATUSES,
    PROMETHEUS_CONFIG,
    ROWS_WITH_DATA,
    RULES,
    Query,
    dashboard_queries,
    rule_queries,
    send_traffic,
    substitute,
    variable_queries,
)
from tests.live import free_port, wait_for

JOB = "responses-repair-proxy"  # the job of deploy/prometheus/prometheus.yml
#: What `$__rate_interval` stands for here: it spans both rounds of traffic.
RATE_INTERVAL = "30s"


@dataclass
class Stack:
    proxy: str
    prometheus: str
    proxy_target: str
    logs: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert answer.status_code == 200, (expr, body)
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def api(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.prometheus}/api/v1/{path}", params=params, timeout=10)
        answer.raise_for_status()
        return answer.json()["data"]


def _prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "the `prometheus` server is not installed; this end-to-end test needs it: "
            "`apt-get install -y prometheus` (Debian), as .ci/run does"
        )
    return binary


def _proxy_command() -> list[str]:
    script = Path(sys.executable).with_name("responses-repair-proxy")
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-m", "proxy", "serve"]


def _prometheus_config(target: str) -> dict[str, Any]:
    """The shipped config, with this test's target, a 1 s scrape and the rule file's path."""
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    job["static_configs"] = [{"targets": [target]}]
    config["scrape_configs"] = [job]
    return config


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_binary = _prometheus_binary()
    workdir = tmp_path_factory.mktemp("prometheus-e2e")
    proxy_port, prometheus_port = free_port(), free_port()
    env = {
        **os.environ,
        "PROXY_HOST": "127.0.0.1",
        "PROXY_PORT": str(proxy_port),
        "PROXY_SIMULATOR_TOKEN_SECONDS": "0.001",
        "PROXY_METRICS_MODELS": "openai/gpt-oss-120b",
        "PROXY_LOG_LEVEL": "warning",
    }
    env.pop("PROXY_UPSTREAM_URL", None)  # the built-in simulator
    env.pop("PROXY_CONFIG", None)
    proxy_log = workdir / "proxy.log"
    prometheus_log = workdir / "prometheus.log"
    target = f"127.0.0.1:{proxy_port}"
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(_prometheus_config(target)))
    with proxy_log.open("wb") as proxy_out, prometheus_log.open("wb") as prometheus_out:
        proxy = subprocess.Popen(
            _proxy_command(), env=env, stdout=proxy_out, stderr=subprocess.STDOUT
        )
        prometheus = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                "--log.level=warn",
            ],
            stdout=prometheus_out,
            stderr=subprocess.STDOUT,
        )
        try:
            stack = Stack(
                proxy=f"http://{target}",
                prometheus=f"http://127.0.0.1:{prometheus_port}",
                proxy_target=target,
                logs=workdir,
            )
            if not wait_for(lambda: _ok(f"{stack.proxy}/readyz"), 30, 0.1):
                pytest.fail(f"the proxy did not get ready:\n{_tail(proxy_log)}")
            if not wait_for(lambda: _ok(f"{stack.prometheus}/-/ready"), 30, 0.1):
                pytest.fail(f"prometheus did not start:\n{_tail(prometheus_log)}")
            yield stack
        finally:
            _stop(prometheus)
            _stop(proxy)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _requests_total(stack: Stack) -> float:
    text = httpx.get(f"{stack.proxy}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "proxy_requests_total"
    )


def _scraped(stack: Stack, total: float) -> bool:
    result = stack.query(f'sum(proxy_requests_total{{job="{JOB}"}})')
    return bool(result) and float(result[0]["value"][1]) == total


@pytest.fixture(scope="module")
def served(stack: Stack, encoding: HarmonyEncoding) -> Stack:
    """Two rounds of traffic a few scrapes apart (so that rates see increases), then wait until
    Prometheus has scraped the proxy's final counts."""
    assert wait_for(lambda: bool(stack.query("proxy_build_info")), 20, 0.2), _tail(
        stack.logs / "prometheus.log"
    )
    for _ in range(2):
        assert send_traffic(stack.proxy, encoding) == EXPECTED_STATUSES
        time.sleep(2.5)
    total = _requests_total(stack)
    assert wait_for(lambda: _scraped(stack, total), 10, 0.2), "prometheus did not scrape"
    return stack


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(item["value"][1]) for item in result]


def _query_id(query: Query) -> str:
    return query.where


@pytest.mark.parametrize(
    "query",
    [query for query in dashboard_queries() if query.row in ROWS_WITH_DATA],
    ids=_query_id,
)
def test_traffic_latency_and_recovery_panels_return_data(served: Stack, query: Query) -> None:
    values = _values(served.query(substitute(query.expr, RATE_INTERVAL)))
    assert values, f"no data: {query.expr}"
    assert any(math.isfinite(value) for value in values), f"only NaN/Inf: {query.expr}"


@pytest.mark.parametrize(
    "query",
    [query for query in dashboard_queries() if query.row not in ROWS_WITH_DATA],
    ids=_query_id,
)
def test_other_dashboard_queries_evaluate(served: Stack, query: Query) -> None:
    served.query(substitute(query.expr, RATE_INTERVAL))  # status success, whatever the data


def test_dashboard_variables_list_the_proxy(served: Stack) -> None:
    values: dict[str, set[str]] = {}
    for variable, selector, label in variable_queries():
        series = served.api("series", **{"match[]": substitute(selector)})
        values[variable] = {item[label] for item in series}
    assert values == {"job": {JOB}, "instance": {served.proxy_target}}


@pytest.mark.parametrize("query", rule_queries(), ids=_query_id)
def test_alert_expressions_evaluate(served: Stack, query: Query) -> None:
    served.query(query.expr)


def test_prometheus_evaluates_every_rule_and_alerts_as_expected(served: Stack) -> None:
    def rules() -> list[dict[str, Any]]:
        groups = served.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    names = {query.where.removeprefix("alert ") for query in rule_queries()}
    assert {rule["name"] for rule in rules()} == names

    def upstream_errors_pending() -> bool:
        return any(
            rule["name"] == "ResponsesRepairProxyUpstreamErrors" and rule["state"] == "pending"
            for rule in rules()
        )

    # Two of the nine repaired requests of each round fail upstream (an HTTP 500, a cut
    # stream): above the 5 % threshold, so that alert waits out its `for`.
    assert wait_for(upstream_errors_pending, 10, 0.2), rules()
    for rule in rules():
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert rule["state"] != "firing", rule  # a healthy proxy: self-check 0, ready, capable
