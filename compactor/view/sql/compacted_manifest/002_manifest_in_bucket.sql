-- where each manifest ledger was written (1: in the object store's bucket).
ALTER TABLE compacted_manifest ADD COLUMN in_bucket INTEGER NOT NULL DEFAULT 0;
