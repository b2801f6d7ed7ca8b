"""The JSON shapes of the admin REST API: the only place pydantic models live (STYLE P10).

Answers keep Pulsar's field names (camelCase), so that what reads a Pulsar broker's admin
JSON reads compactd's. Policy values are validated at the edge (``api.routers.policies``,
by ``PolicySpec.kind``); the core stores what it is given.

* ``ErrorBody`` — every 4xx and 5xx answer: Pulsar's ``{"reason": "…"}``.
* ``CompactionStatus`` — Pulsar's ``LongRunningProcessStatus``.
* ``OffloadRequest``, ``OffloadProcessStatus`` — ``PUT``/``GET …/offload``.
* ``TopicStats``, ``InternalStats`` — the fields of Pulsar's topic stats and internal stats
  that compactd fills.
* ``POLICIES`` — each policy's name, value type (with its bounds) and description.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from api.schema_names import SchemaStrategyName

__all__ = [
    "JAVA_LONG_MAX",
    "JAVA_LONG_MIN",
    "POLICIES",
    "CompactedLedgerInfo",
    "CompactionSection",
    "CompactionStatus",
    "CursorInternalStats",
    "ErrorBody",
    "InternalStats",
    "LedgerInternalInfo",
    "MessageIdData",
    "OffloadProcessStatus",
    "OffloadRequest",
    "PolicySpec",
    "PublisherStats",
    "ResetCursorData",
    "SchemaInfo",
    "SchemaStrategyName",
    "SchemaTypeName",
    "SchemaUpload",
    "SchemaVersion",
    "SubscriptionStats",
    "TopicStats",
]

# Pulsar keeps these policies in Java ``long``s; a larger value is refused here rather than
# accepted and later misread by a Pulsar tool (or overflowing SQLite's 64-bit integers).
JAVA_LONG_MAX = 2**63 - 1
JAVA_LONG_MIN = -(2**63)



class ErrorBody(BaseModel):
    """Pulsar's error answer."""

    reason: str = Field(description="What was wrong, naming the bad value.")


class CompactionStatus(BaseModel):
    """The state of the topic's last or current compaction run (persisted across restarts)."""

    status: Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"] = Field(
        description="NOT_RUN (never triggered), RUNNING, SUCCESS or ERROR.")
    lastError: str = Field(description="The error of the last run when it failed; empty otherwise.")


class _Open(BaseModel):
    """Pulsar's stats carry more fields than compactd fills; extra ones are allowed."""

    model_config = ConfigDict(extra="allow")


class CompactionSection(_Open):
    lastCompactionRemovedEventCount: int = Field(description="Entries the last successful run removed.")
    lastCompactionSucceedTimestamp: int = Field(description="End of the last successful run, ms since epoch; 0 if none.")
    lastCompactionFailedTimestamp: int = Field(description="End of the last failed run, ms since epoch; 0 if none.")
    lastCompactionDurationTimeInMills: int = Field(description="Duration of the last run, ms.")


class ConsumerStats(_Open):
    consumerName: str
    msgRateOut: float = Field(0.0, description="Messages a second sent to it, over the last 10 s.")
    msgThroughputOut: float = Field(0.0, description="Bytes a second sent to it, over the last 10 s.")
    msgOutCounter: int = Field(0, description="Messages sent to it since it connected.")
    bytesOutCounter: int = Field(0, description="Bytes sent to it since it connected.")


class PublisherStats(_Open):
    producerName: str
    producerId: int
    msgRateIn: float = Field(description="Messages a second it stored, over the last 10 s.")
    msgThroughputIn: float = Field(description="Bytes a second it stored, over the last 10 s.")


class SubscriptionStats(_Open):
    msgRateOut: float = Field(0.0, description="Messages a second dispatched, over the last 10 s.")
    msgThroughputOut: float = Field(0.0, description="Bytes a second dispatched, over the last 10 s.")
    msgOutCounter: int = Field(0, description="Messages dispatched since the topic was loaded.")
    bytesOutCounter: int = Field(0, description="Bytes dispatched since the topic was loaded.")
    msgBacklog: int = Field(description="Entries not yet acknowledged.")
    backlogSize: int = Field(description="Estimated bytes not yet acknowledged.")
    type: str = Field(description="Exclusive, Shared or Failover.")
    isDurable: bool
    consumers: list[ConsumerStats]


class TopicStats(_Open):
    """Pulsar's ``TopicStats``, with the compaction section."""

    msgInCounter: int = Field(description="Messages stored since the topic was loaded (a batch counts "
                              "its messages).")
    bytesInCounter: int = Field(0, description="Bytes stored since the topic was loaded.")
    msgRateIn: float = Field(0.0, description="Messages a second stored, over the last 10 s.")
    msgThroughputIn: float = Field(0.0, description="Bytes a second stored, over the last 10 s.")
    msgOutCounter: int = Field(0, description="Messages dispatched since the topic was loaded.")
    bytesOutCounter: int = Field(0, description="Bytes dispatched since the topic was loaded.")
    msgRateOut: float = Field(0.0, description="Messages a second dispatched, over the last 10 s.")
    msgThroughputOut: float = Field(0.0, description="Bytes a second dispatched, over the last 10 s.")
    storageSize: int = Field(description="Bytes stored for the topic.")
    offloadedStorageSize: int = Field(0, description="Bytes of the topic's ledgers offloaded to the bucket.")
    publishers: list[PublisherStats] = Field(description="The connected producers.")
    subscriptions: dict[str, SubscriptionStats]
    compaction: CompactionSection


class LedgerInternalInfo(_Open):
    ledgerId: int
    entries: int
    size: int
    offloaded: bool = Field(False, description="Its offload to the bucket completed (Pulsar's offloadContext.complete).")


class CursorInternalStats(_Open):
    markDeletePosition: str = Field(description='"ledgerId:entryId".')
    readPosition: str = Field(description='"ledgerId:entryId".')
    properties: dict[str, int] = Field(description="Cursor properties, e.g. CompactedTopicLedger.")


class CompactedLedgerInfo(_Open):
    """Pulsar's compacted ``LedgerInfo``; with a view, compactd adds ``ledgers``: each of its
    ledgers (``ledgerId``, ``entries``, ``size``) in stream order."""

    ledgerId: int = Field(description="The compacted ledger (a view of several: the first); -1 when there is none.")
    entries: int = Field(description="Its entries (a view of several ledgers: all of them); -1 when there is none.")
    size: int = Field(description="Its bytes (a view of several ledgers: all of them); -1 when there is none.")


class InternalStats(_Open):
    """Pulsar's ``PersistentTopicInternalStats``."""

    entriesAddedCounter: int
    numberOfEntries: int
    totalSize: int
    ledgers: list[LedgerInternalInfo]
    cursors: dict[str, CursorInternalStats]
    compactedLedger: CompactedLedgerInfo


class MessageIdData(_Open):
    """Pulsar's ``MessageIdImpl`` (``batchIndex`` for a message of a batch)."""

    ledgerId: int
    entryId: int
    partitionIndex: int = -1


class OffloadRequest(BaseModel):
    """Pulsar's ``MessageIdImpl`` as ``PUT …/offload`` takes it: offload every sealed ledger
    before ``ledgerId`` (other fields a Pulsar client sends are ignored)."""

    model_config = ConfigDict(extra="ignore")

    ledgerId: StrictInt = Field(ge=-1, le=JAVA_LONG_MAX, description="Ledger of the message: "
                                "every sealed ledger before it is offloaded.")
    entryId: StrictInt = Field(ge=-1, le=JAVA_LONG_MAX, description="Entry of the message (only its validity matters).")
    partitionIndex: StrictInt = Field(-1, description="Ignored.")


class OffloadProcessStatus(BaseModel):
    """Pulsar's ``OffloadProcessStatus``: the topic's last admin-triggered offload (in memory:
    NOT_RUN after the broker loaded the topic)."""

    status: Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR"] = Field(
        description="NOT_RUN (none since the topic was loaded), RUNNING, SUCCESS or ERROR.")
    lastError: str = Field(description="Why the offload failed (ERROR); empty otherwise.")
    firstUnoffloadedMessage: MessageIdData = Field(
        description="SUCCESS: the first ledger not offloaded, entry 0; otherwise earliest (-1:-1).")


class ResetCursorData(BaseModel):
    """Pulsar's ``ResetCursorData``: where ``resetcursor`` moves a subscription."""

    ledgerId: int = Field(ge=-1, le=JAVA_LONG_MAX, description="Ledger of the message to reset to.")
    entryId: int = Field(ge=-1, le=JAVA_LONG_MAX, description="Entry of the message to reset to.")
    isExcluded: bool = Field(False, description="Start just after that message rather than at it.")
    partitionIndex: int = Field(-1, description="-1: compactd has no partitioned topics here.")
    batchIndex: int = Field(-1, description="Ignored: a reset starts at the entry.")


class PolicySpec(NamedTuple):
    """One compaction policy as the API exposes it."""

    name: str
    # a JSON integer in [0, JAVA_LONG_MAX], one in [JAVA_LONG_MIN, JAVA_LONG_MAX] (negative: off),
    # a number in [0, 1], true/false
    kind: Literal["long", "signed", "ratio", "bool"]
    summary: str
    description: str


POLICIES = (
    PolicySpec(
        "compactionThreshold", "long", "compaction threshold (bytes)",
        "Backlog of the `__compaction` subscription, in bytes, past which the scheduler "
        "starts a compaction run; 0 turns it off (Pulsar's policy). A JSON integer >= 0.",
    ),
    PolicySpec(
        "minCleanableDirtyRatio", "ratio", "minimum cleanable dirty ratio",
        "Beyond Pulsar (Kafka's min.cleanable.dirty.ratio): a run is started only when the "
        "uncompacted share of the topic is at least this. A JSON number from 0 to 1.",
    ),
    PolicySpec(
        "maxCompactionLagMs", "long", "maximum compaction lag (ms)",
        "Beyond Pulsar (Kafka's max.compaction.lag.ms): a run is started once the oldest "
        "uncompacted message is this old, whatever the threshold. A JSON integer >= 0.",
    ),
    PolicySpec(
        "minCompactionLagMs", "long", "minimum compaction lag (ms)",
        "Beyond Pulsar (Kafka's min.compaction.lag.ms): a run never compacts a message "
        "published less than this long ago; its horizon stops before the first such message "
        "(else --compaction-min-lag-ms). A JSON integer >= 0.",
    ),
    PolicySpec(
        "compactionMaxBytesPerSecond", "long", "compaction I/O limit (bytes/s)",
        "Beyond Pulsar (Kafka's log.cleaner.io.max.bytes.per.second): a run's reads and writes "
        "are throttled to this many bytes a second; 0 is unlimited (else "
        "--compaction-max-bytes-per-second). A JSON integer >= 0.",
    ),
    PolicySpec(
        "deleteRetentionMs", "long", "tombstone retention (ms)",
        "Beyond Pulsar (Kafka's delete.retention.ms): how long a tombstone stays in the "
        "compacted view before a run drops it. A JSON integer >= 0.",
    ),
    PolicySpec(
        "deduplicationEnabled", "bool", "message de-duplication",
        "Pulsar's message de-duplication: a producer's re-send of a message already stored "
        "is acknowledged with the stored message's id and not stored again. Off unless "
        "enabled (topic policy, else namespace policy, else --broker-deduplication-enabled). "
        "JSON true or false.",
    ),
    PolicySpec(
        "offloadThreshold", "signed", "offload threshold (bytes)",
        "Pulsar's offloadThreshold: bytes of the topic's newest ledgers kept on local disk; at "
        "each roll-over, older sealed ledgers are offloaded to the bucket, oldest first. 0 "
        "offloads every sealed ledger; negative turns automatic offload off (else "
        "--managed-ledger-offload-threshold-in-bytes). A JSON integer. Set with POST or PUT.",
    ),
    PolicySpec(
        "offloadDeletionLagMs", "signed", "offload deletion lag (ms)",
        "Pulsar's offloadDeletionLagMs: how long after its offload a ledger's local copy is "
        "deleted (reads then go to the bucket); negative keeps local copies (else "
        "--managed-ledger-offload-deletion-lag-ms). A JSON integer. Set with POST or PUT.",
    ),
)


# -- schemas (api.routers.schemas) ---------------------------------------------------------

SchemaTypeName = Literal[
    "NONE", "STRING", "JSON", "PROTOBUF", "AVRO", "BOOLEAN", "INT8", "INT16", "INT32", "INT64", "FLOAT",
    "DOUBLE", "DATE", "TIME", "TIMESTAMP", "KEY_VALUE", "INSTANT", "LOCAL_DATE", "LOCAL_TIME",
    "LOCAL_DATE_TIME", "PROTOBUF_NATIVE",
]
"""Pulsar's ``SchemaType`` names (``api.broker.schemas.TYPE_NAMES``)."""



class SchemaInfo(BaseModel):
    """Pulsar's ``GetSchemaResponse``: one version of a topic's schema."""

    version: int = Field(description="The version, from 0.")
    type: str = Field(description="Pulsar's schema type name, e.g. `JSON`.")
    timestamp: int = Field(description="When the version was registered (ms since the epoch).")
    data: str = Field(description="The schema definition (for AVRO and JSON, the Avro record as JSON).")
    properties: dict[str, str] = Field(description="The schema's properties.")


class SchemaUpload(BaseModel):
    """Pulsar's ``PostSchemaPayload``: a schema to register."""

    model_config = ConfigDict(extra="forbid")

    type: SchemaTypeName = Field(description="Pulsar's schema type name.")
    schema_: str = Field(alias="schema", description="The schema definition (for AVRO and JSON, an Avro record); "
                         "UTF-8 text of at most `--schema-max-size-bytes` bytes.")
    properties: dict[str, str] = Field(default_factory=dict, description="The schema's properties.")

    @field_validator("schema_")
    @classmethod
    def _schema_is_text(cls, value: str) -> str:
        return _text(value)

    @field_validator("properties")
    @classmethod
    def _properties_are_text(cls, value: dict[str, str]) -> dict[str, str]:
        for key, each in value.items():
            _text(key)
            _text(each)
        return value


def _text(value: str) -> str:
    """``value`` when it is Unicode text: a JSON string may escape a lone surrogate
    (``"\\udcff"``), which no UTF-8 can carry, so it is refused here, at the edge."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        lone = ascii(error.object[error.start:error.end])
        raise ValueError(f"holds a lone surrogate {lone} at character {error.start}: not text") from None
    return value


class SchemaVersion(BaseModel):
    """The version an upload registered (or found), or the last one a delete marked."""

    version: int = Field(description="The schema version.")
