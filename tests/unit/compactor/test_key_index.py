"""The key index says what the reference reader says, and a bad index file is never used.

``build_index`` (``compactor.local.key_index``) is checked row by row against the reference
reader (``message.entry``: ``parse_entry``, ``iter_messages``, ``batch_slots``) over
the generated entries of ``test_fast_path`` (batched and not, keyed and key-less,
tombstones, ``compacted_out`` slots, markers, chunks, every codec, encrypted entries, and
any of those corrupted at random): the key hash, the flags, the batch index and size, the
publish time, and ``slot_end``, which must cut the decompressed body into exactly the
slots the reference splits. An index survives ``write_index``/``read_index`` unchanged.

A file that is not a whole index of the very ledger (bytes flipped anywhere, cut short,
empty, another ledger's index, the index of the ledger at another size) raises
``CorruptIndexError`` from ``read_index``; ``ensure_index`` then parses the ledger and
writes a correct index over it, as it does when the file is missing.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.local.index_builds import (
    INDEX_MIN_ENTRIES,
    KeyIndexBuilds,
    build_key_index,
    unindexed_ledgers,
)
from compactor.local.key_index import (
    FLAG_CHUNK,
    FLAG_COMPACTED_OUT,
    FLAG_KEYLESS,
    FLAG_MARKER,
    FLAG_OPAQUE,
    FLAG_TOMBSTONE,
    INDEX_SUFFIX,
    TEMP_SUFFIX,
    CorruptIndexError,
    IndexedLedger,
    IndexWriter,
    KeyIndex,
    build_index,
    ensure_index,
    index_path,
    read_index,
    write_index,
)
from compactor.local.keymap import key_hash
from compactor.local.scan import scan_entry
from compactor.view.view import CompactedEntry, encode_compacted_entry
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name
from ledger.storage.sidecars import SIDECAR_SUFFIXES, TEMP_SIDECAR_SUFFIXES
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.compactor.test_fast_path import any_entries, reference_seen

LEDGER_ID = 7
BUILD_BOUND_S = 60.0  # a worker process starts and indexes two ledgers
PROPERTY = settings(max_examples=300, deadline=None)
FILE_PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


_LOCATION = ("entry_offset", "stored_bytes")  # where the entry lies in its file, not what it holds


def _rows_of_entry(index: KeyIndex, stored: int) -> dict[str, list[int]]:
    mask = index["stored"] == stored
    return {name: column[mask].tolist() for name, column in index.columns.items() if name not in _LOCATION}


def _expected_rows(stored: int, data: bytes) -> dict[str, list[int]]:
    """One entry's rows, from the reference reader alone."""
    seen = reference_seen(data)
    rows: dict[str, list[int]] = {}

    def row(batch_index: int, key: str | None, flags: int, slot_end: int = 0) -> None:
        hashed = key_hash(key) if key is not None else (0, 0)
        publish = 0 if seen.kind in ("opaque", "marker") else seen_publish_time(data)
        for name, value in (("stored", stored), ("ledger_id", LEDGER_ID), ("entry_id", stored),
                            ("batch_index", batch_index), ("batch_size", seen.batch_size),
                            ("hash_high", hashed[0]), ("hash_low", hashed[1]), ("flags", flags),
                            ("publish_time", publish), ("slot_end", slot_end), ("entry_bytes", len(data))):
            rows.setdefault(name, []).append(value)

    if seen.kind in ("opaque", "marker"):
        row(-1, None, FLAG_OPAQUE if seen.kind == "opaque" else FLAG_MARKER)
        return rows
    chunk = FLAG_CHUNK if seen.chunk is not None else 0
    live = {batch_index: (key, tombstone) for batch_index, key, tombstone in seen.messages}
    if seen.kind == "single":
        [(key, tombstone)] = live.values()
        row(-1, key, _flags(key, tombstone) | chunk)
        return rows
    end = 0
    for batch_index, slot in enumerate(seen.slots):
        end += len(slot)
        if batch_index in live:
            key, tombstone = live[batch_index]
            row(batch_index, key, _flags(key, tombstone) | chunk, end)
        else:
            row(batch_index, None, FLAG_COMPACTED_OUT | FLAG_KEYLESS, end)
    return rows


def _flags(key: str | None, tombstone: bool) -> int:
    if key is None:
        return FLAG_KEYLESS
    return FLAG_TOMBSTONE if tombstone else 0


def seen_publish_time(data: bytes) -> int:
    from message.entry import parse_entry

    return int(parse_entry(data).metadata.publish_time)


# -- agreement with the reference reader ---------------------------------------------------------


@PROPERTY
@given(st.lists(any_entries, min_size=1, max_size=8))
def test_the_index_rows_say_what_the_reference_reader_says(drafts: list[tuple[object, bytes, object, int]]) -> None:
    entries = [draft[1] for draft in drafts]
    index = build_index((stored, LEDGER_ID, stored, data) for stored, data in enumerate(entries))
    assert index.entries == len(entries)
    for stored, data in enumerate(entries):
        assert _rows_of_entry(index, stored) == _expected_rows(stored, data)
    assert np.all(np.diff(index["stored"].astype(np.int64)) >= 0)  # stream order


@PROPERTY
@given(any_entries)
def test_slot_end_cuts_the_batch_body_into_exactly_the_slots_the_reference_splits(
    draft: tuple[object, bytes, object, int],
) -> None:
    data = draft[1]
    scan = scan_entry(data)
    seen = reference_seen(data)
    index = build_index([(0, LEDGER_ID, 0, data)])
    if seen.kind != "batch":
        assert index["slot_end"].tolist() == [0] * len(index)
        return
    assert scan.batch is not None
    ends = [int(end) for end in index["slot_end"]]
    starts = [0, *ends[:-1]]
    cut = tuple(scan.batch.body[start:end] for start, end in zip(starts, ends, strict=True))
    assert cut == seen.slots == tuple(scan.batch.slots())
    assert ends[-1] <= len(scan.batch.body)


@FILE_PROPERTY
@given(st.lists(any_entries, max_size=8))
def test_an_index_reads_back_exactly_as_it_was_written(
    tmp_path: Path, drafts: list[tuple[object, bytes, object, int]],
) -> None:
    entries = [draft[1] for draft in drafts]
    index = build_index((stored, LEDGER_ID, stored, data) for stored, data in enumerate(entries))
    ledger = IndexedLedger(LEDGER_ID, len(entries), sum(map(len, entries)))
    path = str(tmp_path / "ledger.kidx")
    write_index(path, index, ledger)
    back = read_index(path, ledger)
    assert back is not None and back.entries == index.entries
    for name, column in index.columns.items():
        assert back[name].dtype == column.dtype and np.array_equal(back[name], column), name
    assert [name for name in os.listdir(tmp_path) if name.endswith(TEMP_SUFFIX)] == []


def _metadata_of(path: str) -> dict[bytes, bytes]:
    """A file's key-value metadata as ``read_index`` sees it (but the Arrow schema's own)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet:
        metadata = parquet.read(columns=["stored"]).schema.metadata or {}
    return {key: value for key, value in metadata.items() if key != b"ARROW:schema"}


@FILE_PROPERTY
@given(st.lists(any_entries, max_size=8), st.lists(st.integers(0, 40), max_size=6), st.integers(1, 8))
def test_an_index_streamed_in_parts_reads_back_as_the_index_written_whole(
    tmp_path: Path, drafts: list[tuple[object, bytes, object, int]], cuts: list[int], rows_min: int,
) -> None:
    """``IndexWriter``: parts of any sizes (empty ones too) give the columns, dtypes,
    metadata and checksums ``write_index`` gives; nothing is under the name before
    ``commit``; fewer than ``row_group_rows_min`` rows ever wait, and no row group but the
    last is smaller."""
    import pyarrow.parquet as pq

    entries = [draft[1] for draft in drafts]
    index = build_index(((stored, LEDGER_ID, stored, data) for stored, data in enumerate(entries)),
                        (list(range(len(entries))), [len(data) for data in entries]))
    ledger = IndexedLedger(LEDGER_ID, len(entries), sum(map(len, entries)))
    whole, streamed = str(tmp_path / "whole.kidx"), str(tmp_path / "streamed.kidx")
    for path in (whole, streamed):
        if os.path.exists(path):
            os.unlink(path)
    write_index(whole, index, ledger)
    writer = IndexWriter(streamed, row_group_rows_min=rows_min)
    bounds = sorted({0, len(index), *(min(cut, len(index)) for cut in cuts)})
    for start, end in itertools.pairwise(bounds):
        writer.write({name: column[start:end] for name, column in index.columns.items()})
        assert writer.waiting_rows < rows_min
    assert not os.path.exists(streamed)
    writer.commit(ledger)
    back, reference = read_index(streamed, ledger), read_index(whole, ledger)
    assert back is not None and reference is not None and back.entries == reference.entries == index.entries
    assert back.columns.keys() == reference.columns.keys()
    for name, column in reference.columns.items():
        assert back[name].dtype == column.dtype and np.array_equal(back[name], column), name
    assert _metadata_of(streamed) == _metadata_of(whole)
    with pq.ParquetFile(streamed) as parquet:
        groups = [parquet.metadata.row_group(group).num_rows for group in range(parquet.metadata.num_row_groups)]
    assert sum(groups) == len(index) and all(rows >= rows_min for rows in groups[:-1])
    assert [name for name in os.listdir(tmp_path) if name.endswith(TEMP_SUFFIX)] == []


def test_a_streamed_index_given_up_or_failing_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    entries = [_entry(index) for index in range(6)]
    index = build_index((stored, LEDGER_ID, stored, data) for stored, data in enumerate(entries))
    ledger = IndexedLedger(LEDGER_ID, len(entries), sum(map(len, entries)))
    path = str(tmp_path / "ledger.kidx")
    write_index(path, index, ledger)
    previous = Path(path).read_bytes()
    part = {name: column[:3] for name, column in index.columns.items()}
    given_up = IndexWriter(path, row_group_rows_min=1)
    given_up.write(part)
    assert [name for name in os.listdir(tmp_path) if name.endswith(TEMP_SUFFIX)]  # it was being written
    given_up.abort()
    failing = IndexWriter(path)
    with pytest.raises(ValueError, match="length"):
        failing.write({**part, "flags": index["flags"]})
    assert Path(path).read_bytes() == previous
    assert sorted(os.listdir(tmp_path)) == ["ledger.kidx"]


def test_the_ledger_layer_knows_the_index_files_as_sidecars() -> None:
    assert INDEX_SUFFIX in SIDECAR_SUFFIXES
    assert TEMP_SUFFIX in TEMP_SIDECAR_SUFFIXES


# -- a ledger on disk ----------------------------------------------------------------------------

KEYS = [f"key-{index}" for index in range(9)]


def _entry(index: int) -> bytes:
    """A keyed single message, a batch (one slot a tombstone), or a key-less message."""
    publish = 1_700_000_000_000 + index
    if index % 3 == 0:
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=publish,
                                      partition_key=KEYS[index % len(KEYS)])
        return encode_entry(metadata, f"v{index}".encode(), with_checksum=True)
    if index % 3 == 1:
        slots = [(pb.SingleMessageMetadata(partition_key=KEYS[(index + slot) % len(KEYS)],
                                           payload_size=0 if slot == 1 else 2), b"" if slot == 1 else b"vv")
                 for slot in range(3)]
        return encode_batch(pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=publish),
                            slots, pb.ZSTD if index % 2 else pb.NONE, with_checksum=True)
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=publish)
    return encode_entry(metadata, b"keyless", with_checksum=False)


def sealed_topic(root: Path, entries: int, per_ledger: int) -> tuple[DataDir, list[int]]:
    """A data dir whose topic holds ``entries`` entries in sealed ledgers of ``per_ledger``."""
    data_dir = DataDir.open(str(root))
    ledger = ManagedLedger.open("persistent://public/default/indexed", data_dir.ledgers, data_dir.metadata,
                                ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    futures = [ledger.append(_entry(index)) for index in range(entries)]
    for future in futures:
        future.result(timeout=10)
    ledger.close()
    return data_dir, [record.ledger_id for record in data_dir.metadata.topic_ledgers(ledger.name)]


def reference_index(store: FileLedgerStore, ledger_id: int) -> KeyIndex:
    """The index parsed afresh from the ledger, never from a file."""
    entries = store.info(ledger_id).last_add_confirmed + 1
    data = store.read(ledger_id, 0, entries - 1)
    return build_index((stored, ledger_id, stored, entry) for stored, entry in enumerate(data))


def same_index(left: KeyIndex, right: KeyIndex) -> bool:
    """The same rows (where each entry lies in the file aside: a reference parse does not
    know it)."""
    return left.entries == right.entries and all(
        np.array_equal(left[name], right[name]) for name in left.columns if name not in _LOCATION)


def ledger_facts(store: FileLedgerStore, ledger_id: int) -> IndexedLedger:
    info = store.info(ledger_id)
    return IndexedLedger(ledger_id, info.last_add_confirmed + 1, info.size_bytes)


@pytest.fixture(scope="module")
def two_ledgers(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[int]]:
    """A ledger directory with two sealed ledgers of 40 entries, and their index files
    (``ensure_index`` wrote them); tests copy it."""
    root = tmp_path_factory.mktemp("two-ledgers")
    data_dir, ledger_ids = sealed_topic(root / "data", 80, 40)
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    for ledger_id in ledger_ids:
        ensure_index(store, ledger_id, compacted=False)
    ledgers_root = store.root
    data_dir.close()
    return ledgers_root, ledger_ids


def _copy(two_ledgers: tuple[str, list[int]], tmp_path: Path) -> tuple[FileLedgerStore, list[int], list[str]]:
    source, ledger_ids = two_ledgers
    root = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(source, root)
    store = FileLedgerStore(str(root), read_only=True)
    paths = [index_path(os.path.join(store.root, ledger_file_name(ledger_id))) for ledger_id in ledger_ids]
    return store, ledger_ids, paths


def _assert_falls_back_and_rewrites(store: FileLedgerStore, ledger_id: int, path: str) -> None:
    ledger = ledger_facts(store, ledger_id)
    with pytest.raises(CorruptIndexError):
        read_index(path, ledger)
    expected = reference_index(store, ledger_id)
    assert same_index(ensure_index(store, ledger_id, compacted=False), expected)  # parsed, not the bad file
    rewritten = read_index(path, ledger)
    assert rewritten is not None and same_index(rewritten, expected)


@FILE_PROPERTY
@given(where=st.floats(0, 1, exclude_max=True), bits=st.integers(1, 255))
def test_an_index_with_bytes_flipped_anywhere_is_refused_and_rebuilt(
    two_ledgers: tuple[str, list[int]], tmp_path: Path, where: float, bits: int,
) -> None:
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    raw = bytearray(Path(paths[0]).read_bytes())
    offset = int(where * len(raw))
    raw[offset] ^= bits
    Path(paths[0]).write_bytes(bytes(raw))
    ledger = ledger_facts(store, ledger_ids[0])
    try:
        read = read_index(paths[0], ledger)
    except CorruptIndexError:
        read = None
    if read is not None:  # a byte no reader looks at (padding, unused statistics): still exact
        assert same_index(read, reference_index(store, ledger_ids[0])), offset
    else:
        _assert_falls_back_and_rewrites(store, ledger_ids[0], paths[0])
    store.shutdown()


def test_a_byte_flipped_at_every_seventh_offset_is_refused_or_changes_nothing(
    two_ledgers: tuple[str, list[int]], tmp_path: Path,
) -> None:
    """Exhaustive in stride: every run of seven bytes of the file (data pages, the
    footer's schema, statistics and key-value metadata) gets a flip; each reads back as
    the exact index or raises ``CorruptIndexError``, never anything else."""
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    raw = Path(paths[0]).read_bytes()
    ledger = ledger_facts(store, ledger_ids[0])
    expected = reference_index(store, ledger_ids[0])
    refused = 0
    for offset in range(0, len(raw), 7):
        damaged = bytearray(raw)
        damaged[offset] ^= 0xFF
        Path(paths[0]).write_bytes(bytes(damaged))
        try:
            read = read_index(paths[0], ledger)
        except CorruptIndexError:
            refused += 1
            continue
        assert read is not None and same_index(read, expected), offset
    assert refused > len(raw) // 7 // 2  # most bytes matter
    store.shutdown()


@FILE_PROPERTY
@given(where=st.floats(0, 1, exclude_max=True))
def test_an_index_cut_short_anywhere_is_refused_and_rebuilt(
    two_ledgers: tuple[str, list[int]], tmp_path: Path, where: float,
) -> None:
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    raw = Path(paths[0]).read_bytes()
    Path(paths[0]).write_bytes(raw[: int(where * len(raw))])
    _assert_falls_back_and_rewrites(store, ledger_ids[0], paths[0])
    store.shutdown()


def test_an_empty_index_file_is_refused_and_rebuilt(two_ledgers: tuple[str, list[int]], tmp_path: Path) -> None:
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    Path(paths[1]).write_bytes(b"")
    _assert_falls_back_and_rewrites(store, ledger_ids[1], paths[1])
    store.shutdown()


def test_another_ledgers_index_under_this_ledgers_name_is_refused_and_rebuilt(
    two_ledgers: tuple[str, list[int]], tmp_path: Path,
) -> None:
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    shutil.copyfile(paths[0], paths[1])  # same entry count: only the ledger id tells them apart
    _assert_falls_back_and_rewrites(store, ledger_ids[1], paths[1])
    store.shutdown()


def test_an_index_of_another_state_of_the_ledger_is_refused(tmp_path: Path) -> None:
    data_dir, ledger_ids = sealed_topic(tmp_path / "data", 12, 100)
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    [ledger_id] = ledger_ids
    path = index_path(os.path.join(store.root, ledger_file_name(ledger_id)))
    facts = ledger_facts(store, ledger_id)
    write_index(path, reference_index(store, ledger_id), IndexedLedger(ledger_id, facts.entries - 1, facts.size_bytes))
    with pytest.raises(CorruptIndexError, match="entries"):
        read_index(path, facts)
    assert same_index(ensure_index(store, ledger_id, compacted=False), reference_index(store, ledger_id))
    data_dir.close()


def test_a_missing_index_is_parsed_and_written(two_ledgers: tuple[str, list[int]], tmp_path: Path) -> None:
    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    os.unlink(paths[0])
    ledger = ledger_facts(store, ledger_ids[0])
    assert read_index(paths[0], ledger) is None
    assert same_index(ensure_index(store, ledger_ids[0], compacted=False), reference_index(store, ledger_ids[0]))
    written = read_index(paths[0], ledger)
    assert written is not None and same_index(written, reference_index(store, ledger_ids[0]))
    store.shutdown()


def test_an_index_that_cannot_be_kept_is_still_given_and_leaves_no_file(
        two_ledgers: tuple[str, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the built index is written: the caller still gets the index (a
    run goes on with it), and neither the index nor its temporary file is left."""
    import errno

    import pyarrow.parquet as pq

    store, ledger_ids, paths = _copy(two_ledgers, tmp_path)
    os.unlink(paths[0])

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    assert same_index(ensure_index(store, ledger_ids[0], compacted=False), reference_index(store, ledger_ids[0]))
    assert not [name for name in os.listdir(os.path.dirname(paths[0]))
                if name.startswith(os.path.basename(paths[0]))]
    store.shutdown()


def test_an_open_ledger_is_parsed_and_never_indexed_on_disk(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"))
    ledger_id = store.create()
    for index in range(5):
        store.append(ledger_id, _entry(index)).result(timeout=10)
    index = ensure_index(store, ledger_id, compacted=False)
    assert index.entries == 5 and same_index(index, reference_index(store, ledger_id))
    assert not os.path.exists(index_path(os.path.join(store.root, ledger_file_name(ledger_id))))
    store.shutdown()


def test_a_compacted_ledgers_index_gives_the_original_positions(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"))
    ledger_id = store.create(durable_at_seal=True)
    originals = [(Position(3, 10 + index * 2), _entry(index)) for index in range(6)]
    for position, data in originals:
        store.append(ledger_id, encode_compacted_entry(CompactedEntry(position, data))).result(timeout=10)
    store.close(ledger_id)
    index = ensure_index(store, ledger_id, compacted=True)
    expected = build_index((stored, position.ledger_id, position.entry_id, data)
                           for stored, (position, data) in enumerate(originals))
    assert same_index(index, expected)
    reread = read_index(index_path(os.path.join(store.root, ledger_file_name(ledger_id))),
                        ledger_facts(store, ledger_id))
    assert reread is not None and same_index(reread, expected)
    store.shutdown()


# -- background builds ---------------------------------------------------------------------------


def test_background_builds_index_the_sealed_ledgers_in_a_worker_process(tmp_path: Path) -> None:
    data_dir, ledger_ids = sealed_topic(tmp_path / "data", 2 * INDEX_MIN_ENTRIES + 7, INDEX_MIN_ENTRIES)
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    missing = unindexed_ledgers(data_dir.metadata, store.root)
    assert [ledger_id for ledger_id, _ in missing] == ledger_ids[:2]  # the third has 7 entries: left to the run
    builds = KeyIndexBuilds(store.root)
    try:
        for ledger_id, entries in missing:
            builds.submit(ledger_id, entries)
        builds.submit(ledger_ids[2], 7)
        started = time.monotonic()
        while builds.built < 2 and time.monotonic() - started < BUILD_BOUND_S:
            time.sleep(0.05)
        assert builds.built == 2
        assert builds.pids() and os.getpid() not in builds.pids()
    finally:
        builds.close()
    assert builds.pids() == []
    for ledger_id in ledger_ids[:2]:
        read = read_index(index_path(os.path.join(store.root, ledger_file_name(ledger_id))),
                          ledger_facts(store, ledger_id))
        assert read is not None and same_index(read, reference_index(store, ledger_id))
    assert unindexed_ledgers(data_dir.metadata, store.root) == []
    data_dir.close()


def test_a_build_of_a_deleted_ledger_leaves_no_index(tmp_path: Path) -> None:
    data_dir, ledger_ids = sealed_topic(tmp_path / "data", 30, 10)
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    store.delete(ledger_ids[0])
    assert build_key_index(store.root, ledger_ids[0]) == -1
    assert build_key_index(store.root, ledger_ids[1]) == len(reference_index(store, ledger_ids[1]))
    names = os.listdir(store.root)
    assert ledger_file_name(ledger_ids[0]) + INDEX_SUFFIX not in names
    assert ledger_file_name(ledger_ids[1]) + INDEX_SUFFIX in names
    data_dir.close()
