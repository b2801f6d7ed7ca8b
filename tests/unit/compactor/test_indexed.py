"""Rounds over key indexes (``compactor.local.indexed``) agree with rounds that parse.

* Agreement, pure: over generated streams of every entry kind but chunks (keyed, key-less,
  tombstones young and old, batches with emptied slots, markers, undecodable entries,
  broker-entry prefixes, every codec), split into several runs and into rounds by a key
  map of a few keys, each indexed round stops where the parsing round stops, counts what
  it counts, and writes its entries byte for byte; the last view is
  ``compactor.local.algorithm.compact``'s.
* A round whose input holds a chunk gives up on the index (``IndexUnavailable``) before
  writing anything, and so does one with two keys whose hashes share their high half.
* Agreement, storage: a compactor over the indexes publishes, run after run and round
  after round, the views and figures of one that parses (``key_index=False``); the indexes
  it needed are written beside the sealed ledgers and used by the next run.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.engine import KEY_MAP_BYTES_PER_KEY, LedgerRange
from compactor.local import indexed
from compactor.local.algorithm import CompactedEntry, compact
from compactor.local.indexed import IndexedRound, IndexUnavailable
from compactor.local.key_index import (
    INDEX_SUFFIX,
    IndexedLedger,
    IndexWriter,
    KeyIndex,
    build_index,
    index_path,
    ledger_path,
    read_index,
    write_index,
)
from compactor.local.rounds import round_phase_one, round_phase_two
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.topic import CompactedTopic
from compactor.view.view import encode_compacted_entry
from cursor.store import CursorStore
from ledger import EARLIEST
from ledger.data_dir import DataDir
from ledger.managed_ledger import Entry, ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.sealed_writer import write_sealed_ledger
from tests.strategies import (
    StreamEntry,
    any_entry,
    batch_entries,
    entries_of,
    stream_entries,
    streams,
)
from tests.unit.compactor.test_crash import _append, _workload

PROPERTY = settings(max_examples=200, deadline=None)
PUBLISHED_AT = 1_700_000_000_000  # every generated entry's publish time
CUTOFFS = st.sampled_from([None, PUBLISHED_AT, PUBLISHED_AT + 1])  # retention: none, all young, none young
_VIEW_LEDGER = -1  # the previous view's ledger in the pure harness (never a raw id)


class _Ledgers:
    """One round's input as ledgers in memory: the previous view (entries stored from 0),
    then the raw ledgers (entries stored at their entry ids, as in a raw ledger file)."""

    def __init__(self, raw: list[Entry], view: list[CompactedEntry], horizon: Position) -> None:
        self.ledgers: dict[tuple[bool, int], dict[int, tuple[int, int, bytes]]] = {}
        self.ranges: list[LedgerRange] = []
        if view:
            self.ledgers[(True, _VIEW_LEDGER)] = {
                stored: (entry.position.ledger_id, entry.position.entry_id, encode_compacted_entry(entry))
                for stored, entry in enumerate(view)}
            self.ranges.append(LedgerRange(_VIEW_LEDGER, 0, len(view) - 1, compacted=True))
        for ledger_id, group in itertools.groupby(raw, key=lambda entry: entry.position.ledger_id):
            entries = list(group)
            dirty = [entry.position.entry_id for entry in entries if entry.position > horizon]
            if not dirty:
                continue
            self.ledgers[(False, ledger_id)] = {e.position.entry_id: (ledger_id, e.position.entry_id, e.data)
                                                for e in entries}
            self.ranges.append(LedgerRange(ledger_id, dirty[0], entries[-1].position.entry_id))

    def load(self, whole: LedgerRange, columns: tuple[str, ...]) -> KeyIndex:
        entries = self.ledgers[(whole.compacted, whole.ledger_id)]
        if whole.compacted:
            from compactor.view.view import decode_compacted_entry
            inner = {stored: decode_compacted_entry(data) for stored, (_, _, data) in entries.items()}
            return build_index((stored, e.position.ledger_id, e.position.entry_id, e.data)
                               for stored, e in inner.items())
        return build_index((stored, ledger_id, entry_id, data)
                           for stored, (ledger_id, entry_id, data) in entries.items())

    def read(self, whole: LedgerRange, stored: list[int]) -> list[bytes]:
        assert stored == sorted(stored) and all(whole.first_entry_id <= at <= whole.last_entry_id for at in stored)
        entries = self.ledgers[(whole.compacted, whole.ledger_id)]
        return [entries[at][2] for at in stored]


def _both_rounds(
    raw: list[Entry], view: list[CompactedEntry], horizon: Position, *, capacity: int, retain_null_key: bool,
    cutoff: int | None,
) -> tuple[list[CompactedEntry], Position, int]:
    """Rounds from ``view`` until ``raw`` is covered, each run both ways and compared;
    (the last view, its horizon, rounds)."""
    rounds = 0
    while any(entry.position > horizon for entry in raw):
        ledgers = _Ledgers(raw, view, horizon)
        over_indexes = IndexedRound(tuple(ledgers.ranges), capacity_keys=capacity, keep_tombstones_since_ms=cutoff,
                                    retain_null_key=retain_null_key, load=ledgers.load, read=ledgers.read)
        over_indexes.plan()
        clean = [Entry(entry.position, entry.data) for entry in view]
        dirty = [entry for entry in raw if entry.position > horizon]
        one = round_phase_one(iter(clean + dirty), horizon=horizon, capacity_keys=capacity,
                              keep_tombstones_since_ms=cutoff)
        assert over_indexes.filled == one.filled
        assert over_indexes.stop == one.stop
        assert (over_indexes.entries_read, over_indexes.messages_read, over_indexes.bytes_read) == (
            one.result.entries_read, one.result.messages_read, one.result.bytes_read)
        stop = one.stop
        assert stop is not None and stop > horizon
        covered = [entry for entry in dirty if entry.position <= stop]
        parsed = list(round_phase_two(clean + covered, one, retain_null_key=retain_null_key,
                                      keep_tombstones_since_ms=cutoff))
        assert list(over_indexes.survivors()) == parsed
        assert over_indexes.keys_kept == one.keys_kept
        # one record of a round's figures, whichever way it ran (compactor.record.RoundFigures)
        assert over_indexes.figures(7, len(parsed), 0, 0) == one.figures(7, len(parsed), 0, 0)
        view, horizon, rounds = parsed, stop, rounds + 1
    return view, horizon, rounds


@PROPERTY
@given(stream_entries(any_entry, max_size=40, chunked=False), st.integers(1, 6), st.booleans(), CUTOFFS,
       st.lists(st.integers(0, 40), max_size=3))
def test_indexed_rounds_stop_count_and_write_what_parsing_rounds_do(
    stream: list[StreamEntry], capacity: int, retain_null_key: bool, cutoff: int | None, run_ends: list[int],
) -> None:
    raw = entries_of(stream)
    view: list[CompactedEntry] = []
    horizon = EARLIEST
    for end in [*sorted(run_ends), len(raw)]:  # several runs, each appended to
        view, horizon, _ = _both_rounds(raw[:end], view, horizon, capacity=capacity,
                                        retain_null_key=retain_null_key, cutoff=cutoff)
    assert view == compact(raw, retain_null_key=retain_null_key, keep_tombstones_since_ms=cutoff)


ROW_GROUP_ROWS_MIN = 3  # the streamed index's (small: parts wait, and row groups are many)


def _file_metadata(path: str) -> dict[bytes, bytes]:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet:
        return dict(parquet.read(columns=["stored"]).schema.metadata or {})


def _write_round(over_indexes: IndexedRound, root: str, ledger_id: int,
                 part_rows_max: int = indexed.OUTPUT_PART_ROWS_MAX) -> list[CompactedEntry]:
    """Phase two of ``over_indexes`` written as the sealed ledger ``ledger_id`` with its key
    index streamed beside it, as the worker does (``OutputIndex`` handing each part to an
    ``IndexWriter``); checks the index against ``build_index`` over the ledger written, and
    that each part is handed on as soon as its survivors are written; the survivors."""
    path = index_path(ledger_path(root, ledger_id))
    writer = IndexWriter(path, row_group_rows_min=ROW_GROUP_ROWS_MIN)
    parts: list[dict[str, Any]] = []
    view: list[CompactedEntry] = []

    def write(part: dict[str, Any]) -> None:
        # every survivor of the part was written, and none after it was made: no more than
        # a part is held, never the round's rows
        assert len(part["stored"]) and int(part["stored"][-1]) + 1 == len(view)
        # at most ``part_rows_max`` rows before the part's last survivor's
        assert int(np.count_nonzero(part["stored"] != part["stored"][-1])) < part_rows_max
        parts.append(part)
        writer.write(part)
        assert writer.waiting_rows < ROW_GROUP_ROWS_MIN

    output = indexed.OutputIndex(write, part_rows_max)

    def encoded() -> Iterator[bytes]:
        for survivor in over_indexes.survivors(output):
            view.append(survivor)
            yield encode_compacted_entry(survivor)

    written = write_sealed_ledger(root, ledger_id, {}, encoded(), created_at_ms=PUBLISHED_AT, placed=output.placed)
    output.finish()
    ledger = IndexedLedger(ledger_id, written.entries, written.size_bytes)
    writer.commit(ledger)
    assert int(parts[-1]["stored"][-1]) + 1 == len(view) if parts else not view
    expected = build_index(((stored, entry.position.ledger_id, entry.position.entry_id, entry.data)
                            for stored, entry in enumerate(view)), (written.entry_offsets, written.entry_lengths))
    streamed = read_index(path, ledger)
    assert streamed is not None
    assert streamed.entries == expected.entries == len(view)
    assert streamed.columns.keys() == expected.columns.keys()
    for name, column in expected.columns.items():
        handed = np.concatenate([part[name] for part in parts]) if parts else np.empty(0, column.dtype)
        assert handed.dtype == streamed[name].dtype == column.dtype, name
        assert handed.tolist() == streamed[name].tolist() == column.tolist(), name
    reference = os.path.join(root, "reference.kidx")
    write_index(reference, expected, ledger)  # the same metadata (format, ledger, every column's CRC32C)
    assert _file_metadata(path).keys() - {b"ARROW:schema"} == _file_metadata(reference).keys() - {b"ARROW:schema"}
    assert {key: value for key, value in _file_metadata(path).items() if key != b"ARROW:schema"} == {
        key: value for key, value in _file_metadata(reference).items() if key != b"ARROW:schema"}
    return view


@PROPERTY
@given(stream_entries(st.one_of(batch_entries(), batch_entries(), any_entry), max_size=40, chunked=False),
       st.integers(1, 6), st.booleans(), CUTOFFS, st.lists(st.integers(0, 40), max_size=3),
       st.sampled_from([3, 20, indexed.OUTPUT_PART_ROWS_MAX]))
def test_the_index_a_round_streams_is_the_index_of_the_ledger_it_writes(
    stream: list[StreamEntry], capacity: int, retain_null_key: bool, cutoff: int | None, run_ends: list[int],
    part_rows_max: int,
) -> None:
    """``OutputIndex`` over every round of several runs (each round's input: the previous
    view and raw ledgers, so survivors copied whole and cut batches from several input
    ledgers' rows; mostly batches, so that many are cut), streamed part by part through
    ``IndexWriter`` beside the sealed ledger the round writes, reads back (``read_index``)
    as ``build_index`` over that ledger, column by column, dtypes, metadata and checksums
    included; each part is handed on before the next part's first survivor is made, and
    holds at most ``part_rows_max`` rows before its last survivor's."""
    raw = entries_of(stream)
    view: list[CompactedEntry] = []
    horizon = EARLIEST
    with tempfile.TemporaryDirectory() as root:
        ledger_ids = itertools.count(1)
        for end in [*sorted(run_ends), len(raw)]:
            while any(entry.position > horizon for entry in raw[:end]):
                ledgers = _Ledgers(raw[:end], view, horizon)
                over_indexes = IndexedRound(tuple(ledgers.ranges), capacity_keys=capacity,
                                            keep_tombstones_since_ms=cutoff, retain_null_key=retain_null_key,
                                            load=ledgers.load, read=ledgers.read)
                over_indexes.plan()
                view = _write_round(over_indexes, root, next(ledger_ids), part_rows_max)
                assert over_indexes.stop is not None and over_indexes.stop > horizon
                horizon = over_indexes.stop


@PROPERTY
@given(stream_entries(any_entry, max_size=40, chunked=False), st.integers(1, 6), CUTOFFS)
def test_an_indexed_round_holds_no_more_keys_than_the_budget_or_one_entry(
    stream: list[StreamEntry], capacity: int, cutoff: int | None,
) -> None:
    raw = entries_of(stream)
    ledgers = _Ledgers(raw, [], EARLIEST)
    if not ledgers.ranges:
        return
    over_indexes = IndexedRound(tuple(ledgers.ranges), capacity_keys=capacity, keep_tombstones_since_ms=cutoff,
                                retain_null_key=False, load=ledgers.load, read=ledgers.read)
    over_indexes.plan()
    widest = max((sum(1 for _, m in entry.messages if m.key is not None) for entry in stream), default=0)
    assert len(over_indexes.key_map.high) <= max(capacity, widest)


@settings(max_examples=100, deadline=None)
@given(streams(max_size=20))
def test_a_round_whose_input_holds_a_chunk_parses_instead(stream: list[StreamEntry]) -> None:
    raw = entries_of(stream)
    ledgers = _Ledgers(raw, [], EARLIEST)
    over_indexes = IndexedRound(tuple(ledgers.ranges), capacity_keys=1000, keep_tombstones_since_ms=None,
                                retain_null_key=False, load=ledgers.load, read=ledgers.read)
    if any(entry.kind == "chunk" or _is_chunk(entry) for entry in stream):
        with pytest.raises(IndexUnavailable, match="chunked"):
            over_indexes.plan()
    else:
        over_indexes.plan()


def _is_chunk(entry: StreamEntry) -> bool:
    from compactor.local.scan import scan_entry
    return scan_entry(entry.data).chunk is not None


def test_two_keys_sharing_the_high_half_of_their_hash_make_the_round_parse() -> None:
    raw = entries_of(_keyed_stream(["a", "b", "a"]))
    ledgers = _Ledgers(raw, [], EARLIEST)
    real = indexed.IndexedRound._rows

    def colliding(self: IndexedRound, whole: LedgerRange, columns: tuple[str, ...]) -> dict[str, object]:
        rows = real(self, whole, columns)
        rows["hash_high"] = rows["hash_high"] * 0 + 7  # every key's high half the same
        return rows  # type: ignore[return-value]

    over_indexes = IndexedRound(tuple(ledgers.ranges), capacity_keys=1000, keep_tombstones_since_ms=None,
                                retain_null_key=False, load=ledgers.load, read=ledgers.read)
    with mock.patch.object(indexed.IndexedRound, "_rows", colliding), pytest.raises(IndexUnavailable, match="64"):
        over_indexes.plan()


def _keyed_stream(keys: list[str]) -> list[StreamEntry]:
    from message.encoder import encode_entry
    from message.proto import pulsar_api_pb2 as pb
    stream = []
    for entry_id, key in enumerate(keys):
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=entry_id, publish_time=PUBLISHED_AT,
                                      partition_key=key)
        stream.append(StreamEntry(Position(3, entry_id), "single", encode_entry(metadata, b"v", with_checksum=False)))
    return stream


# -- storage ----------------------------------------------------------------------------------

TOPIC = "persistent://public/default/indexed"
LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=8)


@pytest.fixture
def opened() -> Iterator[list[DataDir]]:
    dirs: list[DataDir] = []
    yield dirs
    for data_dir in dirs:
        data_dir.close()


def _open(path: Path, opened: list[DataDir]) -> CompactedTopic:
    data_dir = DataDir.open(str(path))
    opened.append(data_dir)
    collect_orphans(data_dir)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, LEDGER_CONFIG)
    return CompactedTopic.restore(ledger, CursorStore(data_dir.database))


def _view(topic: CompactedTopic) -> list[tuple[Position, bytes, tuple[int, ...]]]:
    view = topic.view
    assert view is not None
    return [(entry.position, entry.data, entry.surviving) for entry in view.iter_all()]


@pytest.mark.parametrize("keys", [3, 1_000_000])  # several rounds a run; one round
def test_a_compactor_over_indexes_publishes_what_a_parsing_one_publishes_run_after_run(
    tmp_path: Path, opened: list[DataDir], keys: int,
) -> None:
    views, figures = {}, {}
    for key_index in (False, True):
        compactor = Compactor(CompactionConfig(engine="local", read_batch_entries=4,
                                               memory_budget_bytes=keys * KEY_MAP_BYTES_PER_KEY, key_index=key_index))
        topic = _open(tmp_path / str(key_index), opened)
        views[key_index], figures[key_index] = [], []
        for seed in (1, 2, 3):  # each run builds on the view the previous one published
            _append(topic.ledger, _workload(seed, 30))
            run = compactor.compact(topic, delete_retention_ms=0)
            figures[key_index].append((run.rounds, run.keys_kept, run.removed_events, run.entries_read,
                                       run.messages_read, run.bytes_read, run.entries_written, run.bytes_written,
                                       run.horizon))
            views[key_index].append(_view(topic))
    assert views[True] == views[False]
    assert figures[True] == figures[False]


def test_the_indexes_a_run_needed_are_written_beside_sealed_ledgers_and_read_by_the_next_run(
    tmp_path: Path, opened: list[DataDir],
) -> None:
    topic = _open(tmp_path, opened)
    ledgers = os.path.join(str(tmp_path), "ledgers")
    _append(topic.ledger, _workload(1, 30))
    Compactor(CompactionConfig(engine="local")).compact(topic)
    assert topic.view is not None
    replaceable = {f"{ledger_id:020d}.ledger{INDEX_SUFFIX}" for ledger_id in topic.view.ledger_ids}  # a merge may
    indexed_ledgers = {name[: -len(INDEX_SUFFIX)] for name in os.listdir(ledgers) if name.endswith(INDEX_SUFFIX)}
    sealed = {f"{record.ledger_id:020d}.ledger" for record in topic.ledger.ledger_list()[:-1]}
    assert sealed and sealed <= indexed_ledgers
    _append(topic.ledger, _workload(2, 30))
    from compactor.local import key_index
    written: list[str] = []
    real_write, real_commit = key_index.write_index, key_index.IndexWriter.commit

    def recording(path: str, index: KeyIndex, ledger: key_index.IndexedLedger) -> None:
        written.append(os.path.basename(path))
        real_write(path, index, ledger)

    def recording_commit(writer: key_index.IndexWriter, ledger: key_index.IndexedLedger) -> None:
        written.append(os.path.basename(writer.path))  # a round's compacted ledger's, streamed
        real_commit(writer, ledger)

    before = {name for name in os.listdir(ledgers) if name.endswith(INDEX_SUFFIX)}
    with mock.patch.object(key_index, "write_index", recording), \
            mock.patch.object(key_index.IndexWriter, "commit", recording_commit):
        Compactor(CompactionConfig(engine="local")).compact(topic)
    after = {name for name in os.listdir(ledgers) if name.endswith(INDEX_SUFFIX)}
    assert before - replaceable < after  # the newly sealed ledgers (the compacted one goes with its ledger if merged)
    assert set(written).isdisjoint(before)  # the first run's indexes were read, not built again
    assert after - before <= set(written)  # (the run's compacted ledger's too: written by its round)


@pytest.mark.parametrize("refused", ["disk", "part"])
def test_a_round_whose_index_cannot_be_written_publishes_its_view_without_an_index_and_leaves_no_temporary(
    tmp_path: Path, opened: list[DataDir], refused: str,
) -> None:
    """The compacted ledger's streamed index fails (the disk refuses Parquet's writes; the
    writer refuses a part): the round's view is published all the same (the index is built
    when first needed), with no index and no temporary file beside its ledger."""
    import pyarrow.parquet as pq

    from compactor.local import key_index
    real_write = key_index.IndexWriter.write

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    def wrong_part(writer: key_index.IndexWriter, part: dict[str, Any]) -> None:
        real_write(writer, {**part, "flags": part["flags"].astype(np.int64)})

    fault = (mock.patch.object(pq.ParquetWriter, "write_table", disk_full) if refused == "disk"
             else mock.patch.object(key_index.IndexWriter, "write", wrong_part))
    views = {}
    for with_index in (False, True):
        topic = _open(tmp_path / str(with_index), opened)
        _append(topic.ledger, _workload(1, 30))
        if with_index:
            for record in topic.ledger.ledger_list()[:-1]:  # the input's indexes, as the builder writes them
                key_index.ensure_index(topic.ledger.store, record.ledger_id, compacted=False)  # type: ignore[arg-type]
            with fault:
                Compactor(CompactionConfig(engine="local")).compact(topic)
            ledgers = os.listdir(tmp_path / "True" / "ledgers")
            assert topic.view is not None and topic.view.ledger_ids
            for ledger_id in topic.view.ledger_ids:
                assert f"{ledger_id:020d}.ledger{INDEX_SUFFIX}" not in ledgers
            assert not [name for name in ledgers if name.endswith(key_index.TEMP_SUFFIX)]
        else:
            Compactor(CompactionConfig(engine="local", key_index=False)).compact(topic)
        views[with_index] = _view(topic)
    assert views[True] == views[False]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_index_is_never_used_the_run_parses_that_ledger_and_writes_it_again(
    tmp_path: Path, opened: list[DataDir], damage: str,
) -> None:
    from compactor.local.key_index import ensure_index
    views = {}
    for key_index in (False, True):
        topic = _open(tmp_path / str(key_index), opened)
        _append(topic.ledger, _workload(1, 30))
        store = topic.ledger.store
        ledgers = os.path.join(str(tmp_path / str(key_index)), "ledgers")
        for record in topic.ledger.ledger_list()[:-1]:  # what the builder writes at seal
            ensure_index(store, record.ledger_id, compacted=False)  # type: ignore[arg-type]
        damaged = [name for name in sorted(os.listdir(ledgers)) if name.endswith(INDEX_SUFFIX)]
        assert damaged
        for name in damaged:
            _damage(os.path.join(ledgers, name), damage)
        Compactor(CompactionConfig(engine="local", key_index=key_index)).compact(topic)
        views[key_index] = _view(topic)
    assert views[True] == views[False]
    from compactor.local.key_index import IndexedLedger, read_index
    from ledger.storage.sealed_file import SealedFile
    ledgers = os.path.join(str(tmp_path / "True"), "ledgers")
    checked = 0
    for name in sorted(os.listdir(ledgers)):
        if name.endswith(INDEX_SUFFIX):
            ledger_file = os.path.join(ledgers, name[: -len(INDEX_SUFFIX)])
            sealed = SealedFile.open(ledger_file, int(name.split(".")[0]))
            assert sealed is not None
            assert read_index(ledger_file + INDEX_SUFFIX,
                              IndexedLedger(sealed.ledger_id, sealed.entries, sealed.size_bytes)) is not None
            sealed.close()
            checked += 1
    assert checked


def _damage(path: str, how: str) -> None:
    with open(path, "r+b") as file:
        size = os.fstat(file.fileno()).st_size
        if how == "truncate":
            file.truncate(size // 2)
        elif how == "empty":
            file.truncate(0)
        else:
            file.seek(size // 3)
            byte = file.read(1)
            file.seek(size // 3)
            file.write(bytes([byte[0] ^ 0xFF]))


def test_a_sealed_ledger_read_at_the_offsets_its_index_recorded_gives_the_stores_entries(
    tmp_path: Path, opened: list[DataDir],
) -> None:
    from compactor.local.index_source import IndexSource
    topic = _open(tmp_path, opened)
    _append(topic.ledger, _workload(3, 40))
    store = topic.ledger.store
    sealed = [record for record in topic.ledger.ledger_list()[:-1] if record.entries]
    assert sealed
    source = IndexSource(store, lambda size: None)  # type: ignore[arg-type]
    for record in sealed:
        whole = LedgerRange(record.ledger_id, 0, record.entries - 1)
        source.load(whole, ("flags",))
        every = list(range(record.entries))
        assert source.read(whole, every) == list(store.read(record.ledger_id, 0, record.entries - 1))
        assert source.read(whole, every[1::3]) == [store.read(record.ledger_id, at, at)[0] for at in every[1::3]]
    source.close()
