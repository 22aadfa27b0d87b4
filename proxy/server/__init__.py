"""The ASGI shell around the sans-IO core.

app.py          the app factory: routes, lifespan (owns the upstream client), health, metrics
repair.py       the repaired `/v1/responses`: render, stream token ids through the core, write
render.py       the Renderer seam: cheap bodies inline, the rest in worker processes (issue 12)
render_worker.py  the worker process: prepare_request over a pipe
budget.py       the global budget for request bodies being read and rendered (issue 12)
passthrough.py  everything else, to upstream untouched
asgi.py         small ASGI blocks: bounded body reads, JSON answers, disconnects, headers
selfcheck.py    deltas against the terminal snapshot, on every stream
runner.py       uvicorn on uvloop, the drain on SIGTERM, the metrics port, the simulator
supervisor.py   `workers` > 1: the worker processes on one port, replaced when they die (issue 17)
worker.py       one worker process: the proxy on its own SO_REUSEPORT listener
multiproc.py    one /metrics over every worker (prometheus_client's multiprocess mode)
cpus.py         the CPUs this process may use (`workers = auto`: affinity, cgroup quota)
guard.py        client-side HTTP limits (heads, slow clients, keep-alive, connections; issue 12)
guard_protocol.py  the uvicorn protocol that applies them, and answers pipelines in order
forwarding.py   forwarding headers set from the connection, never the client's (issue 12)
"""
