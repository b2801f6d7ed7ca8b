"""The doors: the Pulsar binary protocol server, the admin HTTP API, the CLI and config.

``broker`` is the transport-independent core (topics, subscriptions, dispatch, compaction
runs); ``wire`` speaks the Pulsar binary protocol to it; ``http`` and ``routers`` serve the
admin REST API (``errors`` maps domain errors to HTTP in one place, ``metrics`` the
Prometheus text); ``admin_cli`` and ``offline`` are ``compactd admin`` and ``compactd
compact-topic``; ``config`` reads settings once at start; ``server`` runs them all
under ``compactd serve``; ``cli`` is the command line.
"""

__all__: list[str] = []
