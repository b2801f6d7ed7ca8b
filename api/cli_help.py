"""Help that reads well at 80 columns for commands with many options (``compactd serve``).

typer's rich help puts each option in a table whose columns shrink with the terminal: at
80 columns long flags are cut (``--compaction-mem…``) and help texts squeezed into a
narrow column. ``PlainHelpCommand`` renders click's plain help instead: each flag in full,
its help wrapped at word boundaries to the terminal width (at most 80 columns), on the
flag's line when it fits, else on the lines below.
"""

from __future__ import annotations

import textwrap
from typing import Any

from typer.core import TyperCommand

__all__ = ["PlainHelpCommand"]


def _write_whole_words(formatter: Any, rows: list[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
    """click's definition-list layout, wrapping only at spaces: a flag named in a help text
    (``--tls-key-file``) is never split at its hyphens."""
    first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
    indent = " " * (first_col + formatter.current_indent)
    for first, second in rows:
        formatter.write(f"{'':>{formatter.current_indent}}{first}")
        if not second:
            formatter.write("\n")
            continue
        formatter.write(" " * (first_col - len(first)) if len(first) <= first_col - col_spacing else "\n" + indent)
        lines = textwrap.wrap(second, max(formatter.width - first_col - 2, 10), break_on_hyphens=False) or [""]
        formatter.write(lines[0] + "\n" + "".join(f"{indent}{line}\n" for line in lines[1:]))


class PlainHelpCommand(TyperCommand):
    """A typer command whose ``--help`` is click's plain layout (no rich tables)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None  # typer then formats with click's HelpFormatter

    def format_options(self, ctx: Any, formatter: Any) -> None:
        rows = [record for param in self.get_params(ctx) if (record := param.get_help_record(ctx)) is not None]
        if rows:
            with formatter.section("Options"):
                _write_whole_words(formatter, rows)
