"""The committed protobuf code matches its .proto, loads, and speaks Pulsar's field numbers."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import __version__ as protobuf_runtime_version

from message.proto import pulsar_api_pb2 as pb

REPO_ROOT = Path(__file__).resolve().parents[3]
GENERATOR_PATH = REPO_ROOT / "scripts" / "gen_proto.py"
GENERATED_VERSION = re.compile(rb"# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)")


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", GENERATOR_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extra) missing"
)
def test_committed_code_is_what_the_generator_writes(tmp_path: Path) -> None:
    generator = _load_generator()
    committed = generator.committed()
    regenerated = generator.generate(tmp_path)
    diffs = generator.differences(committed, regenerated)
    versions = {
        name: GENERATED_VERSION.search(content)
        for name, content in (
            ("committed", committed["pulsar_api_pb2.py"]),
            ("regenerated", regenerated["pulsar_api_pb2.py"]),
        )
    }
    hint = ", ".join(f"{name} {m.group(0).decode() if m else '?'}" for name, m in versions.items())
    assert not diffs, (
        "message/proto/pulsar_api_pb2.py(i) differ from a fresh protoc run; run "
        f"`python scripts/gen_proto.py` ({hint}).\n" + "\n".join(diffs)[:8000]
    )


def test_runtime_is_not_older_than_the_gencode() -> None:
    source = Path(pb.__file__).read_bytes()
    match = GENERATED_VERSION.search(source)
    assert match is not None
    gencode = tuple(int(part) for part in match.groups())
    assert _version_tuple(protobuf_runtime_version) >= gencode


def test_generated_module_is_imported_from_the_package() -> None:
    assert pb.__name__ == "message.proto.pulsar_api_pb2"
    assert pb.DESCRIPTOR.package == "compactd.pulsar"


# Field numbers from shared/reference/pulsar-protocol.md §1.2, §1.3 and §3, written out
# independently of the .proto so that a typo in either one fails here.
METADATA_FIELDS = {
    "producer_name": 1, "sequence_id": 2, "publish_time": 3, "properties": 4,
    "replicated_from": 5, "partition_key": 6, "replicate_to": 7, "compression": 8,
    "uncompressed_size": 9, "num_messages_in_batch": 11, "event_time": 12,
    "encryption_keys": 13, "encryption_algo": 14, "encryption_param": 15,
    "schema_version": 16, "partition_key_b64_encoded": 17, "ordering_key": 18,
    "deliver_at_time": 19, "marker_type": 20, "txnid_least_bits": 22, "txnid_most_bits": 23,
    "highest_sequence_id": 24, "null_value": 25, "uuid": 26, "num_chunks_from_msg": 27,
    "total_chunk_msg_size": 28, "chunk_id": 29, "null_partition_key": 30,
}  # fmt: skip
SINGLE_METADATA_FIELDS = {
    "properties": 1, "partition_key": 2, "payload_size": 3, "compacted_out": 4,
    "event_time": 5, "partition_key_b64_encoded": 6, "ordering_key": 7, "sequence_id": 8,
    "null_value": 9, "null_partition_key": 10,
}  # fmt: skip
MESSAGE_ID_FIELDS = {
    "ledgerId": 1, "entryId": 2, "partition": 3, "batch_index": 4, "ack_set": 5,
    "batch_size": 6, "first_chunk_message_id": 7,
}  # fmt: skip
COMMAND_TYPES = {
    "CONNECT": 2, "CONNECTED": 3, "SUBSCRIBE": 4, "PRODUCER": 5, "SEND": 6, "SEND_RECEIPT": 7,
    "SEND_ERROR": 8, "MESSAGE": 9, "ACK": 10, "FLOW": 11, "UNSUBSCRIBE": 12, "SUCCESS": 13,
    "ERROR": 14, "CLOSE_PRODUCER": 15, "CLOSE_CONSUMER": 16, "PRODUCER_SUCCESS": 17,
    "PING": 18, "PONG": 19, "REDELIVER_UNACKNOWLEDGED_MESSAGES": 20,
    "PARTITIONED_METADATA": 21, "PARTITIONED_METADATA_RESPONSE": 22, "LOOKUP": 23,
    "LOOKUP_RESPONSE": 24, "CONSUMER_STATS": 25, "CONSUMER_STATS_RESPONSE": 26,
    "REACHED_END_OF_TOPIC": 27, "SEEK": 28, "GET_LAST_MESSAGE_ID": 29,
    "GET_LAST_MESSAGE_ID_RESPONSE": 30, "GET_SCHEMA": 34, "GET_SCHEMA_RESPONSE": 35,
    "ACK_RESPONSE": 38, "GET_OR_CREATE_SCHEMA": 39, "GET_OR_CREATE_SCHEMA_RESPONSE": 40,
}  # fmt: skip


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (pb.MessageMetadata, METADATA_FIELDS),
        (pb.SingleMessageMetadata, SINGLE_METADATA_FIELDS),
        (pb.MessageIdData, MESSAGE_ID_FIELDS),
    ],
)
def test_message_format_field_numbers(message: type, expected: dict[str, int]) -> None:
    fields = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    assert {name: fields[name].number for name in expected} == expected


def test_compression_codes() -> None:
    codes = {"NONE": 0, "LZ4": 1, "ZLIB": 2, "ZSTD": 3, "SNAPPY": 4}
    assert {name: pb.CompressionType.Value(name) for name in codes} == codes


def test_base_command_type_equals_its_field_number() -> None:
    assert {name: pb.BaseCommand.Type.Value(name) for name in COMMAND_TYPES} == COMMAND_TYPES
    fields = pb.BaseCommand.DESCRIPTOR.fields
    sub_messages = {field.number for field in fields if field.name != "type"}
    assert sub_messages == set(pb.BaseCommand.Type.values())


def test_every_message_id_form_matches_the_client_bytes() -> None:
    """Byte strings the real client produced (reference §3)."""
    assert pb.MessageIdData(ledgerId=5, entryId=7).SerializeToString().hex() == "08051007"
    with_partition = pb.MessageIdData(ledgerId=5, entryId=7, partition=3, batch_index=2)
    assert with_partition.SerializeToString().hex() == "0805100718032002"
    batched = pb.MessageIdData(ledgerId=10, entryId=0, batch_index=1, batch_size=3)
    assert batched.SerializeToString().hex() == "080a100020013003"
    earliest = pb.MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1)
    assert earliest.SerializeToString().hex() == "08" + "ff" * 9 + "01" + "10" + "ff" * 9 + "01"


def test_message_ids_round_trip_with_the_real_client() -> None:
    pulsar = pytest.importorskip("pulsar")
    for partition, ledger_id, entry_id, batch_index in [(-1, 5, 7, -1), (3, 5, 7, 2)]:
        client_bytes = pulsar.MessageId(partition, ledger_id, entry_id, batch_index).serialize()
        ours = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
        if partition != -1:
            ours.partition = partition
        if batch_index != -1:
            ours.batch_index = batch_index
        assert ours.SerializeToString() == client_bytes
        parsed = pb.MessageIdData.FromString(client_bytes)
        assert (parsed.partition, parsed.ledgerId, parsed.entryId, parsed.batch_index) == (
            partition,
            ledger_id,
            entry_id,
            batch_index,
        )
        back = pulsar.MessageId.deserialize(ours.SerializeToString())
        assert (back.ledger_id(), back.entry_id(), back.batch_index()) == (
            ledger_id,
            entry_id,
            batch_index,
        )


def test_required_fields_are_enforced_on_serialize() -> None:
    from google.protobuf.message import EncodeError

    with pytest.raises(EncodeError):
        pb.MessageMetadata(producer_name="p").SerializeToString()
