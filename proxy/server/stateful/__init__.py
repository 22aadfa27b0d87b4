"""The stored half of the API in the shell: scope.py (who sees what), state.py (a request's context,
leases, housekeeping), recording.py (a response's writes), follow.py (stored events replayed and
followed), background.py (responses that run with no client). Their routes: routes/stored.py,
routes/conversations.py."""
