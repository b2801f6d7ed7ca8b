"""Pulsar's ``CompactedTopicUtilsTest`` scenario (reference ``pulsar-compaction.md`` §6.3 #57)."""

from __future__ import annotations

from ledger.managed_ledger import ManagedLedgerConfig
from ledger.position import Position
from tests.unit.compactor.scenarios.support import MakeHarness, message


def test_testReadCompactedEntriesWithEmptyEntries(make: MakeHarness) -> None:
    """§6.3 #57 testReadCompactedEntriesWithEmptyEntries: nothing compacted at (L,91), horizon (L,100) → empty read, cursor at (L,101)."""
    h = make(ledger_config=ManagedLedgerConfig(max_entries_per_ledger=1000))
    positions = h.publish(
        *(message(f"k{i}", b"v") for i in range(91)),            # entries 0..90 survive
        *(message(f"gone{i}", b"") for i in range(91, 101)),      # 91..100: tombstones, nothing kept
    )
    ledger = positions[0].ledger_id
    assert positions[-1] == Position(ledger, 100)
    h.compact()
    assert h.topic.horizon == Position(ledger, 100)

    reader = h.reader(Position(ledger, 91), name="r")
    assert reader.cursor.read_position == Position(ledger, 91)
    assert reader.dispatch() == []
    assert reader.cursor.read_position == Position(ledger, 101)
