"""Pulsar's schema compatibility strategy names, declared once for every door.

A leaf module (typing only): the admin CLI reads the names without loading pydantic or
the broker, the settings, the REST models and the broker's checks share them.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["STRATEGIES", "SchemaStrategyName"]

SchemaStrategyName = Literal[
    "ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
    "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE", "NONE",
]
"""Pulsar's ``SchemaCompatibilityStrategy`` names (NONE: no check, as ALWAYS_COMPATIBLE)."""

STRATEGIES: tuple[str, ...] = get_args(SchemaStrategyName)
