"""What a static read of a team's source finds, and how both screens (screen.py, portability.py) name what
they read: one place below them, so neither imports the other to share it."""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    category: str
    what: str
    code: str


def dotted_name(node: ast.AST) -> str:
    """`torch.cuda.set_device` as written; "" for what has no name (a call's result, a subscript).
    Both screens read names this way (portability.py too)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""
