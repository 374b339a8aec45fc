"""A path as a log line or a status line may show it: one line, whatever bytes it holds.

A name on the target may hold any byte but NUL and '/': a newline would split the line (and
forge the next one), a terminal's escape sequence would act. Such a character is shown as a
backslash escape, a backslash itself as two, so what is shown names one path only.
"""

from __future__ import annotations

_SURROGATES = range(0xDC80, 0xDD00)  # os.fsdecode's undecodable bytes


def shown(path: str) -> str:
    """*path* with every backslash doubled and every character that is not printable (a byte
    that was not UTF-8 included) as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if path.isprintable() and "\\" not in path:
        return path
    out = []
    for ch in path:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif code in _SURROGATES:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)
