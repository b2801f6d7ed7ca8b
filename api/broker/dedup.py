"""Producer de-duplication that survives a restart (Pulsar's message de-duplication).

The state is a map producer name → highest sequence id of a *durable* entry. It is
snapshotted into the properties of a durable cursor named ``pulsar.dedup`` (Pulsar's
name), whose mark-delete position says which entry the snapshot covers, every
``SNAPSHOT_INTERVAL_ENTRIES`` durable entries and when the topic closes. On load the map
is the snapshot plus a replay of the entries after it, read from their metadata
(``producer_name``, ``highest_sequence_id`` or ``sequence_id``). Only durable entries ever
enter the map, so a send lost in a crash is never mistaken for a duplicate when the
client sends it again. The cursor holds at most one interval of entries against trimming.
"""

from __future__ import annotations

from compactor.errors import MalformedEntryError
from compactor.message import parse_entry
from cursor.cursor import InitialPosition, ManagedCursor
from ledger.managed_ledger import ManagedLedger
from ledger.position import Position

__all__ = ["DEDUP_CURSOR", "SNAPSHOT_INTERVAL_ENTRIES", "Deduplication"]

DEDUP_CURSOR = "pulsar.dedup"
# Pulsar's brokerDeduplicationEntriesInterval: entries between two snapshots (and so at
# most this many entries are replayed at load).
SNAPSHOT_INTERVAL_ENTRIES = 1000
_REPLAY_BATCH_ENTRIES = 1000


class Deduplication:
    """The de-duplication state of one topic; runs on the broker's event loop."""

    def __init__(self, ledger: ManagedLedger) -> None:
        self.ledger = ledger
        self.cursor = ManagedCursor.open_durable(ledger, DEDUP_CURSOR, InitialPosition.EARLIEST)
        self.sequence_ids: dict[str, int] = dict(self.cursor.properties)
        self._last_durable = self.cursor.mark_delete_position
        self._unsnapshotted = 0
        self._replay()

    def _replay(self) -> None:
        position = self.ledger.next_valid_position(self.cursor.mark_delete_position)
        end = self.ledger.last_confirmed_position()
        while position <= end:
            entries = self.ledger.read_entries(position, _REPLAY_BATCH_ENTRIES, end=end)
            if not entries:
                break
            for entry in entries:
                try:
                    metadata = parse_entry(entry.data).metadata
                except MalformedEntryError:
                    continue
                highest = max(metadata.sequence_id, metadata.highest_sequence_id)
                self.durable(metadata.producer_name, highest, entry.position, snapshot=False)
            position = self.ledger.next_valid_position(entries[-1].position)

    def durable(self, producer_name: str, sequence_id: int, position: Position, *, snapshot: bool = True) -> None:
        """An entry of ``producer_name`` up to ``sequence_id`` is durable at ``position``."""
        if sequence_id > self.sequence_ids.get(producer_name, -1):
            self.sequence_ids[producer_name] = sequence_id
        self._last_durable = max(self._last_durable, position)
        self._unsnapshotted += 1
        if snapshot and self._unsnapshotted >= SNAPSHOT_INTERVAL_ENTRIES:
            self.snapshot()

    def snapshot(self) -> None:
        """Persist the map with the position it covers."""
        if self._unsnapshotted == 0 or self._last_durable <= self.cursor.mark_delete_position:
            return
        self.cursor.mark_delete(self._last_durable, self.sequence_ids)
        self._unsnapshotted = 0
