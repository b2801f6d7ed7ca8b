-- the last compaction status of each topic.
CREATE TABLE compaction_status (
    topic TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    last_error TEXT NOT NULL DEFAULT '',
    updated_at_ms INTEGER NOT NULL
);
