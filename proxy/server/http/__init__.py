"""Client-facing HTTP: limits on what a client may send or hold, forwarding headers, the body
budget (issue 12)."""
