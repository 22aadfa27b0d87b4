"""Upstream faults end cleanly (issue 12, item 5), on real sockets with a scripted upstream.

- The idle and first-token timeouts count from the last *token*: empty frames and usage-only
  frames for ever end the stream with `upstream_timeout`.
- An error answer whose body never ends is answered within a short bound (and never after the
  request's own deadline), with upstream's status class and a message that does not quote junk.
- A response head over the limit is refused.
- A malformed or cut pass-through answer becomes a 502 JSON before our head, or a visible abort
  after it: one log line, one counted error, nothing logged by uvicorn.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from tests.live import LiveServer
from tests.reliability import Proxy, body, running_proxy, sse_events, wait_until
from tests.upstream_double import UpstreamDouble, script_for
from tests.wellformed import assert_well_formed

IDLE = 0.5  # the proxy's idle timeout in these tests (seconds)
FIRST_TOKEN = 1.0  # its first-token timeout
KEEPALIVE = 0.2  # its keepalive interval
ANSWER = [200005, 17196, 200008, 12194, 13, 200002]  # <|channel|>final<|message|>Hi.<|return|>


@pytest.fixture(scope="module")
def double_proxy(encoding: HarmonyEncoding) -> Iterator[tuple[UpstreamDouble, Proxy]]:
    double = UpstreamDouble()
    with (
        LiveServer(double) as upstream,
        running_proxy(
            upstream.url,
            encoding,
            idle_timeout=IDLE,
            first_token_timeout=FIRST_TOKEN,
            keepalive_interval=KEEPALIVE,
        ) as running,
    ):
        yield double, running


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as http:
        yield http


def counts(proxy: Proxy) -> dict[str, float]:
    """The counters these tests move."""
    out = {
        "failed": proxy.metric(
            "proxy_requests_total",
            route="responses",
            stream="true",
            model="other",
            outcome="failed",
        ),
    }
    for kind in ("timeout", "upstream_error", "upstream_bad_response", "upstream_disconnected"):
        out[kind] = proxy.metric("proxy_upstream_errors_total", kind=kind)
    for kind in ("idle", "first_token", "first_byte"):
        out["timeout_" + kind] = proxy.metric("proxy_timeouts_total", kind=kind)
    return out


def changes(proxy: Proxy, before: dict[str, float], expected: dict[str, float]) -> dict[str, float]:
    """The counter changes since `before`, once they match `expected` or after 5 s (the proxy
    counts a request just after its last byte)."""

    def delta() -> dict[str, float]:
        now = counts(proxy)
        return {key: now[key] - before[key] for key in now if now[key] != before[key]}

    wait_until(lambda: delta() == expected, 5.0)
    return delta()


def assert_serves_next(double: UpstreamDouble, proxy: Proxy, client: httpx.Client) -> None:
    double.script = script_for(ANSWER)
    answer = client.post(proxy.url + "/v1/responses", json=body("And now?"))
    assert answer.status_code == 200
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"


# -- the timeouts count from the last token ---------------------------------------------------


FOREVER = 200  # steps of 20 ms: 4 s, far past both timeouts
TOKENLESS = {
    "empty": ("frame", [], None, None),
    "usage": ("usage", 1),
}


@pytest.mark.parametrize("filler", list(TOKENLESS))
def test_tokenless_frames_after_a_token_end_in_the_idle_timeout(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client, filler: str
) -> None:
    double, proxy = double_proxy
    double.queue = [
        [("frame", [200005], None, None)] + [("sleep", 0.02), TOKENLESS[filler]] * FOREVER
    ]
    before = counts(proxy)
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    assert answer.status_code == 200
    events = sse_events(answer.content)
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "upstream_timeout"
    assert events[-2]["message"] == f"upstream sent no next token within {IDLE:g} s"
    assert IDLE <= elapsed < FOREVER * 0.02 / 2, elapsed  # ended by the timeout, not the script
    # The client heard keepalives while upstream sent frames without tokens.
    assert answer.content.count(b": keepalive\n\n") >= 1
    expected = {"failed": 1, "timeout": 1, "timeout_idle": 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(double, proxy, client)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


@pytest.mark.parametrize("filler", list(TOKENLESS))
def test_tokenless_frames_before_a_token_end_in_the_first_token_timeout(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client, filler: str
) -> None:
    double, proxy = double_proxy
    double.queue = [[("sleep", 0.02), TOKENLESS[filler]] * FOREVER]
    before = counts(proxy)
    started = time.monotonic()
    answer = client.post(proxy.url + "/v1/responses", json=body())
    elapsed = time.monotonic() - started
    events = sse_events(answer.content)
    assert assert_well_formed(events)["status"] == "failed"
    assert events[-2]["code"] == "upstream_timeout"
    assert events[-2]["message"] == f"upstream sent no first token within {FIRST_TOKEN:g} s"
    assert FIRST_TOKEN <= elapsed < FOREVER * 0.02 / 2, elapsed
    expected = {"failed": 1, "timeout": 1, "timeout_first_token": 1}
    assert changes(proxy, before, expected) == expected
    assert_serves_next(double, proxy, client)
    assert proxy.logs.problems() == [], proxy.logs.text()[-3000:]


def test_tokens_slower_than_frames_but_within_the_idle_timeout_complete(
    double_proxy: tuple[UpstreamDouble, Proxy], client: httpx.Client
) -> None:
    """The other side of the rule: a token every 0.3 s (< IDLE), with empty frames between,
    is a healthy slow stream and completes."""
    double, proxy = double_proxy
    steps: list[tuple[object, ...]] = []
    for token in ANSWER[:-1]:
        steps += [("frame", [token], None, None)]
        steps += [("sleep", 0.1), TOKENLESS["empty"]] * 3
    steps += [("frame", [ANSWER[-1]], "stop", None), ("usage", len(ANSWER)), ("done",)]
    double.queue = [steps]
    answer = client.post(proxy.url + "/v1/responses", json=body())
    assert assert_well_formed(sse_events(answer.content))["status"] == "completed"
