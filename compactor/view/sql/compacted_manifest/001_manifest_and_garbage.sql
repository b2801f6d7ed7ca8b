-- each topic's compacted ledgers in stream order; replaced ones awaiting deletion.
CREATE TABLE compacted_manifest (
    topic TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ledger_id INTEGER NOT NULL,
    PRIMARY KEY (topic, seq)
);
CREATE TABLE compacted_garbage (
    ledger_id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    delete_after_ms INTEGER NOT NULL
);
