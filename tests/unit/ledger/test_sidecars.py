"""No sidecar outlives its ledger, and the on-sealed hook reports every sealed ledger.

Sidecars (``ledger.storage.sidecars``) are files an upper layer keeps beside a sealed
ledger file (the compactor's key index). ``FileLedgerStore.delete`` removes them with the
ledger; a start (``DataDir.collect_orphans``) removes temporary sidecar files and sidecars
whose ledger is gone. ``ManagedLedger``'s ``on_sealed`` hook is how the broker learns that a
ledger was sealed (to index it in the background).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.sealed_writer import ledger_file_name
from ledger.storage.sidecars import SIDECAR_SUFFIXES, TEMP_SIDECAR_SUFFIXES, remove_stale_sidecars

TOPIC = "persistent://public/default/sidecars"


def _sealed_ledger(store: FileLedgerStore, entries: int = 3) -> int:
    ledger_id = store.create()
    for index in range(entries):
        store.append(ledger_id, f"entry-{index}".encode()).result(timeout=10)
    store.close(ledger_id)
    return ledger_id


def _sidecar(store: FileLedgerStore, ledger_id: int, suffix: str = SIDECAR_SUFFIXES[0]) -> str:
    path = os.path.join(store.root, ledger_file_name(ledger_id) + suffix)
    with open(path, "wb") as file:
        file.write(b"derived facts")
    return path


def test_deleting_a_ledger_removes_its_sidecar_with_it(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.ALWAYS)
    kept, doomed = _sealed_ledger(store), _sealed_ledger(store)
    kept_sidecar, doomed_sidecar = _sidecar(store, kept), _sidecar(store, doomed)
    store.delete(doomed)
    assert not os.path.exists(doomed_sidecar)
    assert os.path.exists(kept_sidecar)
    assert store.list() == [kept]
    store.shutdown()


def test_deleting_a_ledger_whose_file_is_gone_still_removes_a_leftover_sidecar(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.ALWAYS)
    ledger_id = _sealed_ledger(store)
    sidecar = _sidecar(store, ledger_id)
    os.unlink(os.path.join(store.root, ledger_file_name(ledger_id)))
    store.delete(ledger_id)
    assert not os.path.exists(sidecar)
    store.shutdown()


def test_a_start_removes_temporary_sidecars_and_sidecars_of_missing_ledgers(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path / "data"))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata,
                                ManagedLedgerConfig(max_entries_per_ledger=2))
    for index in range(5):
        ledger.append(f"m{index}".encode()).result(timeout=10)
    ledger.close()
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    live = [record.ledger_id for record in data_dir.metadata.topic_ledgers(TOPIC)]
    live_sidecar = _sidecar(store, live[0])
    temporary = _sidecar(store, live[1], SIDECAR_SUFFIXES[0] + ".1a2b" + TEMP_SIDECAR_SUFFIXES[0])
    stray = _sidecar(store, live[-1] + 100)  # its ledger was deleted while the sidecar was written
    orphan = _sealed_ledger(store)  # no topic references it: collected, and its sidecar with it
    orphan_sidecar = _sidecar(store, orphan)
    data_dir.close()
    reopened = DataDir.open(str(tmp_path / "data"))
    assert reopened.collect_orphans() == [orphan]
    assert os.path.exists(live_sidecar)
    for gone in (temporary, stray, orphan_sidecar):
        assert not os.path.exists(gone), gone
    reopened.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.tuples(st.integers(1, 6), st.sampled_from(["ledger", "sidecar", "temp"])),
                      max_size=12))
def test_remove_stale_sidecars_keeps_exactly_the_sidecars_of_existing_ledgers(
    tmp_path: Path, names: list[tuple[int, str]],
) -> None:
    root = tmp_path / f"root-{len(list(tmp_path.iterdir()))}"
    root.mkdir()
    for ledger_id, kind in names:
        name = ledger_file_name(ledger_id)
        name += {"ledger": "", "sidecar": SIDECAR_SUFFIXES[0],
                 "temp": SIDECAR_SUFFIXES[0] + ".ff" + TEMP_SIDECAR_SUFFIXES[0]}[kind]
        (root / name).write_bytes(b"x")
    ledgers = {ledger_id for ledger_id, kind in names if kind == "ledger"}
    remove_stale_sidecars(str(root))
    expected = {ledger_file_name(i) for i in ledgers}
    expected |= {ledger_file_name(i) + SIDECAR_SUFFIXES[0] for i, kind in names
                 if kind == "sidecar" and i in ledgers}
    assert set(os.listdir(root)) == expected


def test_the_on_sealed_hook_hears_every_sealed_ledger_with_entries(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    sealed: list[int] = []

    def hear(ledger_id: int, entries: int) -> None:
        assert entries == store.info(ledger_id).last_add_confirmed + 1 > 0
        sealed.append(ledger_id)

    for background in (False, True):
        topic = f"{TOPIC}-{background}"
        ledger = ManagedLedger.open(topic, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=3),
                                    roll_over_in_background=background, on_sealed=hear)
        futures = [ledger.append(f"m{index}".encode()) for index in range(7)]
        positions = [future.result(timeout=10) for future in futures]
        ledger.close()  # seals the third ledger (one entry)
        with_entries = sorted({position.ledger_id for position in positions})
        assert [ledger_id for ledger_id in sealed if ledger_id in with_entries] == with_entries
        assert set(sealed) >= set(with_entries)
    listed = {record.ledger_id for topic in metadata.list_topics() for record in metadata.topic_ledgers(topic)}
    assert set(sealed) == listed  # the empty current ledgers of a close left the list unreported
    store.shutdown()
    metadata.close()


def test_a_ledger_left_open_by_a_crash_is_reported_when_the_topic_opens_again(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    crashed = ManagedLedger.open(TOPIC, store, metadata)
    position = crashed.append(b"durable").result(timeout=10)  # never closed: as after kill -9
    sealed: list[tuple[int, int]] = []
    ManagedLedger.open(TOPIC, store, metadata, on_sealed=lambda *sealed_ledger: sealed.append(sealed_ledger)).close()
    assert sealed == [(position.ledger_id, 1)]
    store.shutdown()
    metadata.close()


def test_a_failing_on_sealed_hook_never_fails_a_roll_over(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))

    def broken(ledger_id: int, entries: int) -> None:
        raise RuntimeError(f"cannot index {ledger_id}")

    ledger = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=2),
                                on_sealed=broken)
    positions = [ledger.append(f"m{index}".encode()).result(timeout=10) for index in range(5)]
    assert len({position.ledger_id for position in positions}) == 3
    assert [entry.data for entry in ledger.read_entries(positions[0], 10)] == [f"m{i}".encode() for i in range(5)]
    ledger.close()
    store.shutdown()
    metadata.close()
