"""Results a notebook shows as a table and pandas reads: the other half of the ecosystem.

`Records` is a list (what the API returned before stays true: index it, iterate it) of the
command's own items — dicts, or objects such as QualityResult — that also:

- renders in Jupyter (`_repr_html_`) with the columns the terminal's `-o md` shows;
- converts with `.to_records()` (plain dicts, the documented `-o json` field names,
  docs/output.md) and `.to_pandas()` (a DataFrame of those records; pandas is optional).

Pure Python, no imports beyond the stdlib: any layer may return one.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from strata.errors import InputError

Record = dict[str, Any]


def html_table(records: Sequence[Record], columns: Sequence[str], title: str = "") -> str:
    """An escaped HTML table of `columns` (all fields when empty); numbers right-aligned."""
    cols = list(columns) or list(dict.fromkeys(k for r in records for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in cols) + "</tr>" for r in records)
    caption = f"<caption>{html.escape(title)}</caption>" if title else ""
    return (f'<table class="strata">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _cell(v: Any) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, float):
        text = f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return f'<td style="text-align:right">{text}</td>'
    if isinstance(v, int) and not isinstance(v, bool):
        return f'<td style="text-align:right">{v:,}</td>'
    if isinstance(v, list | tuple):
        v = ", ".join(map(str, v))
    return f"<td>{html.escape(str(v))}</td>"


def to_pandas(records: list[Record]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise InputError("to_pandas() needs pandas: pip install pandas") from None
    return pd.DataFrame.from_records(records)


class Records(list):  # type: ignore[type-arg]
    """A list of a command's results that notebooks render and pandas reads."""

    def __init__(self, items: Iterable[Any] = (), columns: Sequence[str] = (),
                 title: str = "", to_record: Callable[[Any], Record] | None = None) -> None:
        super().__init__(items)
        self.columns = tuple(columns)
        self.title = title
        self._to_record = to_record

    def to_records(self) -> list[Record]:
        """Plain dicts in the documented `-o json` vocabulary (docs/output.md)."""
        convert = self._to_record or dict
        return [convert(item) for item in self]

    def to_pandas(self) -> Any:
        """A pandas DataFrame of to_records() (every field; `.columns` names the table's)."""
        return to_pandas(self.to_records())

    def _repr_html_(self) -> str:
        return html_table(self.to_records(), self.columns, self.title)
