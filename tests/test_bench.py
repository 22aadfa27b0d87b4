"""The benchmark scripts still run and print their tables (tiny sizes: figures come from the
real runs in BENCHMARKS.md; this only keeps the scripts from rotting)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def rows(output: str) -> dict[str, list[str]]:
    """Table rows by their first cell (separator rows left out)."""
    table: dict[str, list[str]] = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(cells[0]) <= set("-:"):
            table[cells[0]] = cells[1:]
    return table


def test_latency_measures_every_path_without_errors() -> None:
    # `--before`: a second checkout's proxy in the same run (this one again, here).
    output = bench("latency.py", "--repeats", "1", "--tokens", "60", "--before", str(ROOT))
    table = rows(output)
    for path in ("direct", "relay", "relay-lean", "proxy", "proxy-before"):
        assert table[path][0] == "1", table  # one request
        assert table[path][-1] == "0", table  # no errors
        assert float(table[path][7]) > 0  # per-frame p50 ms: frames were timed
    # the latency targets (≤ 1.5 ms to response.created, ≤ 0.5 ms per frame), each with its
    # verdict, and the before/after comparison
    number = r"-?[0-9.]+ ms"
    assert re.search(
        rf"proxy: added time to response.created \(p50\) {number}, target ≤ 1.5 ms: (met|MISSED)",
        output,
    )
    assert re.search(
        rf"proxy: added per-frame latency \(p50\) {number}, target ≤ 0.5 ms: (met|MISSED)", output
    )
    assert re.search(
        r"proxy vs proxy-before, per frame: [+-][0-9.]+ ms p50 \((no regression|REGRESSION)\)",
        output,
    )


def test_capacity_measures_cpu_and_memory_without_errors() -> None:
    output = bench(
        "capacity.py",
        *("--concurrency", "4", "--min-streams", "4", "--tokens", "60"),
        *("--lengths", "60", "120", "--length-concurrency", "4", "--repeats", "1"),
        *("--setting", "store_url=off"),
    )
    table = rows(output)
    assert table["4"][-1] == "0", table  # the 4-stream row: no errors
    assert table["60"][-1] == table["120"][-1] == "0", table  # the length rows
    # /proc counts CPU in 10 ms ticks: at these tiny sizes the fit can come out flat or
    # slightly negative ("-0.00"); the line's presence and form is what is checked here.
    assert re.search(r"CPU per response = -?[0-9.]+ ms \+ -?[0-9.]+ µs × tokens", output), output


def test_tracing_cost_compares_off_on_and_before_without_errors() -> None:
    output = bench(
        "tracing_cost.py",
        *("--before", str(ROOT), "--concurrency", "4", "--streams", "4"),
        *("--tokens", "60", "--repeats", "1"),
    )
    table = rows(output)
    for build in ("before", "off", "on"):
        assert table[build][0] == "4", table  # every stream completed
        assert table[build][-1] == "0", table  # no errors
    exports = re.search(r"OTLP exports received: ([0-9]+)", output)
    assert exports is not None, output
    assert int(exports.group(1)) >= 1, output  # `on` exported
    # a run this small can measure no CPU tick at all: then it says so instead of a ratio
    assert re.search(
        r"tracing on \(100 % sampled\) vs off: [0-9.]+ ×|too little CPU measured", output
    ), output


def test_store_cost_measures_every_store_without_errors() -> None:
    table = rows(
        bench(
            "store_cost.py",
            *("--repeats", "2", "--short-tokens", "40", "--tokens", "60"),
            *("--streams", "4", "--concurrency", "2", "--rounds", "1"),
        )
    )
    for store in ("off", "embedded", "redis"):
        assert table[store][-1] == "0", table  # no errors, in either table
    assert float(table["embedded"][4]) > 0  # stored KB per response measured


def test_conversation_cost_measures_every_store_without_errors() -> None:
    output = bench(
        "conversation_cost.py",
        *("--repeats", "2", "--length", "40", "--appends", "8"),
        *("--concurrency", "2", "--history", "25"),
    )
    table = rows(output)
    for store in ("memory", "embedded", "redis"):
        assert table[store][-1] == "0", table  # no errors
        assert float(table[f"{store} 20 items @ 40"][0]) > 0  # appends timed
        assert float(table[f"{store}, 25 items"][0]) > 0  # requests with `conversation` timed
    assert float(table["embedded"][2]) > 0  # stored bytes per item measured


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("core_throughput.py", ("--repeats", "1", "--tokens", "120"), r"120\s+20\s+full\s+[0-9,]+"),
        (
            "core_throughput.py",
            ("--repeats", "1", "--tokens", "120", "--before", str(ROOT)),
            r"120\s+20\s+on\s+before\s+[0-9,]+",
        ),
        ("cold_cache.py", ("--repeats", "1", "--gap-ms", "1", "--tokens", "60"), r"ResponseStream"),
        ("prepare.py", ("--repeats", "3"), r"20-item agent history"),
        ("unpatched_cost.py", ("--repeats", "1", "--tokens", "60"), r"20 per chunk"),
        ("request_fields.py", ("--repeats", "1", "--items", "12"), r"truncation=auto cuts \|"),
    ],
)
def test_core_benchmarks_print_their_tables(
    script: str, args: tuple[str, ...], expect: str
) -> None:
    assert re.search(expect, bench(script, *args))


def test_http_parser_compares_parsers_and_proxies_before_and_after() -> None:
    output = bench(
        "http_parser.py",
        *("--repeats", "1", "--frames", "20", "--baseline", "HEAD"),
        *("--requests", "1", "--tokens", "60"),
    )
    table = rows(output)
    for parser in ("llhttp (httptools)", "http1.py at HEAD", "h11"):
        assert float(table[parser][0]) > 0, table  # per frame µs
    for proxy in ("proxy at HEAD", "proxy (this checkout)"):
        assert table[proxy][0] != "0", table  # frames were timed
        assert table[proxy][-1] == "0", table  # no errors


def test_render_cost_prints_the_inline_bound_and_the_round_trip() -> None:
    table = rows(bench("render_cost.py", "--repeats", "3"))
    assert "5 items, longest runs" in table, table
    assert "agent: 3 tools, 20 items" in table, table
    assert float(table["agent: 3 tools, 20 items"][1]) > 0  # the worker's p50 ms


def test_hostile_render_compares_inline_and_workers() -> None:
    output = bench(
        "hostile_render.py",
        *("--chars", "20000", "--streams", "2", "--tokens", "40"),
        *("--quiet", "1", "--realistic-mib", "0.6"),
    )
    table = rows(output)
    assert table["stream errors"] == ["0", "0"], output
    # every hostile body got an answer in both runs (tiny sizes: all are served)
    assert table["run of 20,000 letters"][1].startswith("200 completed"), output
    assert table["realistic 500 KB"] == [
        "200 completed" + c[13:] for c in table["realistic 500 KB"]
    ]
    assert float(table["/healthz p99 ms, hostile"][1]) > 0


def test_body_memory_reads_the_rss_of_the_proxy_and_its_workers() -> None:
    table = rows(bench("body_memory.py", "--clients", "3", "--mib", "1"))
    assert table["answers: 400 invalid_type"] == ["3", "3"], table
    proxy, workers = (float(v) for v in table["RSS idle, proxy / workers MB"][1].split(" / "))
    assert proxy > 0
    assert workers == 0  # the render worker of the default settings starts with the first body
    assert float(table["peak RSS workers MB"][1]) > 0  # ... that is not cheap: these are 1 MiB
    assert table["RSS idle, proxy / workers MB"][0].endswith("/ 0")  # render_workers 0


def test_http_guard_compares_both_protocols() -> None:
    """And a third, another checkout's guard (`--baseline`; this checkout stands in for it)."""
    argv = ("--rounds", "1", "--requests", "20", "--frames", "50", "--baseline", str(ROOT))
    table = rows(bench("http_guard.py", *argv))
    for kind in ("plain", "guarded", "guarded (base)"):
        round_trip, _, per_frame, _, upload, _ = (float(cell) for cell in table[kind])
        assert round_trip > 0
        assert per_frame > 0
        assert upload > 0


def test_logprobs_cost_measures_every_configuration() -> None:
    table = rows(bench("logprobs_cost.py", "--tokens", "120", "--repeats", "2"))
    for name in ("off", "top 0", "top 5", "top 20"):
        assert float(table[name][0]) > 0, table  # µs per token
    assert table["off"][-1] == "1.00x", table
    # The include costs bytes on the wire: more per token with more alternatives.
    sent = [int(table[name][3]) for name in ("off", "top 0", "top 5", "top 20")]
    assert sent == sorted(sent), table
    # Beside them, the entries as built before the alternatives were ranked.
    for name in ("top 5", "top 20"):
        assert float(table[f"{name} before"][0]) > 0, table


def test_workers_measures_one_and_two_workers_without_errors() -> None:
    output = bench(
        "workers.py",
        *("--streams", "8", "--concurrency", "4", "--tokens", "60", "--repeats", "1"),
        *("--upstreams", "replay"),
    )
    table = rows(output)
    layouts = {
        name: cells
        for name, cells in table.items()
        if "worker" in name and not name.startswith(("CPU by role", "timeline"))
    }
    assert len(layouts) >= 2, output  # 4 on a 2-core machine
    for name, cells in layouts.items():
        assert cells[0] == "8", output  # streams
        assert float(cells[1].split(" / ")[0].replace(",", "")) > 0  # aggregate tok/s
        assert cells[-2:] == ["0", "ok"], output  # no errors; /metrics summed right
        idle, peak = (float(v) for v in cells[-4].split(" / "))  # proxy PSS MB
        assert 0 < idle <= peak, output
        assert 0 < float(cells[-3]) <= idle, output  # per worker
        # where each stream's time went: to its head, to its end (p50 / max, seconds)
        head, end = (float(v.split(" / ")[0]) for v in table[f"timeline, {name}"][:2])
        assert 0 < head < end, output
    # CPU by role: a single worker's CPU is its `serve` process's loop; with 2, the workers'
    one = table["CPU by role, 1 worker, proxy on core 0,1"]
    headers = next(
        [c.strip() for c in line.strip().strip("|").split("|")][1:]
        for line in output.splitlines()
        if line.startswith("|") and "switches per 1k tokens" in line
    )
    assert float(one[headers.index("serve: loop")]) > 0, output


def test_workers_compares_a_setting_in_one_run() -> None:
    output = bench(
        "workers.py",
        *("--streams", "4", "--concurrency", "4", "--tokens", "40", "--repeats", "1"),
        *("--upstreams", "replay", "--layouts", "1x1"),
        *("--compare", "store_url=off"),
    )
    table = rows(output)
    for name in ("1 worker, proxy on core 0", "1 worker, proxy on core 0, store_url=off"):
        assert table[name][0] == "4", output
        assert table[name][-2:] == ["0", "ok"], output


def test_latency_times_the_first_token_and_the_phases_before_created() -> None:
    output = bench("latency.py", "--repeats", "2", "--tokens", "60", "--phases")
    table = rows(output)
    for path in ("direct", "relay", "relay-lean", "proxy"):
        assert table[f"{path}, first token"][0] == "2", output
        assert float(table[f"{path}, first token"][1]) > 0, output
    # each phase of the proxy's time before response.created, timed on both requests
    for phase in (
        "body read, JSON parse, checks",
        "render + validate",
        "upstream request reaches the simulator",
        "upstream head → proxy's head sent",
        "response.created → client reads it",
    ):
        assert table[phase][0] == "2", output
        assert float(table[phase][1]) >= 0, output
    assert float(table["simulator: request → head"][1]) >= 0, output  # the direct path's
    assert re.search(
        r"proxy: added time to the first generated-token event \(p50\) -?[0-9.]+ ms, the lean "
        r"relay's -?[0-9.]+ ms; target ≤ lean relay \+ 0.3 ms: (met|MISSED)",
        output,
    )


def test_idle_memory_splits_each_process_and_replays_the_start_up() -> None:
    output = bench("idle_memory.py", "--workers", "1")
    table = rows(output)
    process = next(name for name in table if name.startswith("serve ("))
    assert float(table[process][0]) > 20, output  # PSS MB: an interpreter at least
    # an idle proxy has no render worker: the first body that is not cheap starts it
    assert not any(name.startswith("render worker (") for name in table), output
    assert float(table["all"][0]) >= float(table[process][0]), output
    # the vocab tables are anonymous memory the encoding's load adds
    assert float(table["load the Harmony encoding (vocab tables)"][2]) > 1, output
    assert re.search(r"idle PSS per worker, all its processes: [0-9.]+ MB", output)
    # a child forked after the start-up shares most of it: its private memory is a fraction
    pss, private, shared = (float(v) for v in table["forked child"])
    assert 0 < private < shared, output
    assert pss < float(table["before the fork"][0]), output


def test_stream_memory_compares_the_store_on_and_off() -> None:
    table = rows(bench("stream_memory.py", "--streams", "6", "--tokens", "80", "--repeats", "1"))
    for name in ("store on", "store off"):
        assert table[name][0] == "6", table
        assert table[name][-1] == "0", table  # every stream completed
        assert float(table[name][2]) >= float(table[name][1]) > 0, table  # open ≥ idle


def test_stream_memory_trace_names_what_holds_the_streams() -> None:
    output = bench("stream_memory.py", "--trace", "--streams", "4", "--tokens", "60", "--top", "5")
    for name in ("store on", "store off"):
        assert f"## {name}: 4 streams, 0 errors" in output, output
    assert output.count("per open stream: PSS") == 2, output
    # the lines that grew, named in the checkout or the package they are in
    assert re.search(r"\| +proxy/\S+\.py:\d+ \|", output), output


def test_scale_run_ends_every_stream_and_reads_the_memory() -> None:
    output = bench("scale.py", "--streams", "30", "--tokens", "40", "--token-ms", "2")
    table = rows(output)
    for path in ("direct", "proxy"):
        assert table[path][:2] == ["30", "30"], output  # all terminal
        assert table[path][-1] == "0", output
        assert int(table[path][3]) > 0, output  # frames timed
    assert "proxy: all streams terminal: yes (30/30)" in output
    assert re.search(
        r"proxy: added per-frame p99: [+-][0-9.]+ ms, target ≤ 5.0 ms: (met|MISSED)", output
    )
    assert re.search(r"proxy: PSS MB idle / peak: [0-9]+ / [0-9]+, (within|OVER)", output)


def test_store_workers_measures_one_and_two_processes_and_no_store() -> None:
    output = bench(
        "store_workers.py",
        *("--streams", "8", "--frames", "4", "--pace-ms", "5", "--repeats", "1", "--no-store"),
    )
    table = rows(output)
    for name in ("1 process", "2 processes", "no store, 1 process", "no store, 2 processes"):
        assert float(table[name][3]) > 0, output  # store CPU µs per token
    assert int(table["2 processes"][7]) >= 2, output  # transactions: both processes wrote
    assert table["no store, 1 process"][7] == "0", output


def test_profile_proxy_times_the_gc_with_the_store_on_and_off() -> None:
    output = bench("profile_proxy.py", "--streams", "4", "--tokens", "60", "--gc")
    table = rows(output)
    for name in ("store on", "store off"):
        assert int(table[f"{name}, generation 0"][0]) >= 0, output
    assert "objects tracked at exit" in output


def test_ws_loop_measures_both_transports_without_errors() -> None:
    output = bench("ws_loop.py", "--turns", "3", "--repeats", "1", "--tokens", "20")
    table = rows(output)
    for mode in ("websocket", "http"):
        assert table[mode][0] == "3", table  # turns
        assert table[mode][-1] == "0", table  # no errors
    # with 3 turns the history sent over HTTP already outweighs the new items alone
    assert float(table["http"][1].replace(",", "")) > float(table["websocket"][1].replace(",", ""))
    assert re.search(r"client bytes, http / websocket: [0-9.]+x", output), output
    assert re.search(r"added ms / turn, websocket - http \(p50\): [+-][0-9.]+", output), output


def test_compaction_cost_compacts_and_shrinks_the_prompt() -> None:
    output = bench("compaction_cost.py", "--turns", "6", "--repeats", "5")
    table = rows(output)
    plain, compacted = table["no compaction"], table["threshold"]
    assert int(compacted[4]) >= 1  # compactions happened
    assert int(compacted[2]) < int(plain[2])  # the last prompt is shorter
    assert int(plain[4]) == 0


def test_mcp_roundtrip_measures_every_case() -> None:
    table = rows(bench("mcp_roundtrip.py", "--repeats", "2", "--tokens", "20"))
    for case in ("plain", "client loop", "hosted, list cached", "hosted, list each time"):
        assert float(table[case][0]) > 0, case
    assert float(table["mcp call alone"][0]) > 0
