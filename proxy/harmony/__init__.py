"""Sans-IO Harmony layer: request → prompt ids, token ids → Responses events.

Nothing in this package performs I/O, awaits, logs or touches metrics; it takes data and returns
data (house-style principle 1).
"""
