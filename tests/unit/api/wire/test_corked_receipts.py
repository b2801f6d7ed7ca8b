"""The receipts of the sends one group commit completed go out in one write, at once.

``SendCompletions`` hands the completions queued by the ledger's flusher thread to the
event loop in one call; with the connection's ``Outbox`` it corks it for that call, so
the receipts written meanwhile reach the transport together when the call ends, not in
a flush scheduled for a later turn of the loop (one turn and one wake-up less per send).
"""

from __future__ import annotations

import asyncio
import threading

from api.wire.outbox import Outbox
from api.wire.producing import SendCompletions


def test_receipts_of_completions_from_the_flusher_are_written_together_when_the_call_ends() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        written: list[bytes] = []
        outbox = Outbox(loop, written.append)
        writes_seen_by_each: list[int] = []

        def on_done(index: int) -> None:
            writes_seen_by_each.append(len(written))  # nothing written while the call runs
            outbox.put(b"receipt-%d;" % index)

        completions = SendCompletions(loop, on_done, outbox)
        ended = loop.create_future()

        def flusher() -> None:  # one group commit completing five sends
            for index in range(5):
                completions.add(index)
            loop.call_soon_threadsafe(ended.set_result, None)  # queued after the completions' call

        worker = threading.Thread(target=flusher)
        worker.start()
        worker.join()  # the loop is blocked meanwhile: every completion queues for one call
        await ended  # the completions' call ran before this wake-up, in the same turn
        assert writes_seen_by_each == [0] * 5
        assert written == [b"receipt-0;receipt-1;receipt-2;receipt-3;receipt-4;"]

    asyncio.run(main())


def test_without_an_outbox_completions_are_handled_as_before() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[int] = []
        completions = SendCompletions(loop, seen.append)
        ended = loop.create_future()

        def flusher() -> None:
            for index in range(3):
                completions.add(index)
            loop.call_soon_threadsafe(ended.set_result, None)

        threading.Thread(target=flusher).start()
        await ended
        assert seen == [0, 1, 2]

    asyncio.run(main())
