"""No stored entry crashes the real client: what the door lets in, every reader can read.

One raw connection stores ``SENDS`` seeded mutations of valid SENDs of every shape
(``mutated_sends``: batched, compressed with each codec, chunked, with keys and
properties) on ``TOPICS`` topics; every SEND is answered (a receipt, or SEND_ERROR for
what the door refuses). Every topic is then compacted and read to its end by real-client
(pulsar-client 3.13.0) readers in ``READERS`` subprocesses, raw and read-compacted, each
message's value, key, properties, times and id touched: every reader exits 0. Before the
door checked chunks and slots, readers of such topics died of SIGSEGV (``LZ4_decompress_fast``
on a chunked message, a chunk carrying a batch count, a non-UTF-8 key).
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from api.wire.frames import FrameDecoder, encode_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.mutated_sends import mutate, send_frame, valid_entries

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = pb.BaseCommand
SENDS = 50_000
TOPICS = 200
READERS = 4
SEED = 25
ANSWER_TIMEOUT_S = 120.0  # every SEND answered
READ_TIMEOUT_S = 300.0  # one reader process through its topics
WRITE_BATCH_FRAMES = 256  # frames written to the socket at once

_READER = r"""
import sys, pulsar
url, topics = sys.argv[1], sys.argv[2].split(",")
client = pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
total, unanswered = 0, []
for compacted in (False, True):
    for topic in topics:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        while True:
            try:
                if not reader.has_message_available():
                    break
            except pulsar.Timeout:  # the client's own stall, not the broker's (see _CLIENT_STALL)
                unanswered.append(topic)
                break
            try:
                message = reader.read_next(300)
            except pulsar.Timeout:  # what is left was discarded as corrupt by the client
                break
            message.data(), message.partition_key(), message.properties(), message.event_timestamp()
            message.publish_timestamp(), str(message.message_id())
            total += 1
        reader.close()
client.close()
print("read", total, "unanswered", ",".join(unanswered), flush=True)
"""


# _CLIENT_STALL: now and then (about one run in eight on a loaded 2-core machine) a raw reader's
# has_message_available() times out on one topic whose stream holds a chunk 0 sent twice (the
# fuzzer's duplicate: entries chunk 0, chunk 0, chunk 1, chunk 2 of one uuid). Traced on the
# broker (every write and read of that connection, timestamped): the broker wrote every MESSAGE
# of the topic at once, its transport buffer empty, and then received nothing on the connection
# for about 15 s — not the GET_LAST_MESSAGE_ID, not a FLOW — while the client's log shows its
# I/O thread silent from "Received a chunk whose chunk id is invalid" until its request timed
# out. The stall is inside pulsar-client (3.13.0) after it drops that chunk sequence, so the
# readers record such a topic as unanswered, and every crash or other error still fails the test.


class _Answers:
    """Counts what the broker answers on the raw connection, in a thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.receipts = self.errors = self.others = 0
        self._thread = threading.Thread(target=self._run, name="answers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._count()
        except OSError:  # closed by ``close``
            return

    def _count(self) -> None:
        decoder = FrameDecoder()
        while data := self.sock.recv(1 << 16):
            for frame in decoder.feed(data):
                if frame.type == T.SEND_RECEIPT:
                    self.receipts += 1
                elif frame.type == T.SEND_ERROR:
                    self.errors += 1
                elif frame.type == T.PING:
                    self.sock.sendall(encode_command(make_command(pb.CommandPong())))
                else:
                    assert frame.type in (T.CONNECTED, T.PRODUCER_SUCCESS), frame
                    self.others += 1

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(ANSWER_TIMEOUT_S)
        self.sock.close()

    def wait(self, what: str, done: Any, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert self._thread.is_alive(), "the broker closed the connection"
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
            time.sleep(0.02)


def _store_mutations(port: int, topics: list[str]) -> tuple[int, int]:
    """Send the mutated SENDs; ``(stored, refused)`` once every one is answered."""
    sock = socket.create_connection(("127.0.0.1", port))
    answers = _Answers(sock)
    try:
        sock.sendall(encode_command(make_command(pb.CommandConnect(client_version="door-fuzz", protocol_version=20))))
        for index, topic in enumerate(topics):
            sock.sendall(encode_command(make_command(pb.CommandProducer(
                topic=topic, producer_id=index, request_id=index, producer_name=f"p{index}"))))
        answers.wait("producers created", lambda: answers.others == len(topics) + 1)
        rng = random.Random(SEED)
        sequence_ids = [0] * len(topics)
        frames: list[bytes] = []
        sent = 0
        for _ in range(SENDS):
            index = rng.randrange(len(topics))
            entries, body = valid_entries(rng, f"p{index}", sequence_ids[index])
            for entry in mutate(rng, entries, body):
                frames.append(send_frame(index, sequence_ids[index], entry))
            sequence_ids[index] += 1
            if len(frames) >= WRITE_BATCH_FRAMES:
                sock.sendall(b"".join(frames))
                sent, frames = sent + len(frames), []
        sock.sendall(b"".join(frames))
        sent += len(frames)
        answers.wait("every SEND answered", lambda: answers.receipts + answers.errors == sent)
        return answers.receipts, answers.errors
    finally:
        answers.close()


def test_mutated_sends_never_crash_a_real_reader(broker: Any) -> None:
    topics = [f"persistent://public/default/door-fuzz-{index}" for index in range(TOPICS)]
    stored, refused = _store_mutations(broker.port, topics)
    assert stored > SENDS // 4 and refused > SENDS // 10, (stored, refused)  # both doors were used
    for topic in topics:
        broker.compact(topic)  # raises on a failed run
    groups = [topics[start::READERS] for start in range(READERS)]
    readers = [subprocess.Popen([sys.executable, "-c", _READER, broker.url, ",".join(group)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for group in groups]
    outcomes = [(reader.returncode, out, err[-2000:]) for reader in readers
                for out, err in [reader.communicate(timeout=READ_TIMEOUT_S)]]
    assert [code for code, _, _ in outcomes] == [0] * READERS, [(code, err) for code, _, err in outcomes if code]
    summaries = [line.split() for _, out, _ in outcomes for line in out.splitlines() if line.startswith("read ")]
    assert len(summaries) == READERS, outcomes  # each printed "read N unanswered T1,T2…" at its end
    read = sum(int(summary[1]) for summary in summaries)
    assert read > stored // 2, (read, stored)  # the readers really read the topics
