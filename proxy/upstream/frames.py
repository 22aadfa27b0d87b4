"""The frames of one upstream completion stream: SSE decoded from the lean client's response
and parsed (`completions.parse_frame`), one event-loop wake-up per frame."""

from __future__ import annotations

import asyncio

from proxy.sse import Message, SSEDecoder
from proxy.upstream.completions import Frame, FrameError, parse_frame
from proxy.upstream.stream import Response, StreamError

#: A frame larger than this is not a trtllm frame: fail instead of buffering without bound.
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: After the finish frame upstream still sends the usage frame and `[DONE]` (at once, in
#: trtllm-serve's generator). Reading them, within these bounds, lets the connection go back to
#: the pool; closing a response with unread body closes the connection instead, and every
#: request paid a new TCP connection to upstream (found by bench/latency.py).
RELEASE_SECONDS = 0.1
RELEASE_FRAMES = 4


class Frames:
    """The frames of one upstream completion stream, in order (an async iterator).

    Not an async generator on purpose: the shell waits for the next frame under a deadline and
    cancels the wait when it expires (keepalive, idle timeout, shutdown). Cancelling an async
    generator mid-`await` would end it; here a cancelled `__anext__` loses nothing (the state
    is in the object, bytes are taken from the connection only once they are here) and the
    next call goes on where it was. Awaiting it directly costs one event-loop wake-up per
    frame, where a task per wait cost three (bench/latency.py measures the time per frame).
    """

    __slots__ = ("_decoder", "_ended", "_logprobs", "_pending", "_response")

    def __init__(self, response: Response, *, logprobs: bool = False) -> None:
        self._response = response
        self._logprobs = logprobs  # asked for: every frame with ids must carry them
        self._decoder = SSEDecoder()
        # Messages not yet parsed, the next one last: a list taken from the decoder's, where a
        # deque would reserve ~760 bytes for the stream's life (bench/stream_memory.py).
        self._pending: list[Message] = []
        self._ended = False

    def __aiter__(self) -> Frames:
        return self

    async def __anext__(self) -> Frame:
        pending = self._pending
        while not pending:
            if self._ended:
                raise StopAsyncIteration
            try:
                chunk = await self._response.read()
            except StreamError as exc:
                raise FrameError(
                    "upstream_disconnected",
                    f"upstream connection broke mid-stream ({type(exc).__name__})",
                ) from exc
            if chunk:
                pending = self._decoder.feed(chunk)
            else:
                self._ended = True
                pending = self._decoder.flush()
            pending.reverse()
            self._pending = pending
            if self._decoder.pending_bytes > MAX_FRAME_BYTES:
                raise FrameError("malformed_frame", "upstream frame exceeds 8 MiB")
        return parse_frame(pending.pop().data, logprobs=self._logprobs)

    async def release(self) -> None:
        """Read the rest of a finished stream (bounded) so its connection can be reused. The
        client already has its terminal event; only the end of its body waits for this.
        Whatever goes wrong here only means the connection is closed instead."""
        try:
            async with asyncio.timeout(RELEASE_SECONDS):
                count = 0
                async for _ in self:
                    count += 1
                    if count > RELEASE_FRAMES:
                        return
        except (TimeoutError, FrameError):
            return
