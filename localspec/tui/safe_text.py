"""Untrusted text (model output, stored chats, error causes, registry names) made safe to draw.

Textual draws text as written, control characters included (it drops only BEL, BS, VT, FF and CR):
an ESC or a C1 control in a reply reached the user's terminal as a live escape sequence, so a model
could clear the screen, retitle the window, plant an OSC 8 link or write the clipboard (OSC 52).
Such characters are shown instead as visible stand-ins, as are the bidi overrides that reorder
what the user reads ("Trojan Source") and lone surrogates (no UTF-8 form, so the terminal would
get an escape of several cells where the layout counted one). The stored text is left as it was.
"""

from __future__ import annotations

import re

# C0 controls but tab, newline and CR, DEL, C1 controls, the bidi embeddings, overrides and
# isolates, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _stand_in(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ESC shows as ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"<U+{code:04X}>"


def terminal_safe(text: str) -> str:
    """`text` with every character that would act on the terminal (or reorder the line) made visible.
    Tab and newline stay; CR is dropped (a CRLF line end is a line end, and a lone CR would let
    the rest of a line overwrite its start), also when a reply streams the CR and LF apart."""
    return _UNSAFE.sub(_stand_in, text.replace("\r", ""))
