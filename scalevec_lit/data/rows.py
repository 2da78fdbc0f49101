"""Bad rows of a row file (JSON Lines, parquet, a saved dataset): ``RowCounts`` keeps the rows used as documents
and counts the skipped ones by reason (the first kept as an example); prepare reports every such file.

Must not import Lightning.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

_JSON_TYPES = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}


@dataclass
class RowCounts:
    """Rows of one file: used as documents, or skipped and why (the first skipped row kept as an example)."""

    rows: int = 0
    missing: int = 0
    null: int = 0
    not_string: dict = field(default_factory=dict)  # type name -> rows
    invalid: int = 0  # lines that are not a JSON object
    empty: int = 0
    first_bad: Optional[list] = None  # [row, reason]
    error: Optional[str] = None  # the file could not be read to its end (e.g. a truncated gzip)

    def skip(self, what: str, row: int, detail: str = "") -> None:
        if what == "not_string":
            self.not_string[detail] = self.not_string.get(detail, 0) + 1
        else:
            setattr(self, what, getattr(self, what) + 1)
        if self.first_bad is None or row < self.first_bad[0]:
            self.first_bad = [row, what if not detail else f"{what} ({detail})"]

    def take(self, value, row: int) -> Optional[str]:
        """``value`` if it is usable text; otherwise count it and return ``None``."""
        if value is None:
            self.skip("null", row)
        elif not isinstance(value, str):
            self.skip("not_string", row, _JSON_TYPES.get(type(value), type(value).__name__))
        elif not value.strip():
            self.skip("empty", row)
        else:
            self.rows += 1
            return value
        return None

    @property
    def bad(self) -> int:
        return self.missing + self.null + sum(self.not_string.values()) + self.invalid + self.empty

    def merge(self, other: "RowCounts") -> "RowCounts":
        out = RowCounts(self.rows + other.rows, self.missing + other.missing, self.null + other.null,
                        dict(self.not_string), self.invalid + other.invalid, self.empty + other.empty,
                        self.first_bad, self.error or other.error)
        for k, v in other.not_string.items():
            out.not_string[k] = out.not_string.get(k, 0) + v
        if other.first_bad is not None and (out.first_bad is None or other.first_bad[0] < out.first_bad[0]):
            out.first_bad = list(other.first_bad)
        return out

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RowCounts":
        return cls(**data)

    def describe(self, name: str, text_field: str, kind: str) -> Optional[str]:
        """One line for prepare's summary, or ``None`` when every row was used."""
        if not self.bad and not self.error:
            return None
        parts = []
        if self.missing:
            parts.append(f"{self.missing:,} without the field {text_field!r}")
        if self.null:
            parts.append(f"{self.null:,} where it is null")
        if self.not_string:
            parts.append(f"{sum(self.not_string.values()):,} where it is not a string ("
                         + ", ".join(f"{t}: {n:,}" for t, n in sorted(self.not_string.items())) + ")")
        if self.empty:
            parts.append(f"{self.empty:,} where it is empty or only whitespace")
        if self.invalid:
            parts.append(f"{self.invalid:,} line(s) that are not a JSON object")
        line = f"{name}: skipped {self.bad:,} of {self.rows + self.bad:,} rows: " + ", ".join(parts) if parts else \
            f"{name}: read {self.rows:,} rows"
        if self.first_bad is not None:
            where = f"line {self.first_bad[0] + 1}" if kind == "jsonl" else f"row {self.first_bad[0]}"
            line += f" (first: {where})"
        if self.error:
            line += f"; {self.error}"
        return line
