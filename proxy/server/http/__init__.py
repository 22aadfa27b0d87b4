"""Client-facing HTTP: limits on what a client may send or hold (guard.py, guard_protocol.py,
closing.py, connections.py), forwarding headers (forwarding.py), the body budget (budget.py)."""
