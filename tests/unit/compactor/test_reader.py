"""The compacted reader: first-read rule, index in the view, seek and rewind, view swaps, masks."""

from __future__ import annotations

import inspect

import pytest

from compactor.runs.runner import Compactor
from compactor.view.reader import CompactedReader
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedView
from cursor import CursorStore, InitialPosition, ManagedCursor
from ledger import ManagedLedger, ManagedLedgerConfig, MemoryLedgerStore, MetadataStore
from ledger.position import EARLIEST, Position
from tests.unit.compactor.scenarios.support import Harness, batch, message

TOPIC = "persistent://public/default/reader"


@pytest.fixture
def ml() -> ManagedLedger:
    return ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                              ManagedLedgerConfig(max_entries_per_ledger=1000))


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[Position]:
    """Every ``CompactedView.find_start`` (the binary search) call's position."""
    calls: list[Position] = []
    real = CompactedView.find_start

    def recording(view: CompactedView, position: Position) -> int | None:
        calls.append(position)
        return real(view, position)

    monkeypatch.setattr(CompactedView, "find_start", recording)
    return calls


def append(ml: ManagedLedger, *datas: bytes) -> list[Position]:
    return [ml.append(d).result(timeout=10) for d in datas]


def compacted(ml: ManagedLedger) -> CompactedTopic:
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    return topic


def read_all(reader: CompactedReader, per_read: int) -> list[Position]:
    got: list[Position] = []
    while entries := reader.read(per_read):
        got += [entry.position for entry in entries]
    return got


def test_reading_the_view_searches_it_once_then_advances_its_index(ml: ManagedLedger, searches: list[Position]) -> None:
    positions = append(ml, *(message(f"k{i}", b"v") for i in range(20)))
    topic = compacted(ml)
    searches.clear()
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", positions[5]))
    assert read_all(reader, 3) == positions[5:]  # seven reads of the view, then the (empty) tail
    assert searches == [positions[5]]


def test_a_first_read_from_earliest_reads_the_whole_view_without_a_search(
    ml: ManagedLedger, searches: list[Position],
) -> None:
    history = append(ml, *(message(f"k{i % 4}", b"v%d" % i) for i in range(12)))
    topic = compacted(ml)
    tail = append(ml, message("k0", b"tail"))
    searches.clear()
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", EARLIEST), from_earliest=True)
    assert reader.first_read_from_earliest
    assert read_all(reader, 1) == history[8:] + tail  # the survivors, then the raw tail
    assert searches == []


def test_a_durable_subscription_reads_from_earliest_only_while_it_acknowledged_nothing(ml: ManagedLedger) -> None:
    positions = append(ml, message("b", b"1"), message("a", b"1"), message("a", b"2"))
    topic = compacted(ml)  # survivors: b at positions[0], a at positions[2]
    fresh = CompactedReader(topic, ManagedCursor.open_durable(ml, "fresh", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database)),
                            from_earliest=True)
    assert fresh.first_read_from_earliest
    assert read_all(fresh, 10) == [positions[0], positions[2]]
    cursor = ManagedCursor.open_durable(ml, "acked", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database))
    cursor.mark_delete(positions[1])  # #21187: it consumed raw entries, the rule no longer holds
    acked = CompactedReader(topic, cursor, from_earliest=True)
    assert not acked.first_read_from_earliest
    assert read_all(acked, 10) == [positions[2]]
    acked.subscribing(True)
    assert not acked.first_read_from_earliest


def test_a_seek_into_the_view_is_where_the_resubscribed_consumer_reads_from(
    ml: ManagedLedger, searches: list[Position],
) -> None:
    positions = append(ml, *(message(f"k{i}", b"v") for i in range(10)))
    topic = compacted(ml)
    cursor = ManagedCursor.open_durable(ml, "sub", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database))
    reader = CompactedReader(topic, cursor, from_earliest=True)
    assert read_all(reader, 100) == positions
    cursor.mark_delete(positions[-1])
    searches.clear()
    reader.seek(positions[4])
    assert reader.sought and reader.read_position == positions[4]
    reader.subscribing(True)  # a sought subscription keeps its position on re-subscribe
    assert not reader.first_read_from_earliest
    reader.rewind()  # the consumers subscribe again
    assert not reader.sought
    assert [e.position for e in reader.read(3)] == positions[4:7]
    assert [e.position for e in reader.read(3)] == positions[7:10]
    assert searches == [positions[4]]


def test_a_rewind_into_trimmed_compacted_entries_reads_them_while_the_cursor_stays_after_md() -> None:
    store, metadata = MemoryLedgerStore(), MetadataStore(":memory:")
    h = Harness(store, metadata)
    positions = h.publish(*(message(f"k{i}", b"v") for i in range(5)))
    h.compact()
    h.unload()  # the raw ledger is trimmed: the compacted entries keep their positions in it
    assert h.ml.number_of_entries == 0
    cursor = ManagedCursor.open_durable(h.ml, "sub", InitialPosition.EARLIEST, store=h.cursors)
    reader = CompactedReader(h.topic, cursor, from_earliest=True)
    assert [e.position for e in reader.read(2)] == positions[:2]
    assert cursor.mark_delete_position < positions[0]  # moved back before the trimmed entries
    cursor.delete([positions[0]])
    reader.rewind()  # the next active consumer: everything after MD again, from the view
    assert cursor.mark_delete_position == positions[0]
    assert reader.read_position == positions[1] < cursor.read_position  # the cursor is never behind MD
    assert read_all(reader, 2) == positions[1:]


def test_a_view_published_mid_read_is_searched_again_from_where_the_reader_is(
    ml: ManagedLedger, searches: list[Position],
) -> None:
    first = append(ml, *(message(f"k{i}", b"old") for i in range(6)))
    topic = compacted(ml)
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", EARLIEST), from_earliest=True)
    assert [e.position for e in reader.read(2)] == first[:2]
    later = append(ml, message("k0", b"new"), message("k5", b"new"), message("k9", b"v"))
    Compactor().compact(topic)  # the new view: k0 and k5 superseded, k9 added
    searches.clear()
    assert read_all(reader, 2) == first[2:5] + later
    assert searches == [first[2]]


def test_the_mask_sent_with_a_batch_decides_what_a_batch_index_ack_acknowledges(ml: ManagedLedger) -> None:
    positions = append(ml, batch([("a", b"1"), ("b", b"1"), ("a", b"2")]), message("c", b"1"))
    topic = compacted(ml)  # the batch keeps slots 1 and 2: slot 0 is compacted out
    cursor = ManagedCursor.open_durable(ml, "sub", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database))
    reader = CompactedReader(topic, cursor, from_earliest=True)
    assert read_all(reader, 10) == positions
    entry = positions[0]
    assert reader.ack_set(entry) == (0b110,)
    assert reader.ack_set(positions[1]) == ()  # not a batch: no mask
    slot = entry.with_batch_index(1)
    # only slot 0 left unacknowledged, which the consumer was never sent: the whole entry
    assert reader.acknowledged_entry(slot, [0b001], cumulative=False) == entry
    # slot 2 still unacknowledged: an individual ack is ignored, a cumulative one stops before
    assert reader.acknowledged_entry(slot, [0b101], cumulative=False) is None
    assert reader.acknowledged_entry(slot, [0b101], cumulative=True) == cursor.previous_position(entry)
    assert reader.acknowledged_entry(positions[1], [], cumulative=False) == positions[1]
    reader.acknowledged([entry], cumulative=False)
    assert reader.ack_set(entry) == ()  # forgotten once acknowledged
    assert reader.acknowledged_entry(slot, [0b001], cumulative=False) is None  # no mask: partial


def test_a_seek_forgets_the_masks_of_what_was_sent(ml: ManagedLedger) -> None:
    positions = append(ml, batch([("a", b"1"), ("b", b"1"), ("a", b"2")]))
    topic = compacted(ml)
    reader = CompactedReader(topic, ManagedCursor.open_durable(ml, "sub", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database)),
                             from_earliest=True)
    assert read_all(reader, 10) == positions and reader.ack_set(positions[0]) == (0b110,)
    reader.seek(EARLIEST)
    assert reader.ack_set(positions[0]) == () and reader.first_read_from_earliest


def test_a_reader_not_reading_compacted_reads_the_raw_topic(ml: ManagedLedger) -> None:
    positions = append(ml, message("a", b"1"), message("a", b"2"))
    topic = compacted(ml)
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "r", EARLIEST), enabled=False,
                             from_earliest=True)
    assert read_all(reader, 1) == positions
    assert reader.cursor.compacted_successor is None


def test_nothing_moves_a_cursor_to_or_before_its_mark_delete_position(ml: ManagedLedger) -> None:
    assert "force" not in inspect.signature(ManagedCursor.seek).parameters
    positions = append(ml, *(message(f"k{i}", b"v") for i in range(3)))
    cursor = ManagedCursor.open_durable(ml, "sub", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database))
    cursor.mark_delete(positions[1])
    cursor.seek(positions[0])
    assert cursor.read_position == positions[2]


def test_a_seek_before_the_first_read_from_earliest_reads_from_the_sought_entry(ml: ManagedLedger) -> None:
    positions = append(ml, *(message(f"k{i}", b"v") for i in range(6)))
    topic = compacted(ml)
    reader = CompactedReader(topic, ManagedCursor.open_durable(ml, "sub", InitialPosition.EARLIEST, store=CursorStore(ml.metadata.database)),
                             from_earliest=True)
    reader.seek(positions[3])  # before any read: the seek, not the first-read rule, says where
    reader.rewind()
    assert read_all(reader, 10) == positions[3:]
