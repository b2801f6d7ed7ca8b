"""The compacted view: format, horizon, ceiling search, reads, last message id, restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactor.errors import CompactedLedgerMissingError, CompactorError
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.reader import NO_MESSAGE, CompactedReader, last_message_id
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
from compactor.view.view import (
    CompactedEntry,
    CompactedView,
    decode_compacted_entry,
    encode_compacted_entry,
)
from cursor import CursorStore, ManagedCursor
from ledger import DataDir, ManagedLedger, ManagedLedgerConfig, MemoryLedgerStore, MetadataStore
from ledger.errors import LedgerNotFoundError
from ledger.position import EARLIEST, Position
from message.encoder import encode_batch, encode_entry
from message.entry import iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/view"


def message(key: str | None, value: bytes, sequence_id: int = 0) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    return encode_entry(metadata, value, with_checksum=False)


def batch(pairs: list[tuple[str | None, bytes]]) -> bytes:
    template = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    slots = []
    for key, value in pairs:
        single = pb.SingleMessageMetadata()
        if key is not None:
            single.partition_key = key
        slots.append((single, value))
    return encode_batch(template, slots, pb.ZSTD, with_checksum=False)


def values(entries: list[CompactedEntry]) -> list[tuple[str | None, bytes]]:
    """What a client honouring ack_set receives."""
    out = []
    for entry in entries:
        for m in iter_messages(parse_entry(entry.data)):
            if entry.batch_size == 0 or m.batch_index in entry.surviving:
                out.append((m.key, m.payload))
    return out


@pytest.fixture
def ml() -> ManagedLedger:
    return ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                              ManagedLedgerConfig(max_entries_per_ledger=3))


def append(ml: ManagedLedger, *datas: bytes) -> list[Position]:
    return [ml.append(d).result(timeout=10) for d in datas]


def test_compacted_entry_round_trip_keeps_id_and_surviving_mask() -> None:
    for entry in (
        CompactedEntry(Position(7, 3), b"abc"),
        CompactedEntry(Position(7, 4), b"batch", batch_size=70, surviving=(0, 5, 63, 64, 69)),
    ):
        assert decode_compacted_entry(encode_compacted_entry(entry)) == entry
    id_size = int.from_bytes(encode_compacted_entry(CompactedEntry(Position(7, 4), b"x", 3, (1,)))[:4], "big")
    stored = pb.MessageIdData.FromString(encode_compacted_entry(CompactedEntry(Position(7, 4), b"x", 3, (1,)))[4:4 + id_size])
    assert (stored.ledgerId, stored.entryId, stored.batch_size, list(stored.ack_set)) == (7, 4, 3, [0b10])


def test_view_search_reads_and_last_message(ml: ManagedLedger) -> None:
    positions = append(ml, *(message(f"k{i}", b"v%d" % i) for i in range(10)),
                       batch([("k0", b"new0"), ("k1", b""), ("k2", b"new2")]))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    view = topic.view
    assert view is not None and view.horizon == positions[-1]
    kept = [e.position for e in view.iter_all()]
    assert kept == positions[3:]  # k0..k2 were superseded by the batch
    assert view.find_start(EARLIEST) == 0
    assert view.find_start(positions[5]) == 2
    assert view.find_start(positions[1]) == 0  # a compacted-out position resolves to the next survivor
    assert view.find_start(Position(positions[-1].ledger_id, positions[-1].entry_id + 1)) is None
    assert [e.position for e in view.read_from(positions[4], 3)] == positions[4:7]
    assert view.last_message_id() == positions[-1].with_batch_index(2)
    assert values(view.read_from(positions[-1], 1)) == [("k0", b"new0"), ("k2", b"new2")]
    assert last_message_id(topic) == positions[-1].with_batch_index(2)


def test_read_compacted_then_raw_tail_and_first_read_rule(ml: ManagedLedger) -> None:
    append(ml, message("a", b"1"), message("b", b"1"), message("a", b"2"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    tail = append(ml, message("a", b"3"))
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", EARLIEST), from_earliest=True)
    got = reader.read(10)
    assert values(got) == [("b", b"1"), ("a", b"2")]
    assert [e.position for e in reader.read(10)] == tail  # then the raw tail
    # a durable subscription at earliest whose raw ledgers were trimmed still gets the compacted data
    ml.trim()
    sub = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "late", EARLIEST), from_earliest=True)
    assert values(sub.read(10)) == [("b", b"1"), ("a", b"2")]


def test_read_between_last_survivor_and_horizon_goes_to_the_raw_tail(ml: ManagedLedger) -> None:
    positions = append(ml, message("a", b"1"), message("b", b"1"), message("b", b""))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    tail = append(ml, message("c", b"1"))
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", positions[2]))  # after the last
    # survivor, at the horizon: the view has nothing there, the raw tail past the horizon is read
    assert [e.position for e in reader.read(10)] == tail


def test_last_message_id_rules(ml: ManagedLedger) -> None:
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    assert last_message_id(topic).entry_id == -1  # empty, never compacted
    positions = append(ml, message("a", b"1"), message("a", b""))
    Compactor().compact(topic)
    assert topic.view is not None and topic.view.entries == 0  # all keys deleted: empty ledger published
    assert last_message_id(topic) == NO_MESSAGE
    later = append(ml, batch([("b", b"1"), ("c", b"2")]))
    assert positions and last_message_id(topic) == later[0].with_batch_index(1)  # raw tail past the horizon


def test_empty_topic_writes_no_ledger_and_succeeds(ml: ManagedLedger) -> None:
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    figures = Compactor().compact(topic)
    assert figures.ledger_id == -1
    assert topic.view is None
    assert topic.record.successes == 1
    assert ml.store.list() == [ml.current_ledger_id]


def test_restore_from_cursor_properties_and_missing_ledger(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path))
    ml = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    append(ml, message("a", b"1"), message("b", b"2"), message("a", b"3"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    assert topic.view is not None
    ledger_id = topic.view.ledger_id
    record = CursorStore(data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION)
    assert record is not None and record.properties == {COMPACTED_TOPIC_LEDGER: ledger_id}
    ml.close()
    data_dir.close()

    data_dir = DataDir.open(str(tmp_path))
    assert collect_orphans(data_dir) == []
    ml = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    restored = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    assert restored.view is not None and restored.view.ledger_id == ledger_id
    assert restored.horizon == record.mark_delete_position
    data_dir.ledgers.delete(ledger_id)  # deleted out of band
    broken = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    reader = CompactedReader(broken, ManagedCursor.open_non_durable(ml, "r", EARLIEST))
    with pytest.raises(CompactedLedgerMissingError, match=f"compacted ledger {ledger_id}"):
        reader.read(10)
    with pytest.raises(CompactedLedgerMissingError):
        Compactor().compact(broken)
    assert len(ManagedCursor.open_non_durable(ml, "raw", EARLIEST).read_entries(10)) == 3  # raw reads work
    broken.drop_view()
    Compactor().compact(broken)  # rebuilt from the raw topic
    assert values(list(broken.view.iter_all())) == [("b", b"2"), ("a", b"3")]
    data_dir.close()


def test_a_run_does_not_publish_over_a_view_another_run_published_meanwhile(ml: ManagedLedger) -> None:
    """One run per topic is the executor's rule (``compactor.runs.runs``); a direct second run
    that overlaps still cannot replace the view it did not start from."""
    append(ml, message("a", b"1"), message("a", b"2"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    before = ml.store.list()
    inner: list[int] = []

    def progress(phase: str, _done: int, _total: int) -> None:
        if phase == "phase-two" and not inner:  # the outer run's ledger exists now
            inner.append(Compactor().compact(topic).ledger_id)

    with pytest.raises(CompactorError, match="view changed during the run"):
        Compactor().compact(topic, progress=progress)
    assert topic.view is not None and topic.view.ledger_id == inner[0]
    assert ml.store.list() == sorted([*before, inner[0]])  # the outer run deleted its ledger
    assert topic.cursor.properties == {COMPACTED_TOPIC_LEDGER: inner[0]}


def test_a_run_does_not_bring_back_a_subscription_deleted_under_it(ml: ManagedLedger) -> None:
    append(ml, message("a", b"1"), message("b", b"2"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database), create_cursor=True)
    before = ml.store.list()
    dropped: list[bool] = []

    def progress(phase: str, _done: int, _total: int) -> None:
        if phase == "phase-two" and not dropped:
            dropped.append(True)
            topic.drop_view()

    with pytest.raises(CompactorError, match="subscription was deleted during the run"):
        Compactor().compact(topic, progress=progress)
    assert topic.view is None
    assert CursorStore(ml.metadata.database).load(TOPIC, COMPACTION_SUBSCRIPTION) is None
    assert ml.store.list() == before  # its compacted ledger deleted: nothing left behind


def test_a_published_view_is_an_immutable_value(ml: ManagedLedger) -> None:
    append(ml, message("a", b"1"), message("a", b"2"), message("b", b"3"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    figures = Compactor().compact(topic)
    view = topic.view
    assert view is not None
    assert (view.ledger_id, view.entries, view.size) == (figures.ledger_id, 2, figures.bytes_written)
    assert view.horizon == ml.last_confirmed_position()
    with pytest.raises(AttributeError, match="immutable"):
        view.horizon = Position(0, 0)
    append(ml, message("c", b"4"))
    Compactor().compact(topic)
    assert topic.view is not view and view.entries == 2  # swapped whole; the old value unchanged


def test_record_counts_runs(ml: ManagedLedger) -> None:
    append(ml, message("a", b"1"), message("a", b"2"), message("b", b"1"), message(None, b"x"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    figures = Compactor(CompactionConfig(retain_null_key=False)).compact(topic)
    record = topic.record
    assert figures.removed_events == 2 and record.last_removed_events == 2
    assert figures.messages_read == 4 and figures.entries_written == 2
    assert record.successes == 1 and record.failures == 0 and record.last_success_ms > 0
    assert record.compacted_entries == 2 and record.compacted_size_bytes == figures.bytes_written > 0
    assert record.bytes_read == figures.bytes_read > 0
    append(ml, message("b", b""))
    Compactor().compact(topic)
    assert record.total_removed_events == 4 and record.successes == 2  # the tombstone and b's value
    assert record.last_run is not None and record.last_run.key_map_bytes == 24
    topic.view.store.delete(topic.view.ledger_id)  # type: ignore[union-attr]
    append(ml, message("c", b"1"))
    with pytest.raises(LedgerNotFoundError):
        Compactor().compact(topic)
    assert record.failures == 1 and record.last_failure_ms > 0 and record.last_error


def test_compacted_ledger_metadata(ml: ManagedLedger) -> None:
    positions = append(ml, message("a", b"1"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    assert topic.view is not None
    metadata = dict(ml.store.info(topic.view.ledger_id).metadata)
    assert metadata["component"] == "compacted-ledger"
    assert metadata["topic"] == TOPIC
    assert metadata["compactedTo"] == str(positions[-1])
    assert ml.store.info(topic.view.ledger_id).sealed
    assert isinstance(topic.view, CompactedView)


def published_at(key: str, value: bytes, publish_time_ms: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_time_ms,
                                  partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def test_delete_retention_keeps_a_young_tombstone_until_a_later_run_finds_it_old(ml: ManagedLedger) -> None:
    """The run's cut-off is its clock's now − ``delete_retention_ms``; 0 is Pulsar's drop."""
    now = [100.0]  # seconds, the runner's clock
    compactor = Compactor(clock=lambda: now[0])
    append(ml, published_at("k", b"v", 90_000), published_at("k", b"", 99_000), published_at("j", b"1", 99_000))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    compactor.compact(topic, delete_retention_ms=5_000)  # cut-off 95 s: the tombstone is young
    kept = list(topic.view.iter_all())  # type: ignore[union-attr]
    assert values(kept) == [("k", b""), ("j", b"1")]
    now[0] = 110.0
    append(ml, published_at("j", b"2", 109_000))
    compactor.compact(topic, delete_retention_ms=5_000)  # cut-off 105 s: now it is old
    assert values(list(topic.view.iter_all())) == [("j", b"2")]  # type: ignore[union-attr]


def test_delete_retention_zero_drops_tombstones_at_once(ml: ManagedLedger) -> None:
    append(ml, published_at("k", b"v", 1), published_at("k", b"", 2))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor(clock=lambda: 0.0).compact(topic, delete_retention_ms=0)  # even "from the future"
    assert list(topic.view.iter_all()) == []  # type: ignore[union-attr]


def test_progress_reports_both_phases_up_to_the_entries_read(ml: ManagedLedger) -> None:
    append(ml, *(message(f"k{i % 3}", b"v") for i in range(7)))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    calls: list[tuple[str, int, int]] = []
    Compactor(CompactionConfig(read_batch_entries=2)).compact(topic, progress=lambda *call: calls.append(call))
    for phase in ("phase-one", "phase-two"):
        seen = [(done, total) for name, done, total in calls if name == phase]
        assert seen[0] == (0, 7) and seen[-1] == (7, 7)
        assert [done for done, _ in seen] == sorted(done for done, _ in seen)  # never goes back
    assert [name for name, _, _ in calls] == sorted(name for name, _, _ in calls)  # one phase, then the other
    append(ml, message("k0", b"w"))
    calls.clear()
    Compactor().compact(topic, progress=lambda *call: calls.append(call), rewrite=True)
    assert calls[-1] == ("phase-two", 4, 4)  # a full rewrite: 3 compacted entries + 1 new one
    append(ml, message("k1", b"w"))
    calls.clear()
    Compactor().compact(topic, progress=lambda *call: calls.append(call))
    assert calls[-1] == ("phase-two", 1, 1)  # an incremental run: the new one only


def test_record_keeps_total_duration_and_append_latency_buckets(ml: ManagedLedger) -> None:
    append(ml, message("a", b"1"), message("b", b"1"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    figures = Compactor().compact(topic)
    assert sum(figures.append_latency_counts) == figures.entries_written == 2
    assert sum(topic.record.append_latency_counts) == 2
    append(ml, message("c", b"1"))
    Compactor().compact(topic, rewrite=True)
    assert sum(topic.record.append_latency_counts) == 5  # 2, then 3 survivors (a full rewrite)
    append(ml, message("d", b"1"))
    Compactor().compact(topic)
    assert sum(topic.record.append_latency_counts) == 6  # then 1 (an incremental run: the new one)
    assert topic.record.total_duration_ms >= topic.record.last_duration_ms
