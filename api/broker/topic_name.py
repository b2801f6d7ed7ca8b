"""Topic names: ``persistent://tenant/namespace/topic``, and the short form ``topic``.

The short form means ``persistent://public/default/topic``, as the Pulsar client expands
it. Only persistent topics exist; a name ending in ``-partition-N`` is an ordinary topic,
the partition of a partitioned parent (``api.broker.partitions``). Each part is one or more of Pulsar's allowed
characters and nothing else: a control character anywhere (a trailing newline included)
makes the name invalid, on the wire and in REST paths alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from api.broker.errors import InvalidTopicNameError, NotAllowedError

__all__ = ["TopicName", "parse_namespace"]

_PART = re.compile(r"[A-Za-z0-9_.=:\-]+")  # Pulsar's allowed characters, matched whole (fullmatch)


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated persistent topic name."""

    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, text: str) -> TopicName:
        """Parse ``text``; raises ``InvalidTopicNameError`` naming the bad value."""
        if not isinstance(text, str):  # a protobuf string that was not valid UTF-8
            raise InvalidTopicNameError(f"invalid topic name {text!r}: not valid UTF-8")
        if "://" not in text:
            text = f"persistent://public/default/{text}"
        scheme, _, rest = text.partition("://")
        if scheme == "non-persistent":
            raise NotAllowedError(f"non-persistent topics are not supported: {text!r}")
        if scheme != "persistent":
            raise InvalidTopicNameError(f"invalid topic name {text!r}: unknown domain {scheme!r}")
        parts = rest.split("/")
        if len(parts) != 3 or not all(_PART.fullmatch(part) for part in parts):
            raise InvalidTopicNameError(
                f"invalid topic name {text!r}: expected persistent://tenant/namespace/topic"
            )
        return cls(*parts)

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local_name}"


def parse_namespace(text: str) -> str:
    """``tenant/namespace`` validated as the parts of a topic name are; raises
    ``InvalidTopicNameError`` naming the bad value."""
    if not isinstance(text, str) or len(text.split("/")) != 2 \
            or not all(_PART.fullmatch(part) for part in text.split("/")):
        raise InvalidTopicNameError(f"invalid namespace {text!r}: expected tenant/namespace")
    return text
