"""Help that reads well at 80 columns for commands with many options (``compactd serve``).

typer's rich help puts each option in a table whose columns shrink with the terminal: at
80 columns long flags are cut (``--compaction-mem…``) and help texts squeezed into a
narrow column. ``PlainHelpCommand`` renders click's plain help instead: each flag in full,
its help wrapped at word boundaries to the terminal width (at most 80 columns), on the
flag's line when it fits, else on the lines below.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

__all__ = ["PlainHelpCommand"]


class PlainHelpCommand(TyperCommand):
    """A typer command whose ``--help`` is click's plain layout (no rich tables)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None  # typer then formats with click's HelpFormatter
