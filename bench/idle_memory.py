"""What each MB of an idle proxy is: PSS per process and per mapping, and a worker's start-up
replayed step by step.

    .venv/bin/python bench/idle_memory.py [--workers 1 2] [--before DIR] [--setting NAME=VALUE]

Part 1, the live process tree: for each `--workers` count, a fresh `python -m proxy serve`
(production settings, the default embedded store) against the simulator (this process), warmed
up with a few streamed requests, then left idle for a second. Every process of its tree (the
process `serve` started, worker processes, render workers) is read from `/proc/<pid>/smaps`:
PSS (proportional set size: a page shared by k processes counts 1/k in each, so the figures add
up to what the tree holds), split by what is mapped — the Python heap and anonymous memory
(Python objects, and the Rust allocations of openai-harmony: its vocab tables), the interpreter,
and each package's native libraries. `--before DIR` runs another checkout's proxy alike.

Part 2, what the anonymous memory is: one fresh interpreter replays what a worker does at
start-up, step by step — the imports `serve` makes, then each heavy package, the Harmony
encoding (vocab tables), the app — reading its RSS and anonymous memory (`RssAnon`) after each
step, with `tracemalloc`'s count of what Python itself allocated, and which of the proxy's
modules the worker had imported that it may not need (the simulator, the demo, Redis).

Part 3, what sharing would save: the same start-up in one interpreter, `gc.freeze()`, then a
child forked from it that renders: the PSS, private and shared memory of both (a render worker,
or a worker, forked after the start-up instead of started with `python -m`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness

#: Part 2's steps: (label, Python run in the child, in order; each after the ones before).
STEPS = (
    ("interpreter alone", ""),
    ("import the server (runner: starlette, uvicorn, httpx, prometheus_client)",
     "import proxy.server.processes.runner"),
    ("import openai_harmony", "import openai_harmony"),
    ("load the Harmony encoding (vocab tables)",
     "from proxy import vocab; enc = vocab.load_encoding(vocab.ensure_vocab(os.environ))"),
    ("encode one prompt (the BPE's caches)",
     "enc.encode('Where is my order #W2378156?', allowed_special='all')"),
    ("create the app (settings, metrics, routes)",
     "from proxy.config import sources; from proxy.server.app import create_app; "
     "settings = sources.load_settings({'PROXY_UPSTREAM_URL': 'http://127.0.0.1:9'}); "
     "app = create_app(settings, enc)"),
    ("import the simulator", "import proxy.simulator"),
    ("import redis", "import redis"),
)  # fmt: skip
#: Modules a worker imports that only other paths need.
OPTIONAL = ("proxy.simulator", "proxy.demo", "redis", "proxy.store.redis_store", "httpx")


def smaps_pss(pid: int) -> dict[str, int]:
    """PSS (KB) of one process by what is mapped (module docstring)."""
    found: dict[str, int] = defaultdict(int)
    name = "anonymous"
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
            name = _kind(head[5] if len(head) > 5 else "")
        elif line.startswith("Pss:"):
            found[name] += int(line.split()[1])
    return dict(found)


def _kind(path: str) -> str:
    if not path or path.startswith(("[heap]", "[anon")):
        return "heap + anonymous"
    if path.startswith("["):
        return "other"
    if "site-packages/" in path:
        return "lib: " + path.split("site-packages/", 1)[1].split("/", 1)[0].split(".")[0]
    if "/python3" in path or "libpython" in path:
        return "interpreter + stdlib"
    if path.endswith(".so") or ".so." in path:
        return "system libraries"
    return "files"


async def live_tree(
    workers: int, root: Path, settings: dict[str, str]
) -> list[tuple[str, int, dict[str, int]]]:
    """(role, pid, PSS by kind) of every process of an idle, warmed-up proxy."""
    from proxy.simulator import SimulatorConfig, start_simulator

    encoding = harness.encoding()
    config = SimulatorConfig(token_seconds=0.0005, first_token_seconds=0.0, stream_interval=20)
    sim = await start_simulator(config, encoding)
    extra = {"workers": str(workers)} if workers > 1 else {}
    proxy = await harness.start_proxy(sim.url, core=None, root=root, **settings, **extra)
    try:
        body = orjson.dumps({"model": harness.MODEL, "input": "Where is my order?", "stream": True})
        payload = harness.request_bytes("/v1/responses", body, {"x-sim-tokens": "100"})
        for _ in range(8 * workers):
            answer = await harness.stream(proxy.port, payload)
            if answer.status != 200:
                raise RuntimeError(f"warm-up answered {answer.status}")
        await asyncio.sleep(1.0)
        tree = []
        for pid in sorted(proxy.tree_pss_kb()):
            tree.append((harness.role_of(pid, proxy.pid), pid, smaps_pss(pid)))
        return tree
    finally:
        proxy.stop()
        await sim.stop()


def _child_script() -> str:
    """Part 2, run in a fresh interpreter: one JSON line per step."""
    steps = json.dumps(STEPS)
    return f"""
import json, os, sys, tracemalloc
tracemalloc.start()
def status():
    found = {{}}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            found[key] = int(value.split()[0])
    return found
for label, code in json.loads({steps!r}):
    exec(code)
    current, _ = tracemalloc.get_traced_memory()
    print(json.dumps({{"step": label, **status(), "python": current // 1024}}), flush=True)
    if label.startswith("create the app"):
        print(json.dumps({{"modules": sorted(sys.modules)}}), flush=True)
"""


#: Part 3, run in a fresh interpreter: what a child forked after the start-up costs.
_FORK = """
import gc, json, os, sys, time
import proxy.server.processes.runner
from proxy import vocab
from proxy.harmony.request.prepare import prepare_request
enc = vocab.load_encoding(vocab.ensure_vocab(os.environ))
body = {"model": "m", "input": "Where is my order?"}
prepare_request(body, enc)
gc.freeze()
def memory(pid):
    found = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        key = line.split(":")[0]
        if key in ("Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"):
            found[key] = int(line.split()[1])
    return found
alone = memory(os.getpid())
child = os.fork()
if child == 0:
    for _ in range(50):
        prepare_request({**body, "input": "Where is my order? " * 20}, enc)
    time.sleep(2)
    os._exit(0)
time.sleep(1.5)
print(json.dumps({"alone": alone, "parent": memory(os.getpid()), "child": memory(child)}))
os.waitpid(child, 0)
"""


def forked(root: Path) -> dict[str, dict[str, int]]:
    """Part 3: PSS and private / shared memory (KB) of a process that imported the server,
    loaded the encoding and rendered once, alone, then with a child forked from it that renders
    (what a render worker or a worker forked after the start-up would cost)."""
    result = subprocess.run(
        [sys.executable, "-c", _FORK], cwd=root, capture_output=True, text=True, timeout=120
    )
    if result.returncode:
        raise RuntimeError(result.stderr[-2000:])
    found: dict[str, dict[str, int]] = json.loads(result.stdout)
    return found


def replay_steps(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _child_script()],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    steps, modules = [], []
    for line in result.stdout.splitlines():
        row = json.loads(line)
        if "modules" in row:
            modules = row["modules"]
        else:
            steps.append(row)
    return steps, modules


def print_tree(label: str, tree: list[tuple[str, int, dict[str, int]]]) -> None:
    kinds = sorted({kind for _, _, found in tree for kind in found})
    kinds.sort(key=lambda kind: -sum(found.get(kind, 0) for _, _, found in tree))
    shown = kinds[:7]
    rows = []
    for role, pid, found in tree:
        rest = sum(v for k, v in found.items() if k not in shown)
        cells = [f"{role} ({pid})", f"{sum(found.values()) / 1024:.1f}"]
        cells += [f"{found.get(kind, 0) / 1024:.1f}" for kind in shown]
        rows.append([*cells, f"{rest / 1024:.1f}"])
    total = [sum(found.values()) for _, _, found in tree]
    rows.append(["all", f"{sum(total) / 1024:.1f}", *["" for _ in shown], ""])
    print(f"## {label}: PSS MB by process and by what is mapped")
    print(harness.table(["process", "PSS MB", *shown, "the rest"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--before", type=Path, help="another checkout's proxy, measured alike")
    parser.add_argument(
        "--setting", type=harness.settings_arg, action="append", default=[], metavar="NAME=VALUE"
    )
    args = parser.parse_args()
    harness.raise_fd_limit()
    print(f"# bench/idle_memory.py — {harness.machine()}")
    roots = [("this checkout", harness.ROOT)]
    if args.before:
        roots.append((f"before ({args.before})", args.before.resolve()))
    for name, root in roots:
        for workers in args.workers:
            tree = asyncio.run(live_tree(workers, root, dict(args.setting)))
            print()
            print_tree(f"{name}, workers = {workers}", tree)
            per_worker = [
                sum(found.values())
                for role, _, found in tree
                if role in ("worker", "render worker") or (workers == 1 and role == "serve")
            ]
            print(
                f"idle PSS per worker, all its processes: {sum(per_worker) / workers / 1024:.1f} "
                "MB (the supervisor left out)"
            )
        steps, modules = replay_steps(root)
        print()
        print(f"## {name}: a worker's start-up replayed in one interpreter")
        rows, last = [], {"VmRSS": 0, "RssAnon": 0, "python": 0}
        for step in steps:
            rows.append(
                [
                    str(step["step"]),
                    f"{int(step['VmRSS']) / 1024:.1f}",
                    f"{(int(step['VmRSS']) - last['VmRSS']) / 1024:+.1f}",
                    f"{(int(step['RssAnon']) - last['RssAnon']) / 1024:+.1f}",
                    f"{(int(step['python']) - last['python']) / 1024:+.1f}",
                ]
            )
            last = {key: int(step[key]) for key in last}
        print(
            harness.table(
                ["step", "RSS MB", "RSS added", "anonymous added", "Python objects added"],
                rows,
            )
        )
        loaded = [m for m in OPTIONAL if m in modules]
        print(f"loaded by the server's imports and create_app, needed only elsewhere: {loaded}")
        print()
        print(f"## {name}: a child forked after the start-up (gc.freeze first), MB")
        fork = forked(root)
        fork_rows = []
        for who in ("alone", "parent", "child"):
            got = fork[who]
            private = got.get("Private_Clean", 0) + got.get("Private_Dirty", 0)
            shared = got.get("Shared_Clean", 0) + got.get("Shared_Dirty", 0)
            label = {"alone": "before the fork", "parent": "parent", "child": "forked child"}[who]
            fork_rows.append(
                [label, f"{got['Pss'] / 1024:.1f}", f"{private / 1024:.1f}", f"{shared / 1024:.1f}"]
            )
        print(harness.table(["process", "PSS", "private", "shared"], fork_rows))


if __name__ == "__main__":
    main()
