-- named counters that must never repeat across restarts (the broker instance id).
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
