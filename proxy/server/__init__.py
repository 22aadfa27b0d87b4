"""The ASGI shell around the sans-IO core.

app.py          the app factory: routes, lifespan (owns the upstream client), health, metrics
repair.py       the repaired `/v1/responses`: read, render, answer (stream, JSON, background)
exchange.py     one repaired request: upstream frames through the core to the client
deps.py         what the requests of one app share: ServerState, RepairDeps, the drain's bound
passthrough.py  everything else, to upstream untouched
asgi.py         small ASGI blocks: bounded body reads, JSON answers, disconnects, headers
selfcheck.py    deltas against the terminal snapshot, on every stream
deadline.py     one lazily re-armed timer per stream for its waits (issue 17)

http/           what a client may send or hold (issue 12): guard.py + guard_protocol.py (HTTP
                limits on a uvicorn protocol, pipelining), closing.py (lingering closes, room
                under the cap), forwarding.py, budget.py (body memory)
rendering/      rendering off the event loop (issue 12): pool.py (the Renderer seam: cheap bodies
                inline, the rest in worker processes), worker.py (prepare_request over a pipe)
stateful/       the stored half of the API (issues 13, 16): scope.py, state.py (context, leases,
                housekeeping), recording.py, background.py, responses_api.py, conversations_api.py
processes/      serving processes: runner.py (uvicorn on uvloop, the drain on SIGTERM, the metrics
                port, the simulator), supervisor.py + worker.py (`workers` > 1 on one port,
                replaced when they die; issue 17), multiproc.py (one /metrics), cpus.py (`auto`)
"""
