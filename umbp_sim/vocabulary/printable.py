"""Text from a dump (or any untrusted input) made safe for a terminal: ``printable(text)``.

A dump's kernel release, host name, file and directory names and tarball member names are
whatever the dump says, so they may hold escape sequences that a terminal would act on (move
the cursor, retitle the window, hide the rest of the line). Every terminal output (the text
report, ``inspect``, the fleet table, one-line errors) passes such text through ``printable``:
each C0 control character (``\\n`` and ``\\t`` too: a value is one line), DEL and each C1
control character is written as ``\\xHH`` (``\\x1b`` for ESC), and a backslash that could be
read as the start of such an escape stays as it is (the escaping is for display, not a
round trip). JSON output is left alone (``json.dumps`` escapes control characters itself); XML
and HTML take ``markup(text)`` before their own escaping (a JUnit file with a control character
in it does not parse).
"""

from __future__ import annotations

import re

# C0 (0x00-0x1f), DEL (0x7f), C1 (0x80-0x9f); lone surrogates (bytes a decoder could not read,
# which no UTF-8 output can write) and U+FFFE, U+FFFF (not characters: XML 1.0 forbids them)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _hex(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` with each control character written as ``\\xHH``; those in ``keep`` (e.g.
    ``"\\n"`` for a multi-line report whose line breaks are its own) are left as they are."""
    if keep:
        return _CONTROL.sub(lambda m: m.group() if m.group() in keep else _hex(m), text)
    return _CONTROL.sub(_hex, text)


def markup(text: str) -> str:
    """Text for an XML or HTML document (``--junit``, ``--html``), before its escaping of
    ``<&>"``: ``printable`` keeping line breaks and tabs. XML 1.0 forbids the other C0 controls
    even as character references (a JUnit file with one does not parse), and in a page they
    would be raw bytes: each is written as ``\\xHH``, visibly."""
    return printable(text, keep="\n\t")


def terminal(report: str) -> str:
    """A multi-line text report for the terminal: ``printable`` keeping its line breaks (each
    one-line field in it, a host name or kernel release, is ``printable`` already)."""
    return printable(report, keep="\n")
