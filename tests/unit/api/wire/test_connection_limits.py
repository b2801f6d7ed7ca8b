"""Wire resource limits: slow connections time out, partial frames are bounded in total and
given back when their connection closes.

Driven through ``ServerConnection`` over a real broker (``harness``) with small limits.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from api.broker.service import BrokerService
from api.config import Settings
from api.wire.frames import encode_command, make_command
from api.wire.limits import PartialFrameBudget
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import T, Wire, broker_service, settle

PING = encode_command(make_command(pb.CommandPing()))


def _run(path: Path, body: object, **settings: object) -> None:
    async def main() -> None:
        with broker_service(path, Settings(**settings)) as broker:  # type: ignore[arg-type]
            await body(broker)  # type: ignore[operator]
    asyncio.run(main())


def _big_frame_start(total: int) -> bytes:
    """The first bytes of a frame that claims ``total`` bytes after its length prefix."""
    return (total).to_bytes(4, "big") + (10).to_bytes(4, "big")


def test_a_connection_that_never_sends_connect_is_closed(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        silent, prompt = Wire(broker, connect=False), Wire(broker)
        started = time.monotonic()
        await settle(lambda: silent.closed, timeout_s=5)
        assert time.monotonic() - started < 2
        assert not prompt.closed  # a connection that sent CONNECT stays
        assert [f.type for f in prompt.request(make_command(pb.CommandPing()))] == [T.PONG]
    _run(tmp_path, body, wire_connect_timeout_seconds=0.2)


def test_a_frame_left_incomplete_closes_its_connection_and_a_slow_but_steady_one_does_not(
    tmp_path: Path,
) -> None:
    async def body(broker: BrokerService) -> None:
        stalled, steady = Wire(broker), Wire(broker)
        stalled.feed(PING[:5])
        started = time.monotonic()
        for _ in range(6):  # 0.6 s of frames, each completed in two pieces 0.05 s apart
            steady.feed(PING[:5])
            await asyncio.sleep(0.05)
            steady.feed(PING[5:])
            await asyncio.sleep(0.05)
        await settle(lambda: stalled.closed, timeout_s=5)
        assert time.monotonic() - started < 2
        assert not steady.closed
        assert broker.connections.partial_frames.used_bytes == 0
    _run(tmp_path, body, wire_frame_timeout_seconds=0.3)


def test_partial_frames_beyond_the_broker_budget_close_only_the_connection_that_exceeds_it(
    tmp_path: Path,
) -> None:
    budget = 1024 * 1024

    async def body(broker: BrokerService) -> None:
        wires = [Wire(broker) for _ in range(3)]
        chunk = _big_frame_start(2 * budget) + b"\x00" * (budget // 2 - 8)  # half the budget each
        wires[0].feed(chunk)
        wires[1].feed(chunk[:-100])
        assert broker.connections.partial_frames.used_bytes == budget - 100
        wires[2].feed(chunk)  # would go over: this one closes
        await settle(lambda: wires[2].transport.lost)
        assert not wires[0].closed and not wires[1].closed
        assert broker.connections.partial_frames.used_bytes == budget - 100
        assert wires[2].protocol.decoder.buffered == 0
        wires[0].close()
        await settle(lambda: wires[0].transport.lost)
        assert broker.connections.partial_frames.used_bytes == budget // 2 - 100  # given back on close
        assert wires[0].protocol.decoder.buffered == 0  # and the buffer itself is released
        fresh = Wire(broker)
        assert [f.type for f in fresh.request(make_command(pb.CommandPing()))] == [T.PONG]
    _run(tmp_path, body, wire_partial_frames_budget_bytes=budget)


def test_the_budget_only_refuses_growth() -> None:
    budget = PartialFrameBudget(100)
    assert budget.resize(0, 60)
    assert not budget.resize(0, 50)
    assert budget.resize(60, 100) and budget.used_bytes == 100
    assert budget.resize(100, 10) and budget.used_bytes == 10
    assert budget.resize(10, 0) and budget.used_bytes == 0
