"""The proxy's side of trtllm-serve.

client.py       `Upstream`: token-id completion streams, the capability probe, pass-through (httpx)
stream.py       the lean HTTP/1.1 client of the completion streams (one protocol per connection)
http1.py        sans-IO HTTP/1.1 for stream.py: llhttp (httptools) reads responses; requests written
completions.py  one `/v1/completions` SSE frame → `Frame` (token ids, finish), or `FrameError`
"""
