"""SUBSCRIBE, SEEK and UNSUBSCRIBE are answered once the cursor change is durable (``api.wire.durable``),
and so is an ack receipt with no mark-delete rate limit (with one: at once, as Pulsar).

A ``ServerConnection`` over a real broker (``harness``). The cursor store's writer thread
is held inside its transaction (or failed) through the database's fault point
``cursor.save_batch.before``: meanwhile the event loop goes on (the test itself runs on
it) and no SUCCESS is sent; once the write commits, SUCCESS comes. A write that fails
answers ERROR ``MetadataError`` and detaches the subscribing consumer; the next SUBSCRIBE
gets the subscription written.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from api.config import Settings
from api.wire.frames import encode_command, encode_payload_command, make_command
from ledger.errors import MetadataError
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import Wire, broker_service, settle

T = pb.BaseCommand
TOPIC = "persistent://public/default/durable-answers"


def _subscribe(consumer_id: int, request_id: int) -> pb.BaseCommand:
    return make_command(pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Shared,
                                            consumer_id=consumer_id, request_id=request_id))


def test_success_waits_for_the_commit_off_the_loop_and_a_failed_write_answers_error(tmp_path: Path) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data") as broker:
            wire = Wire(broker)
            assert wire.request(make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1)))
            database = broker.data_dir.database
            reached, release = threading.Event(), threading.Event()

            def hold(**_: object) -> None:
                reached.set()
                assert release.wait(10)

            database.fault_points["cursor.save_batch.before"] = hold
            before = len(wire.transport.frames)
            wire.feed(encode_command(_subscribe(7, 2)))
            await settle(reached.is_set)  # the loop is free while the writer holds the commit
            await asyncio.sleep(0.05)
            assert wire.answers(before) == []  # not durable: not answered
            release.set()
            await settle(lambda: len(wire.answers(before)) == 1)
            assert wire.answers(before)[0].type == T.SUCCESS
            assert broker.cursors.load_persisted(TOPIC, "s") is not None

            seek = make_command(pb.CommandSeek(consumer_id=7, request_id=3, message_publish_time=0))
            assert [f.type for f in await wire.request_durable(seek, answers=2)] == [T.CLOSE_CONSUMER, T.SUCCESS]

            def fail(**_: object) -> None:
                raise MetadataError("injected: disk full")

            database.fault_points["cursor.save_batch.before"] = fail
            broker.cursors.delete(TOPIC, "s")
            broker.registry.loaded[TOPIC].subscriptions.clear()  # as a fresh broker: the next SUBSCRIBE creates it
            refused = (await wire.request_durable(_subscribe(8, 4)))[0]
            assert refused.type == T.ERROR and refused.command.error.error == pb.MetadataError
            assert "disk full" in refused.command.error.message
            assert 8 not in wire.protocol.consumers
            assert broker.registry.loaded[TOPIC].subscriptions["s"].consumers == []

            del database.fault_points["cursor.save_batch.before"]
            assert (await wire.request_durable(_subscribe(9, 5)))[0].type == T.SUCCESS
            assert broker.cursors.load_persisted(TOPIC, "s") is not None
            unsubscribe = make_command(pb.CommandUnsubscribe(consumer_id=9, request_id=6))
            assert (await wire.request_durable(unsubscribe))[0].type == T.SUCCESS
            assert broker.cursors.load_persisted(TOPIC, "s") is None  # answered: the deletion is durable

    asyncio.run(main())


def _ack(request_id: int, message_id: pb.MessageIdData) -> pb.BaseCommand:
    ack = pb.CommandAck(consumer_id=7, ack_type=pb.CommandAck.Individual, request_id=request_id)
    ack.message_id.add().CopyFrom(message_id)
    return make_command(ack)


async def _subscribed_with_messages(wire: Wire, count: int) -> list[pb.MessageIdData]:
    """Consumer 7 subscribed to ``TOPIC`` (durable), ``count`` messages sent and delivered to it."""
    assert (await wire.request_durable(_subscribe(7, 1)))[0].type == T.SUCCESS
    assert wire.request(make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=2)))
    for sequence in range(count):
        send = pb.CommandSend(producer_id=1, sequence_id=sequence)
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence, publish_time=1)
        wire.feed(encode_payload_command(make_command(send), _entry(metadata, b"m%d" % sequence)))
    wire.feed(encode_command(make_command(pb.CommandFlow(consumer_id=7, messagePermits=count))))
    await settle(lambda: len([f for f in wire.answers() if f.type == T.MESSAGE]) == count)
    return [f.command.message.message_id for f in wire.answers() if f.type == T.MESSAGE]


def _entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    encoded = metadata.SerializeToString()
    return len(encoded).to_bytes(4, "big") + encoded + payload


def _receipts(wire: Wire, since: int) -> list[pb.CommandAckResponse]:
    return [f.command.ackResponse for f in wire.answers(since) if f.type == T.ACK_RESPONSE]


def test_with_no_rate_limit_an_ack_receipt_waits_for_the_commit_and_a_failed_write_answers_its_error(
        tmp_path: Path) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data", Settings(managed_ledger_mark_delete_rate_limit=0)) as broker:
            wire = Wire(broker)
            message_ids = await _subscribed_with_messages(wire, 2)
            database = broker.data_dir.database
            reached, release = threading.Event(), threading.Event()

            def hold(**_: object) -> None:
                reached.set()
                assert release.wait(10)

            database.fault_points["cursor.save_batch.before"] = hold
            before = len(wire.transport.frames)
            wire.feed(encode_command(_ack(40, message_ids[0])))
            await settle(reached.is_set)  # the loop is free while the writer holds the commit
            await asyncio.sleep(0.05)
            assert _receipts(wire, before) == []  # applied, not durable: no receipt yet
            release.set()
            await settle(lambda: len(_receipts(wire, before)) == 1)
            assert _receipts(wire, before)[0].request_id == 40
            assert not _receipts(wire, before)[0].HasField("error")
            persisted = broker.cursors.load_persisted(TOPIC, "s")
            assert persisted is not None and persisted.mark_delete_position.entry_id == message_ids[0].entryId

            def fail(**_: object) -> None:
                raise MetadataError("injected: disk full")

            database.fault_points["cursor.save_batch.before"] = fail
            before = len(wire.transport.frames)
            wire.feed(encode_command(_ack(41, message_ids[1])))
            await settle(lambda: len(_receipts(wire, before)) == 1)
            failed = _receipts(wire, before)[0]
            assert failed.request_id == 41 and failed.error == pb.MetadataError and "disk full" in failed.message

            del database.fault_points["cursor.save_batch.before"]  # the write is retried, not in a loop

            def retried() -> bool:
                record = broker.cursors.load_persisted(TOPIC, "s")
                return record is not None and record.mark_delete_position.entry_id == message_ids[1].entryId

            await settle(retried)

    asyncio.run(main())


def test_with_a_rate_limit_an_ack_receipt_comes_once_applied_before_the_write(tmp_path: Path) -> None:
    async def main() -> None:
        settings = Settings(managed_ledger_mark_delete_rate_limit=0.01)  # one write per 100 s
        with broker_service(tmp_path / "data", settings) as broker:
            wire = Wire(broker)
            message_ids = await _subscribed_with_messages(wire, 2)
            created = broker.cursors.load_persisted(TOPIC, "s")
            before = len(wire.transport.frames)
            wire.feed(encode_command(_ack(40, message_ids[0])))
            wire.feed(encode_command(_ack(41, message_ids[1])))
            assert [r.request_id for r in _receipts(wire, before)] == [40, 41]  # at once, on the loop
            assert broker.cursors.load_persisted(TOPIC, "s") == created  # not written yet: on the schedule
            assert broker.cursors.queued_count() == 1
            assert broker.registry.loaded[TOPIC].subscriptions["s"].cursor.mark_delete_position.entry_id == \
                message_ids[1].entryId  # applied in memory

    asyncio.run(main())
