"""compactd's own protobuf description of the Pulsar protocol and its generated code.

``pulsar_api.proto`` is the source; ``pulsar_api_pb2.py`` and ``pulsar_api_pb2.pyi`` are
generated from it by ``scripts/gen_proto.py`` and committed. Never edit them by hand: a unit
test regenerates them and fails when they differ. Import the messages as
``from message.proto import pulsar_api_pb2``.
"""
