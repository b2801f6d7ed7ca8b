"""Pulsar's ``TopicCompactionServiceTest`` scenario (reference ``pulsar-compaction.md`` §6.3 #58).

Only the compacted-entry reads and the horizon are library level; ``findEntryByEntryIndex``
and ``findEntryByPublishTime`` (broker entry index, publish-time search over the compacted
ledger) have no counterpart yet.
"""

from __future__ import annotations

from ledger.position import EARLIEST
from message.entry import iter_messages, parse_entry
from tests.unit.compactor.scenarios.support import MakeHarness, message


def test_test(make: MakeHarness) -> None:
    """§6.3 #58 TopicCompactionServiceTest.test: c:C0, a:A1, b:B1, a:A2, b:B2, b:B3 → read(earliest, 4) = {a:A2, b:B3, c:C0}; (earliest, 1) → 1; horizon == LAC."""
    h = make()
    h.publish(message("c", b"C_0"))
    h.publish(message("a", b"A_1"), message("b", b"B_1"), message("a", b"A_2"), message("b", b"B_2"),
              message("b", b"B_3"))
    h.compact()
    view = h.topic.view
    assert view is not None

    entries = view.read_from(EARLIEST, 4)
    assert len(entries) == 3
    got = {m.key: m.payload for e in entries for m in iter_messages(parse_entry(e.data))}
    assert got == {"a": b"A_2", "b": b"B_3", "c": b"C_0"}
    assert len(view.read_from(EARLIEST, 1)) == 1
    assert view.horizon == h.ml.last_confirmed_position()
