-- durable cursors with their properties.
CREATE TABLE cursors (
    topic TEXT NOT NULL,
    name TEXT NOT NULL,
    mark_delete_ledger_id INTEGER NOT NULL,
    mark_delete_entry_id INTEGER NOT NULL,
    individually_deleted TEXT NOT NULL,
    last_active_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, name)
);
CREATE TABLE cursor_properties (
    topic TEXT NOT NULL,
    cursor TEXT NOT NULL,
    key TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (topic, cursor, key)
);
