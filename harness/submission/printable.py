"""Text that came from team code, made safe to store and to show.

A reason, a warning or a file name can carry what a team chose: terminal escapes (a cursor moved
up over the summary to print a val_loss that is not the record's), carriage returns, bidi
overrides that reorder a line, or megabytes. Every such text goes through `printable` before it is
kept in a record or printed: control characters are shown, not obeyed; a one-line field stays one
line; the length is capped, saying how much was left out. Pure: no I/O, imports nothing of ours.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls, and Unicode's bidirectional overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NEWLINE_MARK = " \u23ce "  # ⏎ where a one-line field had a line break
REASON_MAX_CHARS = 4000  # a reason: its first line, a "Fix the line shown" excerpt, a message
LINE_MAX_CHARS = 1000  # a warning or a problem: one line


def printable(text: object, max_chars: int = LINE_MAX_CHARS, one_line: bool = True) -> str:
    shown = str(text)
    if one_line:
        shown = shown.replace("\r\n", "\n").replace("\r", "\n").replace("\n", NEWLINE_MARK)
    shown = _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        shown)
    if len(shown) > max_chars:
        shown = f"{shown[:max_chars]}... ({len(shown) - max_chars} more characters)"
    return shown


def indented(text: str, indent: str) -> str:
    """A multi-line text shown under a heading: every line after the first indented, so that no line of
    team text starts at column 0 where the harness's own lines do."""
    return text.replace("\n", "\n" + indent)
