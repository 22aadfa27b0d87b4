"""`responses-repair-proxy demo`: the same request, straight to trtllm-serve and through the proxy.

No GPU, no configuration: the built-in simulator plays an unpatched trtllm-serve with
`stream_interval` 20 (as every shipped gpt-oss config), the proxy runs in front of it, both on
free loopback ports. The demo reads both streams the way a client does and shows what each
client would have displayed, then the proxy's recovery metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import orjson
import uvicorn
from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.config.settings import Settings
from proxy.harmony.stream.events import TERMINAL_EVENTS
from proxy.server.app import create_app
from proxy.server.processes.runner import QuietServer
from proxy.sse import SSEDecoder

MODEL = "openai/gpt-oss-120b"
QUESTION = "Where is my order #W2378156? It was supposed to arrive this week."


@dataclass
class Seen:
    """What a client reading one Responses stream ends up with."""

    events: int = 0
    items_announced: list[str] = field(default_factory=list)
    items_closed: int = 0
    streamed: dict[str, str] = field(default_factory=lambda: {"reasoning": "", "answer": ""})
    final: dict[str, str] = field(default_factory=lambda: {"reasoning": "", "answer": ""})
    terminal: str | None = None
    empty_item_ids: int = 0

    @property
    def matches_final(self) -> bool:
        return self.streamed == self.final


def read_events(events: Sequence[dict[str, Any]]) -> Seen:
    seen = Seen(events=len(events))
    for event in events:
        kind = event.get("type", "")
        if kind == "response.output_item.added":
            seen.items_announced.append(event["item"]["type"])
            seen.empty_item_ids += not event["item"].get("id")
        elif kind == "response.output_item.done":
            seen.items_closed += 1
        elif kind == "response.reasoning_text.delta":
            seen.streamed["reasoning"] += event["delta"]
        elif kind == "response.output_text.delta":
            seen.streamed["answer"] += event["delta"]
        elif kind in TERMINAL_EVENTS:
            seen.terminal = kind
            for item in event["response"]["output"]:
                texts = "".join(part.get("text", "") for part in item.get("content") or [])
                if item["type"] == "reasoning":
                    seen.final["reasoning"] += texts
                elif item["type"] == "message":
                    seen.final["answer"] += texts
    return seen


async def fetch_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    events: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", url + "/v1/responses", json=body) as answer,
    ):
        answer.raise_for_status()
        async for chunk in answer.aiter_bytes():
            events += [orjson.loads(m.data) for m in decoder.feed(chunk)]
    events += [orjson.loads(m.data) for m in decoder.flush()]
    return events


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def running_proxy(upstream_url: str, encoding: HarmonyEncoding) -> AsyncIterator[Any]:
    port = _free_port()
    settings = Settings(upstream_url=upstream_url, host="127.0.0.1", port=port)
    app = create_app(settings, encoding)
    server = QuietServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    while not app.state.proxy.capability.token_ids:  # the start-up probe
        await asyncio.sleep(0.01)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def compare(encoding: HarmonyEncoding, question: str = QUESTION) -> dict[str, Any]:
    """Run simulator and proxy, send `question` to both, return the comparison."""
    from proxy.simulator.config import SimulatorConfig
    from proxy.simulator.server import start_simulator

    simulator = await start_simulator(
        SimulatorConfig(stream_interval=20, token_seconds=0.002), encoding
    )
    try:
        async with running_proxy(simulator.url, encoding) as (app, proxy_url):
            body = {"model": MODEL, "input": question, "stream": True}
            direct = read_events(await fetch_events(simulator.url, body))
            repaired = read_events(await fetch_events(proxy_url, body))
            metrics = _recovery_metrics(app.state.registry)
    finally:
        await simulator.stop()
    return {
        "question": question,
        "stream_interval": 20,
        "trtllm_serve": _summary(direct),
        "proxy": _summary(repaired),
        "proxy_metrics": metrics,
        "proxy_url_hint": "OpenAI(base_url='http://<proxy-host>:8080/v1', api_key=...)",
    }


def _summary(seen: Seen) -> dict[str, Any]:
    out = asdict(seen)
    out["matches_final"] = seen.matches_final
    return out


def _recovery_metrics(registry: Any) -> dict[str, float]:
    wanted = {
        "proxy_recovered_events_total",
        "proxy_recovered_chars_total",
        "proxy_recovered_tokens_total",
        "proxy_items_unannounced_total",
        "proxy_unpatched_text_differs_total",
    }
    totals: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name in wanted:
                label = ",".join(f"{v}" for v in sample.labels.values())
                key = sample.name + (f"{{{label}}}" if label else "")
                totals[key] = sample.value
    return totals


def _clip(text: str, width: int = 60) -> str:
    text = text.replace("\n", " ")
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def render(result: dict[str, Any]) -> str:
    before, after = result["trtllm_serve"], result["proxy"]
    lines = [
        f"Same request to an unpatched trtllm-serve (simulated, stream_interval "
        f"{result['stream_interval']}) and through responses-repair-proxy:",
        "",
        f"  {'':26}{'trtllm-serve directly':<34}{'through the proxy'}",
    ]

    def row(name: str, left: str, right: str) -> None:
        lines.append(f"  {name:<26}{left:<34}{right}")

    row(
        "items announced",
        ", ".join(before["items_announced"]) or "-",
        ", ".join(after["items_announced"]),
    )
    for channel in ("reasoning", "answer"):
        total = len(after["final"][channel])
        row(
            f"streamed {channel}",
            f"{len(before['streamed'][channel])} of {len(before['final'][channel])} chars",
            f"{len(after['streamed'][channel])} of {total} chars",
        )
    row(
        "stream matches final",
        "yes" if before["matches_final"] else "NO",
        "yes" if after["matches_final"] else "NO",
    )
    row("events", str(before["events"]), str(after["events"]))
    lines += [
        "",
        "  What the client showed as the answer:",
        f"    directly:  {_clip(before['streamed']['answer'])}",
        f"    proxy:     {_clip(after['streamed']['answer'])}",
        "",
        "  Proxy recovery metrics (GET /metrics):",
    ]
    for name, value in result["proxy_metrics"].items():
        if value:
            lines.append(f"    {name} {value:g}")
    lines += [
        "",
        textwrap.dedent("""\
          Point a client at the proxy instead of trtllm-serve, e.g.
            responses-repair-proxy serve --upstream http://<trtllm-serve>:8000
            OpenAI(base_url="http://<proxy-host>:8080/v1", api_key="...")"""),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="responses-repair-proxy demo", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--question", default=QUESTION, help="the user message to send")
    args = parser.parse_args(argv)
    encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    result = asyncio.run(compare(encoding, args.question))
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(result))
    return 0
