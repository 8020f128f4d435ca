"""Dedup key extraction: the record key, a header, or a top-level JSON field of the value.

Shared by the dedup worker and `eopipe verify`, so both see the same identity of a record.
The kinds are the CRD's `dedup.key.from` values; the text form (`key`, `header:NAME`,
`json:FIELD`) is the worker's and the CLI's --key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal


class MalformedRecord(ValueError):
    """The record has no usable dedup key; it belongs in the dead-letter topic."""


@dataclass(frozen=True)
class KeySpec:
    kind: Literal["recordKey", "header", "jsonField"] = "recordKey"
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> "KeySpec":
        """`key`, `header:NAME` or `json:FIELD`."""
        kind, _, name = text.partition(":")
        if kind == "key" and not name:
            return cls("recordKey")
        if kind == "header" and name:
            return cls("header", name)
        if kind == "json" and name:
            return cls("jsonField", name)
        raise ValueError(f"bad key spec {text!r}: expected 'key', 'header:NAME' or 'json:FIELD'")

    def __str__(self) -> str:
        return {"recordKey": "key", "header": f"header:{self.name}",
                "jsonField": f"json:{self.name}"}[self.kind]


def extract(spec: KeySpec, key: bytes | None, value: bytes | None,
            headers: list[tuple[str, bytes]] | None) -> bytes:
    if spec.kind == "recordKey":
        if not key:
            raise MalformedRecord("record has no key")
        return key
    if spec.kind == "header":
        for name, v in headers or ():
            if name == spec.name and v:
                return v
        raise MalformedRecord(f"record has no header {spec.name!r}")
    if value is None:
        raise MalformedRecord("record has no value")
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedRecord(f"value is not JSON: {e}") from None
    field = doc.get(spec.name) if isinstance(doc, dict) else None
    if field is None or field == "":
        raise MalformedRecord(f"JSON value has no field {spec.name!r}")
    return str(field).encode()
