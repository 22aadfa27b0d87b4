"""The ASGI shell around the sans-IO core: it owns every socket, wait, write, count and log line.

Floors, from the top; a module imports only from its own floor's package and the floors below
(checked by `make lint`: pyproject.toml's [tool.importlinter], ARCHITECTURE.md):

processes/    serving processes: runner.py (uvicorn with the drain), supervisor.py + worker.py
              (`workers` > 1 on one port), multiproc.py (one /metrics), cpus.py (`auto`)
app.py        `create_app`: the routes, the middleware and the lifespan, declared
lifespan.py   what the app starts and ends: renderer, store, capability probe, background runs
routes/       the route handlers, one module per concern (its __init__ lists them)
services.py   `Services`: what the routes and the lifespan share, built once from the seams
stateful/     the stored half: scope.py (who sees what), state.py (context, leases,
              housekeeping), recording.py (a response's writes), follow.py (replay and follow
              stored events), background.py (runs with no client, cancel)
outcome.py    one repaired exchange's end, counted and logged
relay.py      the pass-through: a request to upstream untouched, streamed both ways
capability.py the capability probe's loop, and the first requests' wait for its first answer
exchange.py   one repaired request: upstream frames through the core to the client
deps.py       `ServerState`, `RepairDeps` (what an exchange is given), the drain's bound
rendering/    rendering off the event loop: pool.py (the `Renderer` seam), worker.py (a process)
http/         what a client may send or hold: guard.py (the limits on uvicorn's protocol),
              guard_protocol.py, closing.py (lingering closes, room under the cap),
              connections.py (what the connections share), forwarding.py, budget.py
asgi.py       small ASGI blocks: bounded body reads, JSON answers, disconnects, headers
selfcheck.py  deltas against the terminal snapshot, on every stream
deadline.py   one lazily re-armed timer per stream for its many short waits
"""
