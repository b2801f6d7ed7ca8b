-- parents and their number of partitions.
CREATE TABLE partitioned_topics (
    name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL CHECK (partitions > 0),
    created_at_ms INTEGER NOT NULL
);
