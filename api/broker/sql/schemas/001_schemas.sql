-- schema versions per base topic.
CREATE TABLE schemas (
    topic TEXT NOT NULL,
    version INTEGER NOT NULL,
    type INTEGER NOT NULL,
    data BLOB NOT NULL,
    properties TEXT NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, version)
);
