"""The short paths of the wire's hot commands say exactly what the general ones say.

Every message passes through a SEND check, a MESSAGE frame, an ACK check and a
connection's writes; each got a cheaper path (``api.wire.validate``'s fast checks and
``_slots_fit``, ``frames.encode_message``, ``outbox.Outbox``, ``broker.entry_facts``).
These tests hold each to the general code it shortcuts: the same verdicts, the same
bytes, the same order.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from api.broker.entry_facts import _parsed_facts, entry_facts
from api.wire.codec import to_message_id
from api.wire.frames import Frame, encode_message, encode_payload_command, make_command
from api.wire.outbox import FLUSH_BYTES, Outbox
from api.wire.producing import SendCompletions
from api.wire.validate import SIGNED_64_MAX, _slots_fit, frame_problem, message_problem
from ledger.position import Position
from message.encoder import encode_batch, encode_entry
from message.entry import check_slot_count, read_slot
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

U64 = st.integers(0, (1 << 64) - 1)
IDS = st.one_of(st.integers(0, 1000), st.just((1 << 64) - 1), st.integers(SIGNED_64_MAX - 2, (1 << 64) - 1), U64)


@settings(max_examples=200)
@given(ids=st.lists(st.tuples(IDS, IDS), max_size=4), properties=st.lists(st.text(max_size=3), max_size=2),
       chunked=st.booleans(), ack_type=st.sampled_from([pb.CommandAck.Individual, pb.CommandAck.Cumulative]))
def test_the_ack_check_agrees_with_the_general_check(ids: list[tuple[int, int]], properties: list[str],
                                                     chunked: bool, ack_type: pb.CommandAck.AckType) -> None:
    ack = pb.CommandAck(consumer_id=1, ack_type=ack_type)
    for ledger_id, entry_id in ids:
        message_id = ack.message_id.add(ledgerId=ledger_id, entryId=entry_id)
        if chunked:
            message_id.first_chunk_message_id.CopyFrom(pb.MessageIdData(ledgerId=entry_id, entryId=ledger_id))
    for key in properties:
        ack.properties.add(key=key, value=1)
    fast = frame_problem(Frame(make_command(ack)))
    general = message_problem(ack)
    assert (fast is None) == (general is None)
    assert fast is None or str(fast) == str(general)


@given(sequence_id=U64, highest=st.one_of(st.none(), U64), message_id=st.one_of(st.none(), st.tuples(IDS, IDS)))
def test_the_send_command_check_agrees_with_the_general_check(sequence_id: int, highest: int | None,
                                                              message_id: tuple[int, int] | None) -> None:
    send = pb.CommandSend(producer_id=1, sequence_id=sequence_id)
    if highest is not None:
        send.highest_sequence_id = highest
    if message_id is not None:
        send.message_id.CopyFrom(pb.MessageIdData(ledgerId=message_id[0], entryId=message_id[1]))
    entry = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"x",
                         with_checksum=False)
    fast = frame_problem(Frame(make_command(send), entry))
    general = message_problem(send)
    assert (fast is None) == (general is None)
    assert fast is None or str(fast) == str(general)


def _slots_by_read_slot(body: bytes, count: int) -> bool:
    try:
        check_slot_count(body, count)
        single, position = pb.SingleMessageMetadata(), 0
        for batch_index in range(count):
            position = read_slot(body, position, batch_index, single)
    except MalformedEntryError:
        return False
    return True


@settings(max_examples=300)
@given(payloads=st.lists(st.binary(max_size=20), min_size=1, max_size=6), cut=st.integers(0, 400),
       flip=st.integers(0, 400), extra=st.integers(-2, 2))
def test_the_lean_slot_walk_agrees_with_read_slot(payloads: list[bytes], cut: int, flip: int, extra: int) -> None:
    """Whole, truncated and damaged batch bodies: ``_slots_fit`` accepts exactly what the
    slot-by-slot reader accepts (where it doubts, the reader decides, so it may only be
    stricter than the reader, never looser)."""
    slots = [(pb.SingleMessageMetadata(payload_size=0, partition_key=f"k{i}"), p) for i, p in enumerate(payloads)]
    entry = encode_batch(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), slots, pb.NONE,
                         with_checksum=False)
    metadata_size = struct.unpack_from(">I", entry)[0]
    body = bytearray(entry[4 + metadata_size:])
    if flip < len(body):
        body[flip] ^= 0xFF
    damaged = bytes(body[: max(0, len(body) - cut % (len(body) + 1))]) if cut % 3 == 0 else bytes(body)
    count = max(1, len(payloads) + extra)
    fits = _slots_fit(damaged, count)
    assert not fits or _slots_by_read_slot(damaged, count)
    if _slots_by_read_slot(damaged, count) and len(damaged) == len(body) and flip >= len(body):
        assert fits  # an intact batch takes the short path


@given(consumer_id=st.integers(0, 1 << 40), ledger_id=st.integers(-1, 1 << 40), entry_id=st.integers(-1, 1 << 40),
       redelivery_count=st.integers(0, 100), ack_set=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=3),
       partition=st.integers(-1, 5), payload=st.binary(max_size=50))
def test_a_message_frame_built_in_place_is_byte_identical(consumer_id: int, ledger_id: int, entry_id: int,
                                                          redelivery_count: int, ack_set: list[int],
                                                          partition: int, payload: bytes) -> None:
    entry = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), payload,
                         with_checksum=False)
    position = Position(ledger_id, entry_id)
    general = pb.CommandMessage(consumer_id=consumer_id, message_id=to_message_id(position),
                                redelivery_count=redelivery_count)
    general.ack_set.extend(ack_set)
    if partition >= 0:
        general.message_id.partition = partition
    in_place = pb.BaseCommand(type=pb.BaseCommand.MESSAGE)
    in_place.message.CopyFrom(general)
    assert encode_message(in_place, entry) == encode_payload_command(make_command(general), entry)


def test_a_message_frame_needs_a_message_command() -> None:
    entry = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"", with_checksum=False)
    for command in (pb.BaseCommand(type=pb.BaseCommand.MESSAGE), make_command(pb.CommandPing())):
        try:
            encode_message(command, entry)
        except ValueError:
            continue
        raise AssertionError(f"{command} was encoded")


@given(batch=st.one_of(st.none(), st.integers(1, 1000)), deliver_at=st.one_of(st.none(), st.integers(0, 1 << 50)),
       checksum=st.booleans(), garbage=st.binary(max_size=12))
def test_entry_facts_agree_with_the_full_parser(batch: int | None, deliver_at: int | None, checksum: bool,
                                                garbage: bytes) -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    if batch is not None:
        metadata.num_messages_in_batch = batch
    if deliver_at is not None:
        metadata.deliver_at_time = deliver_at
    entry = encode_entry(metadata, b"payload", with_checksum=checksum)
    assert entry_facts(entry) == _parsed_facts(entry) == (batch or 1, deliver_at)
    assert entry_facts(garbage) == _parsed_facts(garbage)


def test_the_outbox_keeps_order_writes_once_per_turn_and_early_past_its_bound() -> None:
    async def main() -> None:
        written: list[bytes] = []
        outbox = Outbox(asyncio.get_running_loop(), written.append)
        outbox.cork()
        outbox.put(b"a")
        outbox.put(b"b")
        assert written == []
        outbox.uncork()
        assert written == [b"ab"]  # a corked stretch: one write when it ends
        outbox.put(b"c")
        outbox.put(b"d")
        assert written == [b"ab"]
        await asyncio.sleep(0)
        assert written == [b"ab", b"cd"]  # uncorked: one write at the end of the loop turn
        big = b"x" * FLUSH_BYTES
        outbox.put(b"e")
        outbox.put(big)
        assert written == [b"ab", b"cd", b"e" + big]  # past the bound: at once, in order
        outbox.put(b"f")
        outbox.drop()
        await asyncio.sleep(0)
        assert written == [b"ab", b"cd", b"e" + big]  # dropped: the connection is gone

    asyncio.run(main())


class CountingLoop:
    """The loop as ``SendCompletions`` sees it, counting the wake-ups asked of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wake_ups = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        self.wake_ups += 1
        return self.loop.call_soon_threadsafe(callback, *args)


def test_send_completions_from_another_thread_all_reach_the_loop_in_few_wake_ups() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[tuple[int, int]] = []
        counting = CountingLoop(loop)
        completions = SendCompletions(cast(asyncio.AbstractEventLoop, counting),
                                      lambda index, thread: seen.append((index, thread)))

        def complete_all() -> None:
            for index in range(500):
                completions.add(index, threading.get_ident())

        worker = threading.Thread(target=complete_all)
        worker.start()
        worker.join()  # the loop is blocked meanwhile: every completion queues
        completions.add(500, threading.get_ident())  # on the loop: handled at once
        deadline = loop.time() + 10
        while len(seen) < 501:
            assert loop.time() < deadline, "completions did not reach the loop"
            await asyncio.sleep(0.001)
        assert sorted(index for index, _ in seen) == list(range(501))
        assert counting.wake_ups == 1  # one wake-up took every completion queued

    asyncio.run(main())
