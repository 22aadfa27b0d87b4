"""Settings: one frozen object, parsed once, from defaults < config file < env < CLI flags.

Every setting is declared once, as a field of `Settings` (`settings.py`): its type, its default,
and — in the field's metadata (`setting(...)`, `values.py`) — the parser of its raw text, its
help, its flag aliases and whether it is a secret. From that one declaration come the
environment variables (`PROXY_<NAME>`), the CLI flags (`--<name-with-dashes>`) and the keys of
the TOML config file (`sources.py`), and the commented example file and the settings table of
the docs (`generated.py`); tests keep both files in step. A bad value fails at start with an
error naming the setting, where it came from, and the value (never a secret's).
"""
