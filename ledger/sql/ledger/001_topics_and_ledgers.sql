-- topics and their ledgers.
CREATE TABLE topics (
    name TEXT PRIMARY KEY,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE ledgers (
    ledger_id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    role TEXT NOT NULL,
    entries INTEGER NOT NULL DEFAULT 0,
    size_bytes INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL,
    closed_at_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX ledgers_by_topic ON ledgers (topic, role, ledger_id);
