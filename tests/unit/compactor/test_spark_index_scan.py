"""The Spark engine's executor work over key indexes (``compactor.spark.index_scan``), no Spark.

* Phase one: the keyed rows read from the pieces' key indexes, folded by key to their
  greatest ``v`` (as Spark's aggregation does), keep exactly the live keys of
  ``compactor.local.algorithm.phase_one``, at its positions, over generated streams of every
  entry kind (chunks included), in sealed and open ledgers, cut into pieces anywhere,
  with tombstone retention or without.
* Phase two: groups rewritten from the indexes, given their share of phase one's
  decisions, concatenate to ``compactor.local.algorithm.phase_two``'s entries byte for byte.
* The index: a missing one is built by the first read and written (temporary file,
  rename) for the next, which parses nothing; a damaged one fails its CRC check and is
  rebuilt. An executor given only a bucket (no data dir) reads an offloaded ledger there,
  and keeps the index it builds there, as the ledger's sidecar object.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.engine import LedgerRange
from compactor.local import key_index
from compactor.local.algorithm import phase_one, phase_two
from compactor.local.keymap import key_hash
from compactor.spark import index_scan, rows
from ledger.managed_ledger import Entry
from ledger.position import Position
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.object_fs import BucketConfig
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


def _latest(places: dict[tuple[int, int], int], batches: Any) -> None:
    """Fold keyed rows into ``places`` (key hash: greatest ``v``), as Spark's max does."""
    for row in pa.Table.from_batches(list(batches), schema=index_scan.PHASE_ONE_ROWS).to_pylist():
        key = (row["h1"], row["h2"])
        places[key] = max(places.get(key, row["v"]), row["v"])


def _seqs(index: index_scan.PieceIndex, piece: int, wanted: Any) -> list[int]:
    """The stream places of the piece's rows for which ``wanted(ledger, entry, batch, flags)``."""
    rows = index.rows
    return [(piece << index_scan.ROW_BITS) | at for at in range(len(rows["flags"]))
            if wanted(int(rows["ledger_id"][at]), int(rows["entry_id"][at]), int(rows["batch_index"][at]),
                      int(rows["flags"][at]))]


def _columns(cutoff: int | None, columns: tuple[str, ...]) -> tuple[str, ...]:
    return columns + (() if cutoff is None else ("publish_time",))


@PROPERTY
@given(stream=streams(max_size=40), ledger_cuts=st.lists(st.integers(0, 40), max_size=2),
       piece_cuts=st.lists(st.integers(0, 40), max_size=3), seal_last=st.booleans(), retain_null_key=st.booleans(),
       cutoff=CUTOFFS, task_keeps_last_index=st.booleans())
def test_phase_one_from_the_index_keeps_the_local_keys_and_phase_two_writes_the_local_entries_byte_for_byte(
    stream: list[StreamEntry], ledger_cuts: list[int], piece_cuts: list[int], seal_last: bool,
    retain_null_key: bool, cutoff: int | None, task_keeps_last_index: bool,
) -> None:
    with tempfile.TemporaryDirectory() as root:
        entries = _write(root, stream, ledger_cuts, seal_last)
        result = phase_one(entries, keep_tombstones_since_ms=cutoff)
        expected = list(phase_two(entries, result, retain_null_key=retain_null_key, keep_tombstones_since_ms=cutoff))
        retained, dropped = decisions(entries, result, retain_null_key)
        pieces = [_range(piece) for piece in _pieces(entries, piece_cuts)]

        def last() -> index_scan.LastIndex | None:  # a task's ledger index read once for its pieces
            return index_scan.LastIndex() if task_keeps_last_index else None

        latest: dict[tuple[int, int], int] = {}
        task = last()
        for number, whole in enumerate(pieces):  # phase one as the executors and Spark's max do it
            index = index_scan.PieceIndex(root, whole, _columns(cutoff, index_scan.PHASE_ONE_COLUMNS), last=task)
            try:
                _latest(latest, index_scan.keyed_batches(index, number, cutoff))
            finally:
                index.close()
        live = sorted(v >> index_scan.FLAG_BITS for v in latest.values() if not v & 1)
        assert len(live) == len(retained)  # the local phase one's live keys

        rewritten, expected_live, expected_dropped = [], [], []
        task = last()
        for number, whole in enumerate(pieces):
            index = index_scan.PieceIndex(root, whole, _columns(cutoff, index_scan.PHASE_TWO_COLUMNS), last=task)
            try:
                expected_live += _seqs(index, number, lambda ledger, entry, batch, flags: (
                    (ledger, entry, batch) in retained))
                expected_dropped += _seqs(index, number, lambda ledger, entry, batch, flags: (
                    bool(flags & key_index.FLAG_CHUNK) and (ledger, entry) in dropped))
                share = index_scan.GroupDecisions(np.array(live, np.int64), np.array(expected_dropped, np.int64))
                rewritten.extend(index_scan.survivors(index, number, share, retain_null_key=retain_null_key,
                                                      keep_tombstones_since_ms=cutoff))
            finally:
                index.close()
        assert live == sorted(expected_live)  # the same positions, as stream places
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


def _phase_one(root: Path, whole: LedgerRange) -> dict[tuple[int, int], int]:
    index = index_scan.PieceIndex(str(root), whole, index_scan.PHASE_ONE_COLUMNS)
    latest: dict[tuple[int, int], int] = {}
    try:
        _latest(latest, index_scan.keyed_batches(index, 0, None))
    finally:
        index.close()
    return latest


def _keys(whole: LedgerRange) -> dict[tuple[int, int], int]:
    """Each of the 7 keys' latest row (``_sealed_ledger``: one row an entry)."""
    def signed(value: int) -> int:
        return value - (1 << 64) if value >= 1 << 63 else value

    return {tuple(signed(half) for half in key_hash(f"k{key}")): (entry << index_scan.FLAG_BITS)  # type: ignore[misc]
            for key, entry in ((number % 7, number) for number in range(whole.last_entry_id + 1))}


def test_a_missing_index_is_built_once_and_kept_and_a_damaged_one_is_rebuilt(tmp_path: Path) -> None:
    whole = _sealed_ledger(tmp_path)
    path = index_scan.index_file(str(tmp_path), whole.ledger_id)
    assert index_scan.ledger_ids_without_index(str(tmp_path), [whole.ledger_id]) == [whole.ledger_id]
    assert index_scan.ensure_ledger_index(str(tmp_path), whole.ledger_id, False) == 50
    assert os.path.exists(path) and not [name for name in os.listdir(tmp_path) if key_index.TEMP_SUFFIX in name]
    assert index_scan.ledger_ids_without_index(str(tmp_path), [whole.ledger_id]) == []
    expected = _keys(whole)

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


def test_a_task_reads_a_ledgers_index_once_for_its_pieces_and_each_piece_gets_its_own_rows(tmp_path: Path) -> None:
    first, second = _sealed_ledger(tmp_path, 50), _sealed_ledger(tmp_path, 30)
    for whole in (first, second):
        index_scan.ensure_ledger_index(str(tmp_path), whole.ledger_id, False)
    pieces = [LedgerRange(first.ledger_id, start, min(start + 19, 49)) for start in range(0, 50, 20)]
    pieces += [LedgerRange(second.ledger_id, 0, 9), LedgerRange(second.ledger_id, 10, 29)]

    def rows_of(last: index_scan.LastIndex | None) -> list[dict[str, list[int]]]:
        read = []
        for piece in pieces:
            index = index_scan.PieceIndex(str(tmp_path), piece, index_scan.PHASE_TWO_COLUMNS, last=last)
            try:
                read.append({name: column.tolist() for name, column in index.rows.items()})
            finally:
                index.close()
        return read

    alone = rows_of(None)
    with mock.patch.object(index_scan, "sealed_index", wraps=index_scan.sealed_index) as reads:
        assert rows_of(index_scan.LastIndex()) == alone
    assert reads.call_count == 2  # once a ledger, not once a piece
    assert [rows["entry_id"][0] for rows in alone] == [0, 20, 40, 0, 10]  # each piece's own rows


def _size(root: Path, whole: LedgerRange) -> int:
    from ledger.storage.sealed_file import SealedFile

    sealed = SealedFile.open(key_index.ledger_path(str(root), whole.ledger_id), whole.ledger_id)
    assert sealed is not None
    try:
        return sealed.size_bytes
    finally:
        sealed.close()


@pytest.fixture(params=["filesystem", "aws-s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> BucketConfig:
    """An object store: a directory, or a bucket of the real S3 server on loopback."""
    if request.param == "filesystem":
        return BucketConfig("filesystem", str(tmp_path / "bucket"))
    config: BucketConfig = request.getfixturevalue("s3_bucket")
    return config


def test_an_executor_with_only_the_bucket_reads_there_and_keeps_the_index_it_builds_there(
    tmp_path: Path, bucket: BucketConfig,
) -> None:
    root = tmp_path / "ledgers"
    root.mkdir()
    whole = _sealed_ledger(root)
    store = FileLedgerStore(str(root), sync=SyncPolicy.NONE, bucket=bucket)
    try:
        store.upload_sealed(whole.ledger_id)  # the ledger alone: it has no index yet
        store.drop_local(whole.ledger_id)
    finally:
        store.shutdown()
    assert os.listdir(root) == ["LEDGER_ID_SEQUENCE"]  # nothing of the ledger is local any more
    assert index_scan.ledger_ids_without_index(str(root), [whole.ledger_id], bucket) == [whole.ledger_id]

    index = index_scan.PieceIndex(None, whole, index_scan.PHASE_ONE_COLUMNS, bucket)  # no data dir at all
    try:
        assert not os.path.exists(rows.NO_DATA_DIR)
        latest: dict[tuple[int, int], int] = {}
        _latest(latest, index_scan.keyed_batches(index, 0, None))
    finally:
        index.close()
    assert latest == _keys(whole)
    assert index_scan.ledger_ids_without_index(str(root), [whole.ledger_id, whole.ledger_id + 1], bucket) \
        == [whole.ledger_id + 1]  # the index built is now the ledger's sidecar object
    assert os.listdir(root) == ["LEDGER_ID_SEQUENCE"]  # and nothing was written locally

    with mock.patch.object(key_index, "build_index", side_effect=AssertionError("parsed")):
        assert index_scan.ensure_ledger_index(None, whole.ledger_id, False, bucket) == 50  # read, not parsed


@st.composite
def _task_rows(draw: Any) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A task's pieces' keyed rows (``keyed_rows``' shape): per piece, ``v`` ascending; keys
    drawn from a few, some sharing ``h1`` (a collision of the high half); pieces in
    stream order, or, now and then, a piece out of order."""
    keys = draw(st.lists(st.tuples(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=8))
    pieces = []
    for piece in draw(st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True)):
        count = draw(st.integers(0, 30))
        chosen = draw(st.lists(st.sampled_from(keys), min_size=count, max_size=count))
        flags = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
        v = np.array([((piece << index_scan.ROW_BITS | row) << index_scan.FLAG_BITS) | flag
                      for row, flag in enumerate(flags)], np.int64)
        pieces.append((np.array([key[0] for key in chosen], np.int64), np.array([key[1] for key in chosen], np.int64), v))
    return pieces if draw(st.booleans()) else sorted(pieces, key=lambda rows: rows[2][0] if len(rows[2]) else 0)


@PROPERTY
@given(_task_rows(), st.integers(1, 50))
def test_a_task_hands_spark_each_keys_latest_row_and_drops_only_earlier_ones(
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]], rows_max: int) -> None:
    """``TaskKeyedRows`` over a task's pieces (held up to ``rows_max`` rows): folded by key to
    the greatest ``v``, as Spark's aggregation folds them, it gives every key's latest row;
    a row it hands on is one of the input's, and it never hands on more rows than it was
    given; with every piece in stream order, no flush between and no two keys sharing
    ``h1``, one row per key."""
    latest = index_scan.TaskKeyedRows(rows_max)
    batches = [batch for rows in pieces for batch in latest.add(*rows)] + list(latest.flush())
    out: dict[tuple[int, int], int] = {}
    _latest(out, batches)
    given_rows = {(int(h1), int(h2), int(v)) for rows in pieces for h1, h2, v in zip(*rows, strict=True)}
    expected: dict[tuple[int, int], int] = {}
    for h1, h2, v in given_rows:
        expected[(h1, h2)] = max(expected.get((h1, h2), v), v)
    assert out == expected
    handed = pa.Table.from_batches(batches, schema=index_scan.PHASE_ONE_ROWS).to_pylist() if batches else []
    assert all((row["h1"], row["h2"], row["v"]) in given_rows for row in handed)
    assert len(handed) <= len(given_rows)
    in_order = all(len(a[2]) == 0 or len(b[2]) == 0 or a[2][-1] < b[2][0] for a, b in itertools.pairwise(pieces))
    shared_h1 = len({h1 for h1, _ in expected}) < len(expected)
    if in_order and not shared_h1 and sum(len(rows[2]) for rows in pieces) < rows_max:
        assert len(handed) == len(expected)
