"""What every command group of a Pulsar connection uses of the connection itself.

``ProducerHandlers`` (``api.wire.producing``), ``ConsumerHandlers`` (``api.wire.consuming``)
and ``LookupHandlers`` (``api.wire.lookup``) are mixins of ``api.wire.connection.
ServerConnection``; ``ConnectionPart`` declares, once, the members of the connection they
share, which ``ServerConnection`` supplies (its own definitions override these stubs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.wire.frames import Frame
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    import asyncio

    from api.broker.service import BrokerService

__all__ = ["ConnectionPart"]


class ConnectionPart:
    """The connection's members a command group uses (see the module docstring)."""

    broker: BrokerService
    role: str | None
    _loop: asyncio.AbstractEventLoop

    def peer_address(self) -> str:
        raise NotImplementedError

    def is_open(self) -> bool:
        raise NotImplementedError

    def write(self, command: pb.BaseCommand) -> None:
        raise NotImplementedError

    def _error(self, request_id: int | None, error: BaseException) -> None:
        raise NotImplementedError

    def _success(self, request_id: int) -> None:
        raise NotImplementedError

    def _handle(self, frame: Frame) -> None:
        raise NotImplementedError
