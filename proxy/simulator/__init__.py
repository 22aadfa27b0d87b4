"""A faithful stand-in for NVIDIA TensorRT-LLM's `trtllm-serve` serving gpt-oss — no GPU needed.

It is how the proxy is run, shown, tested and load-tested without a GPU. A client pointed at it
sees what it would see from an unpatched trtllm-serve, the `/v1/responses` streaming defect
included (only the last token's text of each engine output is streamed, message boundaries
inside an output are missed), and the proxy in front of it gets the token-id `/v1/completions`
stream (`detokenize: false`) it repairs from.

Theory of operation
-------------------
::

    request ──► route_*.py: validate like upstream, prompt ids
            ──► model.py + prompt.py: a scripted Harmony completion (or replayed ids)
            ──► engine.py: stop rules, finish_reason/stop_reason, engine outputs, pacing
            ──► route_*.py: upstream's frames for each output; faults fire between outputs
            ──► shell.py: the HTTP exchange on a schedule, records, disconnects ──► uvicorn

Everything up to the frames is sans-IO; `shell.py` and `app.py` are the thin I/O around it.
`/v1/completions` is upstream's `CompletionRequest` (completion_request.py, validation.py) and
its post-processors (completion_frames.py). `/v1/responses` renders its prompt with the
proxy's model of upstream's request path (`proxy.harmony.request.prepare`, with upstream's own
rejections put back: upstream_requests.py) and streams through its model of upstream's
emission (`proxy.harmony.unpatched.emitter`): checked frame for frame and byte for byte against
recordings of the real server (`tests/fixtures/trtllm-oracle/`, `tests/fixtures/trtllm-prompts/`).
`/v1/chat/completions` is a plain, correct Harmony chat (chat.py), not a model of upstream's.
A `/v1/completions` `response_format` of type `structural_tag` is enforced (guided.py): the
scripted model writes the first of its answers the format accepts, as a masked engine steers
gpt-oss, and replayed ids that break it are refused with a 400 — as trtllm-serve does when it was
started with a guided-decoding backend. `--no-guided-decoding` (`SimulatorConfig.guided_decoding`)
models a stock server instead: `response_format` is still validated (a malformed one is a 400)
and then ignored, and the scripted model writes what it forbids when it can (model.py).

Outputs become available on the engine's schedule (first output after `first_token_seconds`,
each further one `token_seconds` per token later), whether or not sending kept up; a client
that goes away aborts the generation at once and is recorded with the moment it left.

Public API
----------
- `SimulatorConfig` (config.py): frozen settings.
- `create_simulator_app(config, encoding, *, ids, clock, monotonic) -> Starlette` (app.py);
  `app.state.simulator` is a `SimulatorState` whose `.requests` holds a `RequestRecord` per
  request (number, path, status, stream, prompt_ids, token_ids, tokens_sent, finish_reason,
  faults, completed, cut, disconnected, closed_at; `await record.wait_closed()`).
- `await start_simulator(config, encoding, host="127.0.0.1", port=0) -> RunningSimulator`
  (`.host`, `.port`, `.url`, `.app`, `await .stop()`): a real uvicorn server in the current loop.
- `main(argv) -> int`: the `simulate` command (also `python -m proxy.simulator`).
- `ScriptedModel` (model.py), engine functions (engine.py): sans-IO, usable on their own.

Request headers (names case-insensitive)
----------------------------------------
::

    X-Sim-Fault: SPEC                faults for this request ("none": not even the server's)
    X-Sim-Tokens: N                  the scripted model writes at least N tokens
    X-Sim-Preamble: 0|1              the scripted model writes a commentary preamble
    X-Sim-Replay: IDS                generate exactly these ids (JSON list, or comma/space
                                     separated) instead of the scripted model's
    X-Sim-Chunks: SIZES              sizes of the first engine outputs (0: an output without
                                     tokens), e.g. "20,20,3"; the rest as usual
    X-Sim-Stream-Interval: N         tokens per engine output after the first
    X-Sim-Uneven: off|on|SEED        speculative-decoding-like uneven outputs
    X-Sim-Stop-Mode: kept|stripped   the token that ended generation stays in the ids or not

The proxy forwards end-to-end headers upstream, so these work through it too.

Fault grammar (`X-Sim-Fault`, `--fault`)
----------------------------------------
::

    SPEC   := "none" | FAULT ("," FAULT)*
    FAULT  := "http:" CODE            answer HTTP CODE (400-599), upstream's error body, at once
            | "cut" ["@" K]           drop the connection after K generated tokens (default 0)
            | "stall" ["@" K] ":" S   after K tokens, send nothing for S seconds, then go on
            | "malformed" ["@" K]     after K tokens, one frame whose data is not JSON
            | "no-token-ids" ["@" K]  the next frame after K tokens has `token_ids: null`
            | "bad-logprobs" ["@" K]  (completions with logprobs) the next frame after K
                                      tokens has one logprob fewer than token ids
            | "error" ["@" K]         after K tokens, `data: {"error": {…}}` then `data: [DONE]`
            | "eof" ["@" K]           after K tokens, end the body cleanly: no finish, no [DONE]
            | "done" ["@" K]          after K tokens, `data: [DONE]` without any finish

"After K tokens" is exact: outputs are split at K. `no-token-ids`, `error` and `done` apply to
the `data:`-framed streams (`/v1/completions`, `/v1/chat/completions`); `/v1/responses` streams
know `cut`, `stall`, `malformed` and `eof`. Non-streaming answers know `stall`, `malformed` (half
the body) and `cut` (half the body, then the connection drops). A header fault applies on any
route; the server's default (`--fault`) on the generation routes only.

Not modelled
------------
Upstream's response store (`previous_response_id` answers 404, or 400 with postprocess
workers), `stop` strings (accepted, never matched), batched prompts, `n` > 1, beam search and
`best_of` (400), real logprobs (deterministic stand-ins), the one-second polling with which
upstream notices a disconnect (the simulator notices at once), and upstream's own chat path.
"""

from proxy.simulator.app import create_simulator_app, simulator_state
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.model import ScriptedModel
from proxy.simulator.records import RequestRecord, SimulatorState
from proxy.simulator.server import RunningSimulator, main, start_simulator

__all__ = [
    "RequestRecord",
    "RunningSimulator",
    "ScriptedModel",
    "SimulatorConfig",
    "SimulatorState",
    "create_simulator_app",
    "main",
    "simulator_state",
    "start_simulator",
]
