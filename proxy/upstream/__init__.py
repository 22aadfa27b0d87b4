"""The proxy's side of trtllm-serve: one client, for streams, pass-through, the probe and /health.

client.py       `Upstream`: token-id completion streams, pass-through, the probe, `/health`
probe.py        the capability probe: token ids, logprobs, response_format enforced?
stream.py       the lean HTTP/1.1 client, with its pool: every request to upstream goes through it
transport.py    how its connections reach upstream: TCP and TLS, or what a test injects
connection.py   one upstream connection (an asyncio.Protocol) and the client's errors
http1.py        sans-IO HTTP/1.1 for stream.py: llhttp (httptools) reads responses; requests written
completions.py  one `/v1/completions` SSE frame → `Frame` (token ids, finish), or `FrameError`
frames.py       the frames of one completion stream, read one wake-up per frame
"""
