"""The Spark engine's executor work over key indexes (``compactor.spark.index_scan``), no Spark.

* Phase one: a piece's rows read from its ledger's key index are the rows the parsing
  reader gives (``compactor.spark.rows.phase_one_batches``), row for row, over generated
  streams of every entry kind (chunks included), in sealed and open ledgers, cut into
  pieces anywhere, with tombstone retention or without.
* Phase two: groups rewritten from the indexes, given their share of phase one's
  decisions, concatenate to ``compactor.algorithm.phase_two``'s entries byte for byte.
* The index: a missing one is built by the first read and written (temporary file,
  rename) for the next, which parses nothing; a damaged one fails its CRC check and is
  rebuilt; the reads go through the ``pyarrow.fs.FileSystem`` given.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor import key_index
from compactor.algorithm import phase_one, phase_two
from compactor.engine import LedgerRange
from compactor.spark import index_scan, rows
from ledger.managed_ledger import Entry
from ledger.position import Position
from ledger.storage import FileLedgerStore, SyncPolicy
from tests.strategies import StreamEntry, streams
from tests.unit.compactor.test_group_phase_two import decisions

PROPERTY = settings(max_examples=60, deadline=None)
PUBLISHED_AT = 1_700_000_000_000
CUTOFFS = st.sampled_from([None, PUBLISHED_AT, PUBLISHED_AT + 1])


def _write(root: str, stream: list[StreamEntry], cuts: list[int], seal_last: bool) -> list[Entry]:
    """The stream's entries written into raw ledgers under ``root`` (a new ledger at each
    cut; the last one left open unless ``seal_last``), at the positions they get there."""
    store = FileLedgerStore(root, sync=SyncPolicy.NONE)
    entries: list[Entry] = []
    try:
        bounds = sorted({0, len(stream), *(min(cut, len(stream)) for cut in cuts)})
        for number, (first, last) in enumerate(itertools.pairwise(bounds)):
            ledger_id = store.create()
            for item in stream[first:last]:
                entry_id = store.append(ledger_id, item.data).result()
                entries.append(Entry(Position(ledger_id, entry_id), item.data))
            if seal_last or number < len(bounds) - 2:
                store.close(ledger_id)
    finally:
        store.shutdown()
    return entries


def _pieces(entries: list[Entry], cuts: list[int]) -> list[list[Entry]]:
    """``entries`` cut at ``cuts`` and at every ledger change: each piece in one ledger."""
    bounds = sorted({0, len(entries), *(min(cut, len(entries)) for cut in cuts)})
    pieces = []
    for first, last in itertools.pairwise(bounds):
        for _, part in itertools.groupby(entries[first:last], key=lambda entry: entry.position.ledger_id):
            pieces.append(list(part))
    return pieces


def _range(piece: list[Entry]) -> LedgerRange:
    return LedgerRange(piece[0].position.ledger_id, piece[0].position.entry_id, piece[-1].position.entry_id)


def _rows(batches: Any) -> Counter[tuple[Any, ...]]:
    table = pa.Table.from_batches(list(batches), schema=rows.PHASE_ONE_SCHEMA)
    return Counter(tuple(row.values()) for row in table.to_pylist())


def _columns(cutoff: int | None, columns: tuple[str, ...]) -> tuple[str, ...]:
    return columns + (() if cutoff is None else ("publish_time",))


@PROPERTY
@given(stream=streams(max_size=40), ledger_cuts=st.lists(st.integers(0, 40), max_size=2),
       piece_cuts=st.lists(st.integers(0, 40), max_size=3), seal_last=st.booleans(), retain_null_key=st.booleans(),
       cutoff=CUTOFFS)
def test_the_index_gives_the_parsers_phase_one_rows_and_the_local_phase_two_byte_for_byte(
    stream: list[StreamEntry], ledger_cuts: list[int], piece_cuts: list[int], seal_last: bool,
    retain_null_key: bool, cutoff: int | None,
) -> None:
    with tempfile.TemporaryDirectory() as root:
        entries = _write(root, stream, ledger_cuts, seal_last)
        result = phase_one(entries, keep_tombstones_since_ms=cutoff)
        expected = list(phase_two(entries, result, retain_null_key=retain_null_key, keep_tombstones_since_ms=cutoff))
        retained, dropped = decisions(entries, result, retain_null_key)
        rewritten = []
        for group, piece in enumerate(_pieces(entries, piece_cuts)):
            whole = _range(piece)
            index = index_scan.PieceIndex(root, whole, _columns(cutoff, index_scan.PHASE_ONE_COLUMNS))
            try:
                from_index = _rows(index_scan.phase_one_batches(index, group, cutoff))
            finally:
                index.close()
            assert from_index == _rows(rows.phase_one_batches(root, whole, group, cutoff))

            mine = {(entry.position.ledger_id, entry.position.entry_id) for entry in piece}
            slots = sorted(slot for slot in retained if slot[:2] in mine)
            ats = sorted(at for at in dropped if at in mine)
            share = index_scan.GroupDecisions(
                tuple(np.array([slot[field] for slot in slots], np.int64) for field in range(3)),
                tuple(np.array([at[field] for at in ats], np.int64) for field in range(2)))
            assert len(share) == len(slots)
            index = index_scan.PieceIndex(root, whole, _columns(cutoff, index_scan.PHASE_TWO_COLUMNS))
            try:
                rewritten.extend(index_scan.survivors(index, share, retain_null_key=retain_null_key,
                                                      keep_tombstones_since_ms=cutoff))
            finally:
                index.close()
        assert rewritten == expected


def _sealed_ledger(root: Path, count: int = 50) -> LedgerRange:
    from tests.unit.compactor.test_spark_rewrite_attempts import _message

    store = FileLedgerStore(str(root), sync=SyncPolicy.NONE)
    try:
        ledger_id = store.create()
        for number in range(count):
            store.append(ledger_id, _message(f"k{number % 7}", b"v%d" % number)).result()
        store.close(ledger_id)
    finally:
        store.shutdown()
    return LedgerRange(ledger_id, 0, count - 1)


def _phase_one(root: Path, whole: LedgerRange, filesystem: Any = None) -> Counter[tuple[Any, ...]]:
    index = index_scan.PieceIndex(str(root), whole, index_scan.PHASE_ONE_COLUMNS, filesystem)
    try:
        return _rows(index_scan.phase_one_batches(index, 0, None))
    finally:
        index.close()


def test_a_missing_index_is_built_once_and_kept_and_a_damaged_one_is_rebuilt(tmp_path: Path) -> None:
    whole = _sealed_ledger(tmp_path)
    path = index_scan.index_file(str(tmp_path), whole.ledger_id)
    assert index_scan.ledger_ids_without_index(str(tmp_path), [whole.ledger_id]) == [whole.ledger_id]
    assert index_scan.ensure_ledger_index(str(tmp_path), whole.ledger_id, False) == 50
    assert os.path.exists(path) and not [name for name in os.listdir(tmp_path) if key_index.TEMP_SUFFIX in name]
    assert index_scan.ledger_ids_without_index(str(tmp_path), [whole.ledger_id], pafs.LocalFileSystem()) == []
    expected = _rows(rows.phase_one_batches(str(tmp_path), whole, 0, None))

    with mock.patch.object(key_index, "build_index", side_effect=AssertionError("parsed")):
        assert _phase_one(tmp_path, whole) == expected  # read from the index: nothing parsed

    data = bytearray(Path(path).read_bytes())
    data[len(data) // 3] ^= 0xFF  # a damaged page or column
    Path(path).write_bytes(bytes(data))
    with mock.patch.object(key_index, "build_index", wraps=key_index.build_index) as built:
        assert _phase_one(tmp_path, whole) == expected
    assert built.call_count == 1  # the CRC check caught it, the ledger was parsed again
    # and written back whole for the next run
    assert key_index.read_index(path, key_index.IndexedLedger(whole.ledger_id, 50, _size(tmp_path, whole))) is not None


def _size(root: Path, whole: LedgerRange) -> int:
    from ledger.storage.sealed_file import SealedFile

    sealed = SealedFile.open(key_index.ledger_path(str(root), whole.ledger_id), whole.ledger_id)
    assert sealed is not None
    try:
        return sealed.size_bytes
    finally:
        sealed.close()


class _Counting(pafs.FileSystemHandler):
    """The local file system, counting the files opened for reading."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()
        self.opened: list[str] = []

    def open_input_file(self, path: str) -> Any:
        self.opened.append(path)
        return self.local.open_input_file(path)

    def open_input_stream(self, path: str) -> Any:
        self.opened.append(path)
        return self.local.open_input_stream(path)

    def get_type_name(self) -> str:
        return "counting"

    def get_file_info(self, paths: Any) -> Any:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.local.get_file_info(selector)

    def normalize_path(self, path: str) -> str:
        return self.local.normalize_path(path)

    def equals(self, other: Any) -> bool:
        return other is self

    def _unused(self, *args: Any) -> Any:
        raise NotImplementedError

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _unused
    move = copy_file = open_output_stream = open_append_stream = _unused


def test_indexes_are_read_through_the_file_system_given(tmp_path: Path) -> None:
    whole = _sealed_ledger(tmp_path)
    index_scan.ensure_ledger_index(str(tmp_path), whole.ledger_id, False)
    handler = _Counting()
    filesystem = pafs.PyFileSystem(handler)
    assert _phase_one(tmp_path, whole, filesystem) == _rows(rows.phase_one_batches(str(tmp_path), whole, 0, None))
    assert handler.opened == [index_scan.index_file(str(tmp_path), whole.ledger_id)]
    assert index_scan.ledger_ids_without_index(str(tmp_path), [whole.ledger_id, whole.ledger_id + 1], filesystem) \
        == [whole.ledger_id + 1]
