"""Errors that the CLI turns into one-line messages.

`InputError` means the user gave us something we cannot use (a bad path, an absurd flag,
a damaged file): the CLI prints its message and exits 2. Anything else that escapes is a
bug or a failure of the thing measured (exit 1).
"""

from __future__ import annotations


class StrataError(Exception):
    """Base for errors that carry a message meant for the user."""

    exit_code = 1


class InputError(StrataError):
    """Usage or input error: the message names the file/flag at fault and what to do."""

    exit_code = 2
