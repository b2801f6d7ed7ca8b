-- offload (issue 29): when the bucket copy was verified, when the local copy went.
ALTER TABLE ledgers ADD COLUMN offloaded_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ledgers ADD COLUMN local_deleted_at_ms INTEGER NOT NULL DEFAULT 0;
