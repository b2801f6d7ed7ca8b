"""The broker core's tables on the shared metadata database: policies.

``PolicyStore`` owns the ``policies`` component of ``ledger.database.Database``: named
policy values (JSON) per scope, a topic (``persistent://tenant/ns/t``) or a namespace
(``tenant/ns``). A topic's policies are declared as the topic's rows, so deleting the topic
removes them in the ledger layer's delete transaction. Writes are the named transactions
``policies.set`` and ``policies.remove`` (fault points: ``ledger.database``).
"""

from __future__ import annotations

import json
from typing import Any

from api.broker.partitions import policy_scopes
from ledger.database import Database, TopicTable, load_migrations

__all__ = ["COMPONENT", "MIGRATIONS", "PolicyStore"]

COMPONENT = "policies"
MIGRATIONS = load_migrations("api.broker", COMPONENT)


class PolicyStore:
    """The policies kept in ``database`` (whose policy table it brings up to date)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        database.register(COMPONENT, MIGRATIONS, topic_tables=(TopicTable("policies", "scope"),))

    def set_policy(self, scope: str, name: str, value: Any) -> None:
        """Set policy ``name`` of ``scope`` (a topic or ``tenant/namespace``) to ``value``."""
        with self.database.transaction("policies.set", scope=scope, name=name) as db:
            db.execute(
                "INSERT OR REPLACE INTO policies (scope, name, value) VALUES (?, ?, ?)",
                (scope, name, json.dumps(value)),
            )

    def get_policy(self, scope: str, name: str) -> Any | None:
        """The value of policy ``name`` of ``scope``, or None when unset. A partition
        (``t-partition-3``) without its own value has its parent's (``t``)."""
        for candidate in policy_scopes(scope) if scope.startswith("persistent://") else (scope,):
            rows = self.database.query("SELECT value FROM policies WHERE scope = ? AND name = ?", (candidate, name))
            if rows:
                return json.loads(rows[0][0])
        return None

    def remove_policy(self, scope: str, name: str) -> bool:
        """Unset policy ``name`` of ``scope``; False when it was not set."""
        with self.database.transaction("policies.remove", scope=scope, name=name) as db:
            return db.execute("DELETE FROM policies WHERE scope = ? AND name = ?", (scope, name)).rowcount == 1
