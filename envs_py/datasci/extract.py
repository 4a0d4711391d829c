"""Turns free model text into a program that defines `build_model(x_train, y_train)`.

Accepted forms: fenced code blocks (the one defining build_model wins, else
the first), a full function with its imports, or only the function's body
(what a base model writes after the plain prompt's header).  The
prompt's imports (numpy as np, sklearn) are prepended.  Trailing prose
is cut: lines are dropped from the end until the program parses.  Text that
never parses is returned whole, so the sandbox reports the honest
SyntaxError.  Nothing here executes code.
"""

from __future__ import annotations

import ast
import re
import threading

from envs_py.datasci.prompts import FUNCTION_HEADER, PRELUDE

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_DEFINES = re.compile(r"^\s*def\s+build_model\s*\(", re.MULTILINE)
INDENT = "    "


def fenced_blocks(text: str) -> list[str]:
    """Returns the contents of ```-fenced blocks (an unclosed last fence runs to the end)."""
    return [match.group(2) for match in _FENCE.finditer(text)]


# CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state: two threads that
# build trees at once (an env pool's threads extracting programs) can see each other's depth and raise
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905); one tree at a time.
_AST_LOCK = threading.Lock()


def parse_tree(source: str) -> ast.Module:
    """`ast.parse(source)`, one call at a time in this process; a SystemError (CPython's spurious AST
    depth mismatch) is retried once before it propagates."""
    with _AST_LOCK:
        try:
            return ast.parse(source)
        except SystemError:
            return ast.parse(source)


def parses(source: str) -> bool:
    """True when `source` is syntactically valid Python."""
    try:
        parse_tree(source)
    except (SyntaxError, ValueError):
        return False
    return True


def looks_like_prose(line: str) -> bool:
    """True for a line that reads as prose or markup rather than code."""
    stripped = line.strip()
    if not stripped or parses(stripped):
        return False
    return stripped[0].isupper() or stripped.startswith(("```", "*", "-", "Here", "here", "This", "this"))


def longest_parsing_prefix(source: str) -> str | None:
    """Returns `source` without trailing prose so that it parses, or None.

    Lines are dropped from the end; the first dropped line must be at
    column 0 or read as prose, so a function body cut mid-statement (the
    token limit) is not silently shortened: it keeps its SyntaxError.
    """
    lines = source.rstrip().splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end]) + "\n"
        if end < len(lines) and not (
            lines[end].strip() and (not lines[end].startswith((" ", "\t")) or looks_like_prose(lines[end]))
        ):
            continue
        if parses(candidate):
            return candidate
    return None


def body_lines(text: str) -> list[str]:
    """Returns the lines of a function body written after the header.

    An indented body ends at the first non-blank line back at column 0; a body
    written at column 0 (chat answers) is indented as a whole.
    """
    lines = text.expandtabs(4).rstrip().splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return [INDENT + "pass"]
    if lines[0].startswith((" ", "\t")):
        kept = []
        for line in lines:
            if line.strip() and not line.startswith(" "):
                break
            kept.append(line)
        return kept
    return [INDENT + line if line.strip() else line for line in lines]


def choose_code(text: str) -> str:
    """Returns the code part of a model answer (a fenced block or the text itself)."""
    blocks = fenced_blocks(text)
    if not blocks:
        return text
    defining = [block for block in blocks if _DEFINES.search(block)]
    return defining[0] if defining else blocks[0]


_KEPT_AFTER_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


def without_usage_after_function(source: str) -> str:
    """Returns `source` cut before the first top-level statement after build_model
    that is not a definition or an import (e.g. "# Example usage" calls on
    data that does not exist in the sandbox)."""
    body = parse_tree(source).body
    seen_function = False
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == "build_model":
            seen_function = True
        elif seen_function and not isinstance(node, _KEPT_AFTER_FUNCTION):
            return "\n".join(source.splitlines()[: node.lineno - 1]).rstrip() + "\n"
    return source


def extract_program(text: str) -> str:
    """Returns a Python program defining build_model, built from model text.

    The program starts with `PRELUDE` (the imports the plain prompt shows).
    """
    program = _extract(text)
    if parses(program):
        program = without_usage_after_function(program)
    return PRELUDE + program


def _extract(text: str) -> str:
    """Returns the program before the cleanup of statements after build_model."""
    code = choose_code(text).replace("\r\n", "\n")
    match = _DEFINES.search(code)
    if match:
        # Keep the function and everything above it (imports, helpers).
        fixed = longest_parsing_prefix(code)
        if fixed is not None and _DEFINES.search(fixed):
            return fixed
        fixed = longest_parsing_prefix(code[match.start():].lstrip("\n"))
        if fixed is not None and _DEFINES.search(fixed):
            return fixed
        return code
    program = FUNCTION_HEADER + "\n".join(body_lines(code)) + "\n"
    fixed = longest_parsing_prefix(program)
    return fixed if fixed is not None else program
