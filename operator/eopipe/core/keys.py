"""Dedup key extraction: the record key, a header, or a JSON field of the value.

Shared by the dedup worker and `eopipe verify`, so both see the same identity of a record.
The kinds are the CRD's `dedup.key.from` values; the text form (`key`, `header:NAME`,
`json:FIELD`) is the worker's and the CLI's --key.

A JSON field is a path from the top level down: `user.id` is the field `id` of the object
`user`. A field whose own name has a dot in it is named by the list form, in the CRD
`path: [a.b, c]` and in the text form `json:["a.b", "c"]` (a JSON array of names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Callable, Literal

import orjson

from eopipe.core import native

PATH_HINT = 'name a field with a dot in its name by the list form: path [a.b, c], or json:["a.b", "c"]'


class MalformedRecord(ValueError):
    """The record has no usable dedup key; it belongs in the dead-letter topic."""


def json_path(name: str) -> tuple[str, ...]:
    """`user.id` -> ("user", "id"); `["a.b", "c"]` (a JSON array of names) -> ("a.b", "c")."""
    if name.startswith("["):
        try:
            path = json.loads(name)
        except ValueError:
            path = None
        if not isinstance(path, list) or not path or not all(isinstance(p, str) and p for p in path):
            raise ValueError(f"bad JSON field path {name!r}: expected a JSON array of non-empty names")
        return tuple(path)
    path = tuple(name.split("."))
    if not all(path):
        raise ValueError(f"bad JSON field {name!r}: an empty name between dots; {PATH_HINT}")
    return path


def path_text(path: tuple[str, ...]) -> str:
    """The text form of a path, as json_path reads it: dotted unless a name needs the list form."""
    if any("." in p for p in path) or path[0].startswith("["):
        return json.dumps(list(path), ensure_ascii=False)
    return ".".join(path)


@dataclass(frozen=True)
class KeySpec:
    kind: Literal["recordKey", "header", "jsonField"] = "recordKey"
    name: str | None = None  # a header's name, or a JSON field in the text form (path_text)
    path: tuple[str, ...] = ()  # jsonField: the names from the top level down

    def __post_init__(self):
        if self.kind != "jsonField":
            return
        if self.path and self.name is None:
            object.__setattr__(self, "path", tuple(self.path))
        elif self.name is not None and not self.path:
            object.__setattr__(self, "path", json_path(self.name))
        else:
            raise ValueError("a jsonField key has either name or path")
        object.__setattr__(self, "name", path_text(self.path))

    @classmethod
    def parse(cls, text: str) -> "KeySpec":
        """`key`, `header:NAME` or `json:FIELD` (FIELD: `user.id`, or `["a.b", "c"]`)."""
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
    field = _json_field(value, spec.path)
    if field is None or field == "":
        raise MalformedRecord(f"JSON value has no field {spec.name!r}")
    try:
        return str(field).encode()
    except UnicodeEncodeError:  # a lone surrogate (\ud800): no UTF-8 key exists for it
        raise MalformedRecord(f"JSON field {spec.name!r} is not valid Unicode text") from None


Extract = Callable[[bytes | None, bytes | None, "list[tuple[str, bytes]] | None"], bytes]


def extractor(spec: KeySpec) -> Extract:
    """extract() bound to `spec`, for the worker's hot path: the same key or the same error for
    every record. A JSON field that is a non-empty string or an integer (nearly every key) is
    read in one pass, a third of extract's time; anything else goes through extract itself."""
    if spec.kind != "jsonField":
        return partial(extract, spec)
    first, rest = spec.path[0], spec.path[1:]
    loads, bad_json = orjson.loads, orjson.JSONDecodeError

    def json_key(key, value, headers):
        if value is not None:
            try:
                field = loads(value)
            except bad_json:
                field = None
            else:
                field = field.get(first) if type(field) is dict else None
                for name in rest:
                    field = field.get(name) if type(field) is dict else None
            t = type(field)
            if t is str and field:
                try:
                    return field.encode()
                except UnicodeEncodeError:
                    pass
            elif t is int:
                return str(field).encode()
        return extract(spec, key, value, headers)

    return json_key


def batch_extractor(spec: KeySpec) -> Callable[[list], "list[bytes] | None"] | None:
    """For a JSON field: the keys of a whole batch of values in one call, or None when any
    record of the batch is not the common case (a non-empty string or an integer field of
    valid JSON): then the caller takes the records one by one through extractor(spec), which
    decides exactly as extract does. None for the other specs.

    First a compiled scan that builds nothing (core/native.pyx); where it gives up, for a
    field one or two names deep, orjson over the batch in one comprehension."""
    if spec.kind != "jsonField":
        return None
    scan, path = native.json_keys, spec.path
    if len(path) > 2:
        return lambda values: scan(values, path)
    loads = orjson.loads
    if len(path) == 1:
        (a,) = path

        def fields(values):
            return [loads(v)[a] for v in values]
    else:
        a, b = path

        def fields(values):
            return [loads(v)[a][b] for v in values]

    def keys(values: list) -> "list[bytes] | None":
        found = scan(values, path)
        if found is not None:
            return found
        try:  # a value that is not JSON, not an object, or lacks the field raises: one by one
            got = fields(values)
            # str.encode fails on anything but a string (and on a lone surrogate); a float or a
            # big integer is not a string either, so json's reading of those is kept.
            out = [f.encode() for f in got if f.__class__ is str and f]
        except Exception:  # noqa: BLE001 - any doubt: the per-record path decides
            return None
        return out if len(out) == len(got) else None

    return keys


def _at(doc, path: tuple[str, ...]):
    """The field at `path`, or None where an object on the way is missing or is not an object."""
    for name in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(name)
    return doc


def _json_field(value: bytes, path: tuple[str, ...]):
    """The field at `path`, as the standard library's json reads it. orjson parses about 6 times
    faster; where it refuses (NaN, Infinity, a byte-order mark) or differs (an integer beyond 64
    bits becomes a float), json reads the record again, so keys stay what they were."""
    try:
        doc = orjson.loads(value)
        # One name (most keys) without _at's call: a tenth of the extraction's time.
        field = (doc.get(path[0]) if isinstance(doc, dict) else None) if len(path) == 1 else _at(doc, path)
        if not isinstance(field, float):
            return field
    except orjson.JSONDecodeError:
        pass
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedRecord(f"value is not JSON: {e}") from None
    return _at(doc, path)
