"""The ASGI shell around the sans-IO core.

app.py          the app factory: routes, lifespan (owns the upstream client), health, metrics
repair.py       the repaired `/v1/responses`: render, stream token ids through the core, write
passthrough.py  everything else, to upstream untouched
asgi.py         small ASGI blocks: bounded body reads, JSON answers, disconnects, headers
selfcheck.py    deltas against the terminal snapshot, on every stream
runner.py       uvicorn on uvloop, draining on SIGTERM, the metrics port, the simulator
"""
