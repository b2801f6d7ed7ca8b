BEGIN TRANSACTION;
CREATE TABLE compacted_garbage (
        ledger_id INTEGER PRIMARY KEY,
        topic TEXT NOT NULL,
        delete_after_ms INTEGER NOT NULL
    );
CREATE TABLE compacted_manifest (
        topic TEXT NOT NULL,
        seq INTEGER NOT NULL,
        ledger_id INTEGER NOT NULL, in_bucket INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (topic, seq)
    );
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
CREATE TABLE compaction_status (
        topic TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        last_error TEXT NOT NULL DEFAULT '',
        updated_at_ms INTEGER NOT NULL
    );
CREATE TABLE counters (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );
CREATE TABLE cursor_properties (
        topic TEXT NOT NULL,
        cursor TEXT NOT NULL,
        key TEXT NOT NULL,
        value INTEGER NOT NULL,
        PRIMARY KEY (topic, cursor, key)
    );
CREATE TABLE cursors (
        topic TEXT NOT NULL,
        name TEXT NOT NULL,
        mark_delete_ledger_id INTEGER NOT NULL,
        mark_delete_entry_id INTEGER NOT NULL,
        individually_deleted TEXT NOT NULL,
        last_active_ms INTEGER NOT NULL,
        PRIMARY KEY (topic, name)
    );
CREATE TABLE ledgers (
        ledger_id INTEGER PRIMARY KEY,
        topic TEXT NOT NULL,
        role TEXT NOT NULL,
        entries INTEGER NOT NULL DEFAULT 0,
        size_bytes INTEGER NOT NULL DEFAULT 0,
        created_at_ms INTEGER NOT NULL,
        closed_at_ms INTEGER NOT NULL DEFAULT 0
    , offloaded_at_ms INTEGER NOT NULL DEFAULT 0, local_deleted_at_ms INTEGER NOT NULL DEFAULT 0);
CREATE TABLE namespaces (
        name TEXT PRIMARY KEY,
        tenant TEXT NOT NULL
    );
INSERT INTO "namespaces" VALUES('public/default','public');
CREATE TABLE partitioned_topics (
        name TEXT PRIMARY KEY,
        partitions INTEGER NOT NULL CHECK (partitions > 0),
        created_at_ms INTEGER NOT NULL
    );
CREATE TABLE permissions (
        scope TEXT NOT NULL,
        role TEXT NOT NULL,
        actions TEXT NOT NULL,
        PRIMARY KEY (scope, role)
    );
CREATE TABLE policies (
        scope TEXT NOT NULL,
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (scope, name)
    );
CREATE TABLE schema_versions (
        component TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    );
INSERT INTO "schema_versions" VALUES('ledger',3);
INSERT INTO "schema_versions" VALUES('cursor',1);
INSERT INTO "schema_versions" VALUES('compacted_manifest',3);
INSERT INTO "schema_versions" VALUES('compaction',1);
INSERT INTO "schema_versions" VALUES('policies',1);
INSERT INTO "schema_versions" VALUES('permissions',1);
INSERT INTO "schema_versions" VALUES('schemas',1);
INSERT INTO "schema_versions" VALUES('partitioned_topics',1);
INSERT INTO "schema_versions" VALUES('tenants',1);
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
CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        info TEXT NOT NULL
    );
INSERT INTO "tenants" VALUES('public','{"adminRoles": [], "allowedClusters": ["standalone"]}');
CREATE TABLE topic_tables (
        table_name TEXT PRIMARY KEY,
        component TEXT NOT NULL,
        topic_column TEXT NOT NULL,
        hold_ledger_column TEXT NOT NULL DEFAULT '',
        hold_entry_column TEXT NOT NULL DEFAULT ''
    );
INSERT INTO "topic_tables" VALUES('cursors','cursor','topic','mark_delete_ledger_id','mark_delete_entry_id');
INSERT INTO "topic_tables" VALUES('cursor_properties','cursor','topic','','');
INSERT INTO "topic_tables" VALUES('compacted_manifest','compacted_manifest','topic','','');
INSERT INTO "topic_tables" VALUES('compacted_marks','compacted_manifest','topic','','');
INSERT INTO "topic_tables" VALUES('compaction_status','compaction','topic','','');
INSERT INTO "topic_tables" VALUES('policies','policies','scope','','');
INSERT INTO "topic_tables" VALUES('permissions','permissions','scope','','');
INSERT INTO "topic_tables" VALUES('schemas','schemas','topic','','');
CREATE TABLE topics (
        name TEXT PRIMARY KEY,
        created_at_ms INTEGER NOT NULL
    );
CREATE INDEX ledgers_by_topic ON ledgers (topic, role, ledger_id)
    ;
COMMIT;
PRAGMA user_version = 4;
