"""Acknowledgements of a read-compacted subscription, as a property (issue 10, point 5).

Over generated histories (single messages and batches over a few keys), compacted, with
the raw ledger trimmed before the subscription exists or held by it, then a raw tail: a
read-compacted consumer receives everything, acknowledges any subset of the entries
individually and maybe a prefix cumulatively, and reconnects (after a topic unload or
not). What it gets then is exactly what it did not acknowledge, in order: nothing
acknowledged comes again, nothing unacknowledged is lost.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cursor.cursor import InitialPosition
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import MemoryLedgerStore
from tests.unit.compactor.scenarios.support import Harness, batch, message

entries_of_keys = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3), min_size=1, max_size=12)


def _publish(harness: Harness, entries: list[list[int]], prefix: str) -> None:
    datas = []
    for index, keys in enumerate(entries):
        pairs = [(f"k{key}", f"{prefix}{index}.{slot}".encode()) for slot, key in enumerate(keys)]
        datas.append(message(*pairs[0]) if len(pairs) == 1 else batch(pairs))
    harness.publish(*datas)


@settings(max_examples=100, deadline=None)
@given(history=entries_of_keys, tail=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=2), max_size=3),
       subscribe_first=st.booleans(), receiver_queue=st.integers(1, 4), unload=st.booleans(), data=st.data())
def test_a_read_compacted_subscription_gets_again_exactly_what_it_did_not_acknowledge(
    history: list[list[int]], tail: list[list[int]], subscribe_first: bool, receiver_queue: int,
    unload: bool, data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = MemoryLedgerStore()
        metadata = MetadataStore(str(Path(directory) / "metadata.db"))
        try:
            harness = Harness(store, metadata)
            if subscribe_first:  # the subscription holds the raw ledger
                harness.subscribe("sub", initial=InitialPosition.EARLIEST)
            _publish(harness, history, "h")
            harness.compact()
            harness.unload()  # trims the raw ledger unless the subscription holds it
            if tail:
                _publish(harness, tail, "t")
            consumer = harness.subscribe("sub", initial=InitialPosition.EARLIEST, receiver_queue=receiver_queue)

            first = consumer.receive_all()
            delivered = sorted({m.message_id.entry_position() for m in first})
            assert len({m.message_id for m in first}) == len(first)  # no duplicates
            individually = data.draw(st.sets(st.sampled_from(delivered)) if delivered else st.just(set()))
            cumulative = data.draw(st.none() | st.sampled_from(delivered)) if delivered else None
            for position in data.draw(st.permutations(sorted(individually))):
                consumer.cursor.delete([position])
            if cumulative is not None and cumulative > consumer.cursor.mark_delete_position:
                consumer.cursor.mark_delete(cumulative)  # (one before MD is a no-op the broker ignores)
            if unload:
                harness.unload()
            consumer.reconnect()

            def acknowledged(position: Position) -> bool:
                entry = position.entry_position()
                return entry in individually or (cumulative is not None and entry <= cumulative)
            expected = [m.message_id for m in first if not acknowledged(m.message_id)]
            assert [m.message_id for m in consumer.receive_all()] == expected
        finally:
            store.shutdown()
            metadata.close()
