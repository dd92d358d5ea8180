"""Errors a user can act on. Each names the problem (the file, tensor, token count, ...) in its message.

Messages are safe to print on a terminal: control characters (a file name holding a newline or an escape sequence,
text copied from a request) are shown escaped (``\\n``, ``\\x1b``), so an error is always one line and cannot move
the cursor, recolour the terminal or hide part of itself (``printable``).
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode controls that reorder or hide text (bidirectional overrides and isolates,
# line and paragraph separators)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    ch = match.group()
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``, ``\\u202e``); anything else unchanged."""
    return _CONTROL.sub(_escape, text)


class OmnijaxError(Exception):
    """Base class of every error omnijax raises on bad input. ``str(error)`` is one printable line."""

    def __str__(self) -> str:
        return printable(super().__str__())


class CheckpointError(OmnijaxError):
    """A checkpoint folder is missing, unreadable, incomplete or does not match its config."""


class MediaError(OmnijaxError):
    """An image or audio input cannot be read or has unusable content."""


class PromptError(OmnijaxError):
    """A prompt is malformed, too long for the context budget, or its media do not match its placeholders."""


class UnsupportedModelError(CheckpointError):
    """The checkpoint's architecture is not one omnijax knows."""


class SamplingError(OmnijaxError, ValueError):
    """A generation setting (temperature, top_k, top_p, seed, max_new_tokens, stop strings) is out of range."""


class ConstraintError(SamplingError):
    """A structured output constraint (``response_format``: a JSON schema, regex, choice list or grammar) is
    malformed, or llguidance cannot compile it (its message is quoted)."""


class CapabilityError(OmnijaxError):
    """The model cannot do what was asked (e.g. answer aloud without a talker)."""


class SettingError(OmnijaxError, ValueError):
    """A setting of the Python API or a command-line flag (dtype, quantization, context budget, batch size, worker
    count, ...) is not one omnijax accepts."""
