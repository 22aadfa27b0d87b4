"""Body memory: RSS of the proxy and its render workers while many clients
send large bodies at once.

    .venv/bin/python bench/body_memory.py [--clients 100] [--mib 15]

Runs the proxy twice as a `python -m proxy serve` process against the simulator (this process):
*before* with `--body-budget-bytes 0 --render-workers 0` (no global budget, renders inline: the
proxy before the body budget) and *after* with the defaults (`body_budget_bytes` 64 MiB,
`body_budget_wait` 5 s, one render worker). `--clients` clients each send one `/v1/responses`
body of `--mib` MiB at the same moment; a sampler reads the RSS of the proxy and of each of its
child processes (the render workers) from /proc every 20 ms. The body (`--kind`):

- `invalid` (default): a long `input` and `"temperature": "hot"` — read, parsed, sent to a
  worker and refused there (400): the memory of reading bodies, not of serving them;
- `garbage`: not JSON (400 at the parse).

Target: the proxy and its workers together under 512 MB (the container limit is 1 GiB); every
client gets an answer (a 400 for its body, or a 503 + Retry-After when the budget stayed full
for `body_budget_wait`), never a dropped connection.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from proxy.simulator import SimulatorConfig, start_simulator


def make_body(kind: str, size: int) -> bytes:
    if kind == "garbage":
        return b"{" + b"x" * (size - 1)
    words = "the quick brown fox jumps over the lazy dog; "
    text = (words * (size // len(words) + 1))[: size - 120]
    return orjson.dumps({"model": harness.MODEL, "input": text, "temperature": "hot"})


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def sample(pid: int, peaks: dict[str, float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        proxy = rss_kb(pid) / 1024
        workers = sum(rss_kb(child) for child in children(pid)) / 1024
        peaks["proxy"] = max(peaks["proxy"], proxy)
        peaks["workers"] = max(peaks["workers"], workers)
        peaks["total"] = max(peaks["total"], proxy + workers)
        await asyncio.sleep(0.02)


async def client(port: int, payload: bytes) -> str:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect {type(exc).__name__}"
    try:
        writer.write(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(payload)
        )
        writer.write(payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        body = await reader.read()
        code = ""
        if body.startswith(b"{"):
            code = (orjson.loads(body).get("error") or {}).get("code") or ""
        return f"{status} {code}".strip()
    except (OSError, asyncio.IncompleteReadError) as exc:
        return f"dropped ({type(exc).__name__})"
    finally:
        writer.close()


async def one_run(args: argparse.Namespace, label: str, **settings: str) -> dict[str, Any]:
    encoding = harness.encoding()
    sim = await start_simulator(SimulatorConfig(first_token_seconds=0.0), encoding)
    proxy = await harness.start_proxy(sim.url, core=None, **settings)
    payload = make_body(args.kind, int(args.mib * 2**20))
    peaks = {"proxy": 0.0, "workers": 0.0, "total": 0.0}
    stop = asyncio.Event()
    try:
        await asyncio.sleep(1.0)  # the render worker is up (readyz said so) and settled
        idle = {
            "proxy": rss_kb(proxy.pid) / 1024,
            "workers": sum(rss_kb(c) for c in children(proxy.pid)) / 1024,
        }
        sampler = asyncio.ensure_future(sample(proxy.pid, peaks, stop))
        started = time.monotonic()
        answers = await asyncio.gather(*(client(proxy.port, payload) for _ in range(args.clients)))
        took = time.monotonic() - started
        stop.set()
        await sampler
        after = rss_kb(proxy.pid) / 1024
        print(f"  {label}: {collections.Counter(answers)} in {took:.1f} s", file=sys.stderr)
    finally:
        proxy.stop()
        await sim.stop()
    return {"idle": idle, "peaks": peaks, "answers": answers, "took": took, "after": after}


async def run(args: argparse.Namespace) -> None:
    harness.raise_fd_limit()
    before = await one_run(args, "before", body_budget_bytes="0", render_workers="0")
    after = await one_run(args, "after")
    rows: list[list[Any]] = [
        ["RSS idle, proxy / workers MB", *(_pair(r["idle"]) for r in (before, after))],
        ["peak RSS proxy MB", *(f"{r['peaks']['proxy']:.0f}" for r in (before, after))],
        ["peak RSS workers MB", *(f"{r['peaks']['workers']:.0f}" for r in (before, after))],
        ["peak RSS proxy + workers MB", *(f"{r['peaks']['total']:.0f}" for r in (before, after))],
        ["RSS proxy after MB", *(f"{r['after']:.0f}" for r in (before, after))],
        ["all answered in s", *(f"{r['took']:.1f}" for r in (before, after))],
    ]
    kinds = sorted({a for r in (before, after) for a in r["answers"]})
    for kind in kinds:
        rows.append([f"answers: {kind}", *(r["answers"].count(kind) for r in (before, after))])
    print(harness.machine())
    print(f"{args.clients} clients at once, each one {args.mib:g} MiB body ({args.kind})")
    print(harness.table(["", "before (no budget, inline)", "after (defaults)"], rows))


def _pair(values: dict[str, float]) -> str:
    return f"{values['proxy']:.0f} / {values['workers']:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--mib", type=float, default=15.0)
    parser.add_argument("--kind", choices=("invalid", "garbage"), default="invalid")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
