"""The text perplexity is measured on: an offline default, or the user's own file."""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

from strata.errors import InputError


@dataclass(frozen=True)
class Text:
    name: str  # where it came from, as stored with every result
    content: str

    @property
    def sha256(self) -> str:
        """Identifies the exact text: the default one changes between Python releases."""
        return hashlib.sha256(self.content.encode("utf-8")).hexdigest()


def default_text() -> Text:
    """The documentation topics every CPython ships (pydoc_data.topics, ~465 KB of English
    technical prose), joined in sorted key order with a blank line between topics: the same
    bytes for everyone on the same Python release, and no network needed."""
    from pydoc_data.topics import topics

    content = "\n\n".join(topics[key] for key in sorted(topics))
    return Text(f"pydoc_data.topics (Python {platform.python_version()})", content)


def read_text(path: Path) -> Text:
    """A UTF-8 text file (InputError naming --text and what is wrong)."""
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise InputError(f"--text {path}: is a directory; give a text file") from None
    except OSError as exc:
        raise InputError(f"--text {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--text {path}: not UTF-8 text (byte {exc.start} is invalid); "
                         "convert it to UTF-8") from None
    return Text(str(path), content)


def load_text(path: Path | None) -> Text:
    return default_text() if path is None else read_text(path)
