"""The Pulsar binary protocol's door: the listener (``listener.PulsarBroker``), one
``connection.ServerConnection`` per client with its command handlers (``producing``,
``consuming``, ``lookup``, ``preparing``, ``schema_commands``, ``durable``), CONNECT's
admission (``auth``), the limits the connections share (``limits``), what goes out
(``outbox``), the checks of what comes in (``validate``), the protocol's values (``codec``)
and the framing of commands and payloads (``frames``: the byte layout and the size rule
are written out at its top).

The package re-exports nothing: import each name from the module that owns it.
"""
