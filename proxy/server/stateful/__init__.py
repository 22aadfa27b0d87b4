"""The stateful half of the API: store context, recording, background runs, the stored-response and
conversation routes (issues 13, 16)."""
