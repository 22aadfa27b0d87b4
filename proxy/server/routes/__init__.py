"""The route handlers, one module per concern, each a plain function over the app's `Services`
(`request.app.state.services`); app.py lists them.

responses.py      POST /v1/responses: read, refuse or pass on, then the repaired answer
repair.py         the repaired answer: render, check upstream's capability, run the exchange
stored.py         stored responses: retrieve (JSON or SSE), delete, input_items, cancel;
                  POST /v1/responses/input_tokens
conversations.py  the Conversations API
probes.py         /healthz, /readyz, /metrics
passthrough.py    everything else, to upstream untouched
answers.py        what every route answers the same way: errors, the log line, query parameters
"""
