"""One worker process of the supervisor (supervisor.py): the whole proxy — its own
event loop, render workers, upstream client and store connection — on a listening socket of
its own that shares the port with the other workers (SO_REUSEPORT).

`python -m proxy.server.processes.worker`, started by the supervisor, which writes a
`WorkerSpec` to its stdin and keeps that pipe open for the worker's life:

    supervisor → worker   stdin    length-prefixed pickled WorkerSpec, then nothing; EOF means
                                   the supervisor is gone: the worker drains as on SIGTERM
    worker → supervisor   stdout   b"R" once it accepts connections (its lifespan is up)
                          stderr   its log lines, each with `worker: N`

SIGTERM drains exactly as a single process does (runner.py). File descriptor 1 is moved away
from the channel, so that nothing printed can pass for a message.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from proxy.config.settings import Settings
from proxy.config.sources import ConfigError

READY = b"R"
HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class WorkerSpec:
    """What the supervisor tells a worker: the settings (upstream and reasoning keys already
    resolved, so that every worker uses the same), its number, the metrics directory."""

    settings: Settings
    index: int
    metrics_dir: Path

    def encode(self) -> bytes:
        payload = pickle.dumps(self)
        return HEADER.pack(len(payload)) + payload


def check_settings(settings: Settings, workers: int) -> None:
    """Settings that cannot work with `workers` processes (a `ConfigError` naming them)."""
    if workers > 1 and settings.store_url.startswith("memory:"):
        raise ConfigError(
            f"store_url={settings.store_url!r} with workers={workers}: the memory store lives "
            "in one process, so a response stored by one worker would be missing in the "
            "others; use embedded (the default) or redis://"
        )


def read_spec(stream: BinaryIO) -> WorkerSpec:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the supervisor sent no worker spec")
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the worker spec was cut short")
    # The supervisor, our parent, wrote it to a pipe only the two of us hold.
    spec = pickle.loads(payload)
    if not isinstance(spec, WorkerSpec):
        raise TypeError(f"expected a WorkerSpec, got {type(spec).__name__}")
    return spec


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT: every worker binds its own, and
    the kernel spreads new connections over the listening ones by a hash of the addresses
    (an even spread; one socket shared by all would wake whichever worker is idle, and
    uvicorn's accept loop takes the whole backlog at once, loading one worker with the burst)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def main() -> int:
    # Until uvicorn installs the drain's handlers, a SIGTERM (the supervisor stopping while
    # this worker loads) just ends it, which is what it should do then.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which tells us
    spec = read_spec(sys.stdin.buffer)
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)

    from proxy import logs, vocab
    from proxy.server.processes import multiproc, runner

    settings = spec.settings
    logger = logs.configure(settings.log_level, settings.log_format, worker=spec.index)
    multiproc.check_active()
    encoding = vocab.load_encoding(vocab.loaded_dir(os.environ))
    sock = bind_socket(settings.host, settings.port)
    registry = multiproc.shared_registry(spec.metrics_dir)
    parent = sys.stdin.fileno()

    def started(server: runner.DrainingServer) -> None:
        channel.write(READY)
        channel.flush()
        loop = asyncio.get_running_loop()

        def parent_gone() -> None:
            if os.read(parent, 4096):
                return
            loop.remove_reader(parent)
            logger.warning("supervisor gone: draining", extra={"pid": os.getpid()})
            server.handle_exit(signal.SIGTERM, None)

        loop.add_reader(parent, parent_gone)

    with asyncio.Runner(loop_factory=runner.loop_factory(settings.event_loop)) as loop_runner:
        loop_runner.run(
            runner.serve_proxy(
                settings, encoding, logger, registry=registry, sockets=[sock], on_started=started
            )
        )
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process by the supervisor
    # The module under its own name, not `__main__`: the spec unpickles as its WorkerSpec.
    from proxy.server.processes import worker

    raise SystemExit(worker.main())
