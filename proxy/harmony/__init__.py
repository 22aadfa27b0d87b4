"""The sans-IO core: request → prompt ids, token ids → Responses events, stored history as data.

Nothing in this package performs I/O, awaits, logs or touches metrics; it takes data and returns
data, so the shell (`proxy.server`) decides every wait, write and count.

request/     a `/v1/responses` body → prompt ids, sampling, echo (or a 400)
stream/      token ids → Responses events (the repair core)
unpatched/   the model of upstream's unpatched emitter (what its clients see)
history/     stored responses and conversations as data
tokens.py    Harmony special-token ids
response.py  the `response` object and its ids, shared by the stream, the model and history
constraint.py  what `tool_choice` and `text.format` demand of the output, and its check
reasoning_seal.py  sealed reasoning and compactions (`encrypted_content`): AES-256-GCM blobs

Layers, highest first (a module imports only from below): history; request | stream;
unpatched; the base modules (tokens, response, constraint, reasoning_seal).
"""
