-- per ledger of a view, its dead marks (compactor.view.marks).
CREATE TABLE compacted_marks (
    topic TEXT NOT NULL,
    ledger_id INTEGER NOT NULL,
    entries INTEGER NOT NULL,
    messages INTEGER NOT NULL,
    keys INTEGER NOT NULL,
    dead_messages INTEGER NOT NULL,
    dead_keys INTEGER NOT NULL,
    dead_entries BLOB NOT NULL,
    dead_slots BLOB NOT NULL,
    PRIMARY KEY (topic, ledger_id)
);
