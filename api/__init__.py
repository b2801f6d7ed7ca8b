"""The doors: the Pulsar binary protocol server, the admin REST API, the CLI and config.

Only the CLI exists so far; the broker core and both listeners land with later issues.
"""

__all__: list[str] = []
