"""Produce/consume grants to roles, persisted on the shared metadata database.

``GrantStore`` owns the ``permissions`` component of ``ledger.database.Database``: one row
per (scope, role) naming the actions granted, where a scope is a namespace
(``tenant/namespace``) or a topic (``persistent://tenant/namespace/topic``). A topic's
grants are declared as the topic's rows, so deleting the topic removes them. Writes are the
named transactions ``permissions.grant`` and ``permissions.revoke``.

Actions are Pulsar's ``AuthAction`` names that compactd enforces: ``produce`` and
``consume`` (``functions``, ``sources``, ``sinks``, ``packages`` are refused: compactd
serves none of them).
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger.database import Database, TopicTable, load_migrations

__all__ = ["ACTIONS", "COMPONENT", "MIGRATIONS", "GrantStore", "InvalidActionError", "check_actions"]

COMPONENT = "permissions"
ACTIONS = ("produce", "consume")
MIGRATIONS = load_migrations("api.broker", COMPONENT)


class InvalidActionError(ValueError):
    """An action that is not one of ``ACTIONS``; the message names it."""


def check_actions(actions: Iterable[str]) -> frozenset[str]:
    """The set of ``actions``, each one of ``ACTIONS``; ``InvalidActionError`` otherwise."""
    checked = frozenset(actions)
    for action in sorted(checked):
        if action not in ACTIONS:
            raise InvalidActionError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    return checked


class GrantStore:
    """The grants kept in ``database`` (whose ``permissions`` table it brings up to date)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        database.register(COMPONENT, MIGRATIONS, topic_tables=(TopicTable("permissions", "scope"),))

    def grant(self, scope: str, role: str, actions: Iterable[str]) -> None:
        """Grant ``role`` exactly ``actions`` on ``scope`` (replacing what it had there)."""
        checked = check_actions(actions)
        with self.database.transaction("permissions.grant", scope=scope, role=role) as db:
            db.execute("INSERT OR REPLACE INTO permissions (scope, role, actions) VALUES (?, ?, ?)",
                       (scope, role, ",".join(sorted(checked))))

    def revoke(self, scope: str, role: str) -> bool:
        """Take every action of ``role`` on ``scope`` away; False when it had none there."""
        with self.database.transaction("permissions.revoke", scope=scope, role=role) as db:
            return db.execute("DELETE FROM permissions WHERE scope = ? AND role = ?", (scope, role)).rowcount == 1

    def of_scope(self, scope: str) -> dict[str, list[str]]:
        """Role -> sorted actions granted on ``scope`` (Pulsar's ``permissions`` answer)."""
        rows = self.database.query("SELECT role, actions FROM permissions WHERE scope = ? ORDER BY role", (scope,))
        return {str(role): str(actions).split(",") if actions else [] for role, actions in rows}

    def actions_of(self, role: str, scopes: Iterable[str]) -> frozenset[str]:
        """Every action ``role`` holds on any of ``scopes``."""
        found: set[str] = set()
        for scope in scopes:
            rows = self.database.query("SELECT actions FROM permissions WHERE scope = ? AND role = ?", (scope, role))
            for (actions,) in rows:
                found.update(part for part in str(actions).split(",") if part)
        return frozenset(found)
