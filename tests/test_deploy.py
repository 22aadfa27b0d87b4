"""The deployment files agree with the code and with each other.

Schema validation (hadolint, kubernetes-validate, check-jsonschema, promtool) runs in
scripts/check-deploy; these tests check what a schema cannot: the image bakes the vocab the code
expects, probes and ports and settings line up, the shutdown timings nest, the compose variants
agree, every dashboard and rule expression parses, and every metric they use is one the proxy
exports. A real Prometheus evaluates them in test_prometheus_e2e.py.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai_harmony import HarmonyEncoding
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy import vocab
from proxy.config.settings import Settings
from proxy.config.sources import FIELDS, load_settings
from proxy.metrics.serving import Metrics
from proxy.server.app import create_app
from proxy.server.processes import runner as server
from proxy.server.processes.cpus import usable_cpus
from proxy.simulator import SimulatorConfig, create_simulator_app
from proxy.tracing import TraceConfig
from tests.deploy_support import (
    DASHBOARD,
    DEPLOY,
    EXPECTED_STATUSES,
    PROMETHEUS_CONFIG,
    ROOT,
    ROWS_WITH_DATA,
    RULES,
    dashboard_panels,
    dashboard_queries,
    exported_names,
    load_dashboard,
    load_rules,
    metric_names,
    rule_queries,
    send_traffic,
    substitute,
    variable_queries,
)
from tests.live import LiveServer, wait_for

KUSTOMIZE_DIRS = ("base", "overlays/simulator")
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.simulator.yaml")
UPSTREAM_PORT = 8000

# -- Dockerfile --------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_dockerfile_is_multi_stage_slim_python_311_non_root() -> None:
    steps = _instructions()
    stages = [rest for word, rest in steps if word == "FROM"]
    assert len(stages) >= 2
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", args["PYTHON_IMAGE"])
    runtime = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    users = [rest for word, rest in runtime if word == "USER"]
    assert users, "the runtime stage sets no USER"
    assert users[-1].split(":")[0].isdigit()
    assert int(users[-1].split(":")[0]) >= 1000


def test_dockerfile_installs_the_pinned_set_and_bakes_the_vocab() -> None:
    steps = _instructions()
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert re.search(r"pip install [^&]*-c constraints\.txt \.", runs)
    assert "python -m proxy vocab" in runs
    assert "sha256sum --check" in runs
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    assert args["VOCAB_SHA256"] == vocab.VOCAB_SHA256
    env = " ".join(rest for word, rest in steps if word == "ENV")
    vocab_dir = re.search(r"PROXY_VOCAB_DIR=(\S+)", env)
    assert vocab_dir is not None
    assert f"TIKTOKEN_ENCODINGS_BASE={vocab_dir[1]}" in env
    assert f"{vocab_dir[1]}/{vocab.VOCAB_FILE}" in runs  # the file the checksum covers
    assert any(word == "COPY" and f"--from=build {vocab_dir[1]}" in rest for word, rest in steps)


def test_dockerfile_entrypoint_healthcheck_and_context() -> None:
    steps = dict(_instructions())
    assert steps["ENTRYPOINT"] == '["responses-repair-proxy"]'
    assert steps["CMD"] == '["serve"]'
    healthcheck = steps["HEALTHCHECK"]
    assert 'CMD ["python", "-c",' in healthcheck
    assert "/healthz" in healthcheck
    assert "curl" not in healthcheck
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignore = [line for line in lines if line and not line.startswith("#")]
    assert ignore[0] == "*", "an allow-list .dockerignore"
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in shlex.split(rest)[:-1]:
                assert f"!{source.rstrip('/')}" in ignore or f"!{source}/" in ignore, source


# -- Kubernetes --------------------------------------------------------------------------------


def _kustomize(directory: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: needed for `kubectl kustomize` (see deploy/README)")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "kubernetes" / directory)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@pytest.fixture(scope="module", params=KUSTOMIZE_DIRS)
def manifests(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in _kustomize(request.param)}


def _one(manifests: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for (k, _), doc in manifests.items() if k == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def _containers(manifests: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    return {container["name"]: container for container in pod["containers"]}


def _upstream(containers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    others = [c for name, c in containers.items() if name != "proxy"]
    assert len(others) == 1, "one upstream container next to the proxy"
    return others[0]


def _port(container: dict[str, Any], name: str) -> int:
    ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    port: int = ports[name]
    return port


def _proxy_env(manifests: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    proxy = _containers(manifests)["proxy"]
    env: dict[str, str] = {}
    for source in proxy.get("envFrom", []):
        env.update(manifests[("ConfigMap", source["configMapRef"]["name"])]["data"])
    env.update({item["name"]: item["value"] for item in proxy.get("env", []) if "value" in item})
    return env


def test_kubernetes_pod_is_trtllm_serve_with_the_proxy_as_sidecar(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    containers = _containers(manifests)
    proxy, upstream = containers["proxy"], _upstream(containers)
    assert _port(proxy, "http") == 8080
    assert _port(upstream, "trtllm") == UPSTREAM_PORT
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for container in containers.values():
        resources = container["resources"]
        assert resources["requests"]["cpu"]
        assert resources["requests"]["memory"]
        assert resources["limits"]["memory"], container["name"]
    assert proxy["securityContext"]["runAsNonRoot"] is True
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True


def test_kubernetes_service_exposes_only_the_proxy(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    service = _one(manifests, "Service")
    pod = _one(manifests, "Deployment")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]
    policy = _one(manifests, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    allowed = [port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]]
    assert allowed == ["http"]


def test_kubernetes_settings_are_valid_and_point_at_the_sidecar(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    env = _proxy_env(manifests)
    known = {field.env for field in FIELDS}
    assert set(env) <= known, f"unknown settings {set(env) - known}"
    settings = load_settings(env)  # every value parses
    assert settings.upstream_url == f"http://127.0.0.1:{UPSTREAM_PORT}"
    assert settings.port == _port(_containers(manifests)["proxy"], "http")
    assert settings.metrics_port is None  # the PodMonitor scrapes the main port


def test_kubernetes_shutdown_outlasts_the_drain(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    containers = _containers(manifests)
    proxy, upstream = containers["proxy"], _upstream(containers)
    drain = load_settings(_proxy_env(manifests)).drain_timeout
    sleep_command = proxy["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep_command[0] == "sleep"
    pre_stop = float(sleep_command[1])
    # SIGTERM after the preStop sleep, then up to drain_timeout, then the exit (the drain).
    proxy_gone = pre_stop + drain + server.EXIT_MARGIN
    assert pod["terminationGracePeriodSeconds"] > proxy_gone
    liveness = proxy["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > proxy_gone
    # The upstream's preStop waits for the proxy port to close, for at most N seconds.
    wait = " ".join(upstream["lifecycle"]["preStop"]["exec"]["command"])
    limit = re.search(r"seq (\d+)\).*/dev/tcp/127\.0\.0\.1/(\d+)", wait)
    assert limit is not None, wait
    assert int(limit[2]) == _port(proxy, "http")
    assert proxy_gone <= int(limit[1]) < pod["terminationGracePeriodSeconds"]


def test_kubernetes_workers_follow_the_proxy_cpu_request(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """One worker process per requested CPU, through the downward API (no CPU limit
    to read: it would throttle)."""
    proxy = _containers(manifests)["proxy"]
    [workers] = [item for item in proxy.get("env", []) if item["name"] == "PROXY_WORKERS"]
    assert workers["valueFrom"]["resourceFieldRef"] == {
        "containerName": "proxy",
        "resource": "requests.cpu",
        "divisor": "1",
    }
    assert "cpu" not in proxy["resources"].get("limits", {})
    assert "PROXY_WORKERS" not in _proxy_env(manifests)  # the ConfigMap does not override it
    # What the kubelet will set: the request in whole CPUs, rounded up.
    request = str(proxy["resources"]["requests"]["cpu"])
    cpus = math.ceil(int(request[:-1]) / 1000 if request.endswith("m") else float(request))
    settings = load_settings({**_proxy_env(manifests), "PROXY_WORKERS": str(cpus)})
    assert settings.workers == cpus
    assert settings.workers >= 1


def test_kubernetes_monitoring_scrapes_the_proxy_and_carries_the_rules(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    labels = _one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    monitor = _one(manifests, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/metrics"
    rule = _one(manifests, "PrometheusRule")
    assert rule["spec"] == load_rules()
    render = subprocess.run(
        [sys.executable, str(ROOT / "scripts/render-prometheusrule"), "--check"],
        capture_output=True,
        text=True,
    )
    assert render.returncode == 0, render.stdout


def test_kubernetes_base_runs_trtllm_serve_on_a_gpu_with_stream_interval_20_and_xgrammar() -> None:
    manifests = {(d["kind"], d["metadata"]["name"]): d for d in _kustomize("base")}
    upstream = _upstream(_containers(manifests))
    assert upstream["name"] == "trtllm-serve"
    assert upstream["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    assert upstream["resources"]["limits"]["nvidia.com/gpu"] == "1"
    options = next(a for a in upstream["args"] if a.startswith("--extra_llm_api_options="))
    path = options.split("=", 1)[1]
    mount = next(m for m in upstream["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config = manifests[("ConfigMap", volume["configMap"]["name"])]["data"]
    trtllm = yaml.safe_load(config[path.rsplit("/", 1)[1]])
    assert trtllm["stream_interval"] == 20
    # tool_choice and text.format are enforced only with a guided-decoding backend
    assert trtllm["guided_decoding_backend"] == "xgrammar"
    compose_copy = DEPLOY / "compose/trtllm/gpt-oss-120b.yaml"
    assert compose_copy.read_text() == (DEPLOY / "kubernetes/base/gpt-oss-120b.yaml").read_text()


def test_kubernetes_simulator_overlay_needs_no_gpu() -> None:
    docs = _kustomize("overlays/simulator")
    manifests = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(docs)
    assert not [kind for kind, _ in manifests if kind == "PersistentVolumeClaim"]
    containers = _containers(manifests)
    upstream = _upstream(containers)
    assert upstream["image"] == containers["proxy"]["image"]
    assert upstream["args"][0] == "simulate"
    assert f"--port={UPSTREAM_PORT}" in upstream["args"]
    assert "--host=0.0.0.0" in upstream["args"]  # the kubelet probes it on the pod IP
    assert "--stream-interval=20" in upstream["args"]
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert "tolerations" not in pod
    mounted = {m["name"] for c in containers.values() for m in c.get("volumeMounts", [])}
    assert {volume["name"] for volume in pod["volumes"]} == mounted


def test_kubernetes_proxy_keeps_its_store_on_a_data_volume(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    settings = load_settings(_proxy_env(manifests))
    assert settings.store_url == "embedded"
    proxy = _containers(manifests)["proxy"]
    mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    volume_name = mounts[settings.data_dir]
    pod = _one(manifests, "Deployment")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == volume_name]
    size = volume["emptyDir"]["sizeLimit"]
    assert size.endswith("Gi")
    assert int(size[:-2]) * 1024**3 > settings.store_max_bytes


def _rendered_env(directory: str) -> dict[str, str]:
    """The proxy container's environment in the kustomization `directory`."""
    return _proxy_env({(d["kind"], d["metadata"]["name"]): d for d in _kustomize(directory)})


def test_kubernetes_tracing_overlay_points_the_proxy_at_a_collector() -> None:
    env = _rendered_env("overlays/tracing")
    endpoint = TraceConfig().resolved_endpoint(env)
    assert endpoint == "http://otel-collector.observability.svc:4318/v1/traces"
    assert TraceConfig().resolved_protocol(env) == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "responses-repair-proxy"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert 0 < float(env["OTEL_TRACES_SAMPLER_ARG"]) <= 1
    assert load_settings(env).upstream_url  # the base's settings are kept
    # the base itself traces nothing
    assert TraceConfig().resolved_endpoint(_rendered_env("base")) is None


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_tracing_profile_feeds_jaeger_and_grafana(name: str) -> None:
    services = _compose(name)["services"]
    collector, jaeger, proxy = services["otel-collector"], services["jaeger"], services["proxy"]
    assert collector["profiles"] == jaeger["profiles"] == ["tracing"]
    # off by default; the documented endpoint reaches the collector's OTLP/HTTP receiver
    assert TraceConfig().resolved_endpoint(_interpolated(proxy["environment"])) is None
    documented = "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318"
    assert documented in (DEPLOY / "compose" / name).read_text()
    mounts = dict(volume.split(":")[:2] for volume in collector["volumes"])
    config = yaml.safe_load((DEPLOY / "compose" / "../otel/collector.yaml").read_text())
    assert mounts["../otel/collector.yaml"] in " ".join(collector["command"])
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert "4318" in collector["expose"]
    [exporter] = config["service"]["pipelines"]["traces"]["exporters"]
    assert config["exporters"][exporter]["endpoint"] == "jaeger:4317"
    assert "4317" in jaeger["expose"]
    # exemplars: stored by Prometheus, and linked by Grafana to the trace datasource
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    datasources = DEPLOY / "grafana/provisioning/datasources"
    [traces] = yaml.safe_load((datasources / "jaeger.yaml").read_text())["datasources"]
    assert traces["url"] == "http://jaeger:16686"
    [metrics] = yaml.safe_load((datasources / "prometheus.yaml").read_text())["datasources"]
    [link] = metrics["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": traces["uid"]}


def test_dashboard_links_slow_genai_buckets_to_their_traces() -> None:
    exemplars = [
        target["expr"]
        for _, panel in dashboard_panels()
        for target in panel["targets"]
        if target.get("exemplar")
    ]
    assert any("gen_ai_server_request_duration_seconds_bucket" in e for e in exemplars)
    assert any("gen_ai_server_time_to_first_token_seconds_bucket" in e for e in exemplars)


def test_kubernetes_replicas_overlay_shares_one_redis() -> None:
    docs = _kustomize("overlays/replicas")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    deployments = {d["metadata"]["name"]: d for d in by_kind["Deployment"]}
    assert deployments["gpt-oss"]["spec"]["replicas"] == 2
    redis = deployments["gpt-oss-redis"]
    assert redis["spec"]["replicas"] == 1
    manifests = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    proxy = next(
        c
        for c in deployments["gpt-oss"]["spec"]["template"]["spec"]["containers"]
        if c["name"] == "proxy"
    )
    env: dict[str, str] = {}
    for source in proxy["envFrom"]:
        env.update(manifests[("ConfigMap", source["configMapRef"]["name"])]["data"])
    settings = load_settings(env)
    services = {d["metadata"]["name"]: d for d in by_kind["Service"]}
    url = settings.store_url
    assert url == "redis://gpt-oss-redis:6379/0"
    [port] = services["gpt-oss-redis"]["spec"]["ports"]
    assert port["port"] == 6379
    redis_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert services["gpt-oss-redis"]["spec"]["selector"].items() <= redis_labels.items()
    # the clients' Service reaches the proxies only, never Redis
    assert not services["gpt-oss"]["spec"]["selector"].items() <= redis_labels.items()
    policies = {d["metadata"]["name"]: d for d in by_kind["NetworkPolicy"]}
    [rule] = policies["gpt-oss-redis"]["spec"]["ingress"]
    proxy_labels = deployments["gpt-oss"]["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= proxy_labels.items()
    [container] = redis["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["limits"]["memory"]


# -- compose -----------------------------------------------------------------------------------


def _compose(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose" / name).read_text())
    return data


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_stack(name: str) -> None:
    compose = _compose(name)
    services = compose["services"]
    assert set(services) == {
        "trtllm-serve",
        "proxy",
        "prometheus",
        "grafana",
        "redis",
        "otel-collector",
        "jaeger",
        "mcp-demo",
    }
    proxy = services["proxy"]
    settings = load_settings(_interpolated(proxy["environment"]))
    assert settings.upstream_url == f"http://trtllm-serve:{UPSTREAM_PORT}"
    assert proxy["build"]["context"] == "../.."
    assert proxy["build"]["dockerfile"] == "Dockerfile"
    assert (DEPLOY / "compose" / proxy["build"]["context"] / "Dockerfile").is_file()
    grace = float(proxy["stop_grace_period"].rstrip("s"))
    assert grace > settings.drain_timeout + server.EXIT_MARGIN
    assert "/readyz" in " ".join(proxy["healthcheck"]["test"])
    assert "ports" not in services["trtllm-serve"], "clients go through the proxy"
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / "compose" / source).exists(), f"{name}: {source}"
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == [f"proxy:{settings.port}"]


def _interpolated(env: dict[str, str]) -> dict[str, str]:
    """Compose's `${NAME:-default}` as compose resolves it with NAME unset."""
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_sizes_workers_by_the_cpu_limit(name: str, tmp_path: Path) -> None:
    """`PROXY_WORKERS=auto` under the service's `cpus` limit, which docker sets as
    the container's cgroup quota: auto starts that many workers, whatever the host has."""
    proxy = _compose(name)["services"]["proxy"]
    assert load_settings(_interpolated(proxy["environment"])).workers == 0  # auto
    limit = float(proxy["cpus"])
    assert limit >= 1
    (tmp_path / "cpu.max").write_text(f"{int(limit * 100_000)} 100000\n")
    (tmp_path / "self").write_text("0::/\n")
    assert usable_cpus(affinity=64, root=tmp_path, self_cgroup=tmp_path / "self") == int(limit)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_mcp_profile_is_off_and_allowed_only_when_named(name: str) -> None:
    services = _compose(name)["services"]
    proxy, demo = services["proxy"], services["mcp-demo"]
    settings = load_settings(_interpolated(proxy["environment"]))
    assert settings.mcp_allowed_servers == ()
    assert not settings.mcp_allow_private_addresses
    assert demo["profiles"] == ["mcp"]
    assert "8000" in demo["expose"]
    assert "ports" not in demo, "only the proxy reaches the demo server"
    documented = load_settings(
        {
            "PROXY_MCP_ALLOWED_SERVERS": "http://mcp-demo:8000/mcp",
            "PROXY_MCP_ALLOW_PRIVATE_ADDRESSES": "true",
        }
    )
    assert documented.mcp_allowed_servers == ("http://mcp-demo:8000/mcp",)
    assert (
        "PROXY_MCP_ALLOWED_SERVERS=http://mcp-demo:8000/mcp"
        in (DEPLOY / "compose" / name).read_text()
    )


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_keeps_responses_on_a_volume_or_in_redis(name: str) -> None:
    services = _compose(name)["services"]
    compose = _compose(name)
    proxy, redis = services["proxy"], services["redis"]
    settings = load_settings(_interpolated(proxy["environment"]))
    assert settings.store_url == "embedded"
    mounts = dict(volume.split(":")[:2] for volume in proxy["volumes"])
    assert mounts["proxy-data"] == "/data"
    assert "proxy-data" in compose["volumes"]
    # the Redis the profile brings up is the one the documented URL names
    assert redis["profiles"] == ["redis"]
    assert "6379" in redis["expose"]
    assert "redis://redis:6379/0" in (DEPLOY / "compose" / name).read_text()
    assert load_settings({"PROXY_STORE_URL": "redis://redis:6379/0"}).store_url
    assert dict(volume.split(":")[:2] for volume in redis["volumes"])["redis-data"] == "/data"


def test_compose_gpu_stack_runs_trtllm_serve_with_stream_interval_20_and_xgrammar() -> None:
    upstream = _compose("docker-compose.yaml")["services"]["trtllm-serve"]
    [device] = upstream["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    options = next(a for a in upstream["command"] if a.startswith("--extra_llm_api_options="))
    path = options.split("=", 1)[1]
    [mount] = [v for v in upstream["volumes"] if v.split(":")[1] == path]
    options = yaml.safe_load((DEPLOY / "compose" / mount.split(":")[0]).read_text())
    assert options["stream_interval"] == 20
    assert options["guided_decoding_backend"] == "xgrammar"


def _trtllm_check() -> Any:
    """scripts/check-trtllm-configs as a module (it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader(
        "check_trtllm_configs", str(ROOT / "scripts/check-trtllm-configs")
    )
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_shipped_trtllm_config_loads_xgrammar() -> None:
    """The deploy check (also in scripts/check-deploy) passes on the shipped files…"""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/check-trtllm-configs")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout
    assert "every trtllm-serve loads guided_decoding_backend: xgrammar" in run.stdout


def test_the_trtllm_config_check_fails_without_the_backend() -> None:
    """… and fails on a config without the backend, or another one, or none at all."""
    check = _trtllm_check()
    shipped = yaml.safe_load((DEPLOY / "compose/trtllm/gpt-oss-120b.yaml").read_text())
    assert check.problem(shipped, "shipped") is None
    without = {k: v for k, v in shipped.items() if k != "guided_decoding_backend"}
    assert "guided_decoding_backend is None" in check.problem(without, "x")
    other = {**shipped, "guided_decoding_backend": "outlines"}
    assert "'outlines'" in check.problem(other, "x")
    assert check.options_path(["trtllm-serve", "m", "--config", "/c.yaml"]) == "/c.yaml"
    assert check.options_path(["trtllm-serve", "--extra_llm_api_options=/o.yaml"]) == "/o.yaml"
    assert check.options_path(["trtllm-serve", "m", "--port=8000"]) is None


def test_compose_simulator_variant_differs_only_in_the_upstream() -> None:
    gpu, simulator = (_compose(name)["services"] for name in COMPOSE_FILES)
    for name in ("proxy", "prometheus", "grafana", "redis", "otel-collector", "jaeger"):
        assert gpu[name] == simulator[name], name
    upstream = simulator["trtllm-serve"]
    assert "deploy" not in upstream
    assert upstream["image"] == simulator["proxy"]["image"]
    assert upstream["command"][0] == "simulate"
    assert f"--port={UPSTREAM_PORT}" in upstream["command"]
    assert "--stream-interval=20" in upstream["command"]


def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    grafana = _compose("docker-compose.yaml")["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    provider_file = DEPLOY / "grafana/provisioning/dashboards/responses-repair-proxy.yaml"
    [provider] = yaml.safe_load(provider_file.read_text())["providers"]
    assert mounts["../grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    datasources = DEPLOY / "grafana/provisioning/datasources/prometheus.yaml"
    [source] = yaml.safe_load(datasources.read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    prometheus = _compose("docker-compose.yaml")["services"]["prometheus"]
    assert "../prometheus/rules:/etc/prometheus/rules:ro" in prometheus["volumes"]
    assert (
        "/etc/prometheus/rules/*.yaml"
        in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"]
    )


# -- dashboard and rules -----------------------------------------------------------------------


def test_dashboard_is_provisioning_ready_with_a_datasource_variable() -> None:
    dashboard = load_dashboard()
    assert "__inputs" not in dashboard
    assert dashboard["id"] is None
    assert dashboard["uid"] == "responses-repair-proxy"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    ids = []
    for _, panel in dashboard_panels():
        ids.append(panel["id"])
        assert panel["datasource"] == wanted, panel["title"]
        assert all(target["datasource"] == wanted for target in panel["targets"])
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_dashboard_has_the_panels_the_issue_asks_for() -> None:
    rows: dict[str, list[str]] = {}
    for row, panel in dashboard_panels():
        rows.setdefault(row, []).extend(t["expr"] for t in panel["targets"])
    for row in (*ROWS_WITH_DATA, "Tokens", "Errors and disconnects", "Self-check"):
        assert rows.get(row), f"no row {row!r}"
    latency = " ".join(rows["Latency"])
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}," in latency
    recovery = " ".join(rows["Recovery"])
    for used in (
        "sum by (type) (rate(proxy_recovered_events_total",
        "proxy_recovered_chars_total",
        "proxy_recovered_tokens_total",
        "proxy_repaired_streams_total",
        "proxy_compared_streams_total",
    ):
        assert used in recovery, used
    assert "proxy_upstream_frame_tokens_bucket" in " ".join(rows["Tokens"])
    errors = " ".join(rows["Errors and disconnects"])
    assert "proxy_upstream_errors_total" in errors
    assert "proxy_client_disconnects_total" in errors
    assert "proxy_selfcheck_failures_total" in " ".join(rows["Self-check"])


def test_alert_rules_cover_the_issue() -> None:
    rules = {rule["alert"]: rule for group in load_rules()["groups"] for rule in group["rules"]}
    expected = {
        "ResponsesRepairProxySelfCheckFailed": "proxy_selfcheck_failures_total",
        "ResponsesRepairProxyUpstreamErrors": "proxy_requests_total",
        "ResponsesRepairProxyUpstreamNotCapable": "proxy_upstream_capable",
        "ResponsesRepairProxyNotReady": "proxy_ready",
        "ResponsesRepairProxyLatencyRegression": "proxy_time_to_first_content_seconds_bucket",
        "ResponsesRepairProxyOverheadHigh": "proxy_frame_overhead_seconds_bucket",
        "ResponsesRepairProxyStoreErrors": "proxy_store_errors_total",
        "ResponsesRepairProxyWorkerRestarts": "proxy_worker_restarts_total",
        "ResponsesRepairProxyConstraintsRefused": "proxy_constraint_refusals_total",
    }
    assert set(rules) == set(expected)
    for name, metric in expected.items():
        rule = rules[name]
        assert metric in metric_names(rule["expr"]), name
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]


@pytest.mark.parametrize(
    "query", dashboard_queries() + rule_queries(), ids=lambda query: query.where
)
def test_promql_parses(query: Any) -> None:
    assert metric_names(substitute(query.expr)), "selects no metric"


# -- every metric used is one the proxy exports ----------------------------------------------


@pytest.fixture(scope="module")
def exposition(encoding: HarmonyEncoding) -> Iterator[str]:
    """/metrics of a proxy (real sockets) in front of the simulator, after `send_traffic`."""
    simulator_config = SimulatorConfig(first_token_seconds=0.0, token_seconds=0.0002)
    with LiveServer(create_simulator_app(simulator_config, encoding)) as simulator:
        settings = Settings(upstream_url=simulator.url, metrics_models=("openai/gpt-oss-120b",))
        app = create_app(settings, encoding, registry=CollectorRegistry())
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            assert wait_for(app.state.renderer.ready, 30)  # its render worker is up
            assert send_traffic(proxy.url, encoding) == EXPECTED_STATUSES
            assert wait_for(lambda: app.state.proxy.in_flight == 0, 5)
            yield httpx.get(proxy.url + "/metrics", timeout=5).text


def _used_names() -> dict[str, str]:
    used: dict[str, str] = {}
    for query in dashboard_queries() + rule_queries():
        for name in metric_names(substitute(query.expr)):
            used.setdefault(name, query.where)
    for variable, selector, _label in variable_queries():
        for name in metric_names(substitute(selector)):
            used.setdefault(name, f"variable {variable}")
    return used


def test_every_metric_used_is_exported_and_has_samples(exposition: str) -> None:
    exported = exported_names(exposition)
    sampled = {s.name for f in text_string_to_metric_families(exposition) for s in f.samples}
    used = _used_names()
    assert not {n: w for n, w in used.items() if n not in exported}, "not exported"
    assert not {n: w for n, w in used.items() if n not in sampled}, "no sample after traffic"


def test_metric_names_follow_the_house_style() -> None:
    registry = CollectorRegistry()
    Metrics(registry, models=("openai/gpt-oss-120b",), harmony_version="0.0.8")
    for family in registry.collect():
        assert re.fullmatch(r"proxy_[a-z_]+", family.name), family.name
        if family.type == "counter":
            continue  # exposed with _total
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_tokens")), family.name


def test_deploy_readme_documents_every_metric() -> None:
    readme = (DEPLOY / "README.md").read_text()
    registry = CollectorRegistry()
    Metrics(registry, harmony_version="0.0.8")
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}" in readme, f"deploy/README.md does not document {name}"
    for rule in rule_queries():
        assert rule.where.removeprefix("alert ") in readme, rule.where
    assert str(RULES.relative_to(DEPLOY)) in readme
