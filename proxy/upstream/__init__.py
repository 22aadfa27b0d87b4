"""The proxy's side of trtllm-serve.

client.py       `Upstream`: token-id completion streams, pass-through, the capability probe
probe.py        the capability probe (httpx): token ids, logprobs, response_format enforced?
stream.py       the lean HTTP/1.1 client of completion streams and pass-through, with its pool
connection.py   one upstream connection (an asyncio.Protocol) and the client's errors
http1.py        sans-IO HTTP/1.1 for stream.py: llhttp (httptools) reads responses; requests written
completions.py  one `/v1/completions` SSE frame → `Frame` (token ids, finish), or `FrameError`
frames.py       the frames of one completion stream, read one wake-up per frame
"""
