"""SUBSCRIBE, SEEK and UNSUBSCRIBE are answered once the cursor change is durable (``api.wire.durable``).

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

from api.wire.frames import encode_command, make_command
from compactor.proto import pulsar_api_pb2 as pb
from ledger.errors import MetadataError
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
            broker.topics[TOPIC].subscriptions.clear()  # as a fresh broker: the next SUBSCRIBE creates it
            refused = (await wire.request_durable(_subscribe(8, 4)))[0]
            assert refused.type == T.ERROR and refused.command.error.error == pb.MetadataError
            assert "disk full" in refused.command.error.message
            assert 8 not in wire.protocol.consumers
            assert broker.topics[TOPIC].subscriptions["s"].consumers == []

            del database.fault_points["cursor.save_batch.before"]
            assert (await wire.request_durable(_subscribe(9, 5)))[0].type == T.SUCCESS
            assert broker.cursors.load_persisted(TOPIC, "s") is not None
            unsubscribe = make_command(pb.CommandUnsubscribe(consumer_id=9, request_id=6))
            assert (await wire.request_durable(unsubscribe))[0].type == T.SUCCESS
            assert broker.cursors.load_persisted(TOPIC, "s") is None  # answered: the deletion is durable

    asyncio.run(main())
