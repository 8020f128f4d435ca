"""An ExactlyOncePipeline manifest checked the way the API server checks it, without a cluster.

The document (apiVersion, kind, unknown fields, metadata.name), the spec's schema and its CEL
rules (through the spec model, whose checks mirror `spec.CEL_RULES`), and the root-level rules
below that only the whole object can express. Messages are written as the API server writes
them, so `eopipe validate` in CI says what `kubectl apply` would say. Rules that compare with
the stored object (`oldSelf`) are `spec.immutable_changes`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from pydantic import ValidationError

from eopipe.core.durations import DURATION_PATTERN
from eopipe.core.keys import KeySpec
from eopipe.core.names import MAX_PIPELINE_NAME
from eopipe.core.spec import DEPRECATED_VERSIONS, GROUP, KIND, VERSION, PipelineSpec

API_VERSION = f"{GROUP}/{VERSION}"
# Every served version: the schemas are the same, so a manifest of any of them is checked alike.
API_VERSIONS = (API_VERSION, *(f"{GROUP}/{v}" for v in DEPRECATED_VERSIONS))
TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}
DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS1035_LABEL = r"[a-z](?:[-a-z0-9]*[a-z0-9])?"

# Root-level CEL rules of the CRD (only a root rule may read metadata.name): the pipeline's name
# must leave room for the names derived from it (eopipe.core.names), each with its Python check.
_ROOT_CHECKS = [
    (lambda name: len(name) <= MAX_PIPELINE_NAME,
     {"rule": f"self.metadata.name.size() <= {MAX_PIPELINE_NAME}",
      "message": f"metadata.name may have at most {MAX_PIPELINE_NAME} characters: the dedup StatefulSet "
                 "<name>-dedup labels its pods with <name>-dedup-<revision hash>, which must fit in 63",
      "fieldPath": ".metadata"}),
    (lambda name: re.fullmatch(DNS1035_LABEL, name) is not None,
     {"rule": f"self.metadata.name.matches('^{DNS1035_LABEL}$')",
      "message": "metadata.name must start with a letter and hold only lowercase letters, digits and '-': "
                 "it names the dedup Service, which must be a DNS-1035 label",
      "fieldPath": ".metadata"}),
]
ROOT_RULES = [rule for _, rule in _ROOT_CHECKS]

_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object",
               list: "array", type(None): "null"}
_EXPECTED = {"int": "integer", "string": "string", "bool": "boolean", "dict": "object",
             "model": "object", "float": "number", "list": "array"}


class Problem(str):
    """One message, and the field it is about as a path from the document's root (`("spec",
    "dedup", "window")`; `()` for the whole document), so a caller can name the line."""

    path: tuple = ()

    def __new__(cls, text: str, path=()):
        problem = super().__new__(cls, text)
        problem.path = tuple(path)
        return problem


class Invalid(ValueError):
    """The API server would refuse the document; `problems` are its messages, one per error
    (each a Problem where the field is known)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Pipeline:
    name: str
    namespace: str | None
    spec: PipelineSpec


def is_pipeline(doc) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == KIND


def kind_problem(doc) -> Problem | None:
    """What the API server says of a document meant as a pipeline under another kind: any kind
    in eopipe's API group (it has only the one) or one spelled close to it; None for others."""
    if not isinstance(doc, dict) or is_pipeline(doc):
        return None
    kind, version = doc.get("kind"), doc.get("apiVersion")
    ours = isinstance(version, str) and version.split("/")[0] == GROUP
    close = isinstance(kind, str) and difflib.SequenceMatcher(None, kind.lower(), KIND.lower()).ratio() >= 0.8
    if not (ours or close):
        return None
    meant = KIND if ours else f"{KIND} (apiVersion {API_VERSION})"
    if not kind:
        return Problem(f"Object 'Kind' is missing: did you mean {meant}?", ("kind",))
    return Problem(f'no matches for kind "{kind}" in version "{version}": did you mean {meant}?', ("kind",))


def parse(doc: dict) -> Pipeline:
    """The pipeline of a manifest, or Invalid with what the API server would say."""
    if doc.get("apiVersion") not in API_VERSIONS:
        raise Invalid([Problem(f'no matches for kind "{KIND}" in version "{doc.get("apiVersion")}"',
                               ("apiVersion",))])
    unknown = [Problem(f'unknown field "{k}"', (k,)) for k in doc if k not in TOP_LEVEL]
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    spec, raw = None, _without_nulls(doc.get("spec"))
    schema: list[str] = []
    cel: list[str] = []
    if raw is None:
        schema.append(Problem("spec: Required value", ("spec",)))
    else:
        try:
            spec = _validate(raw)
        except ValidationError as e:
            errors = e.errors(include_url=False)
            unknown += [Problem(f'unknown field "{_path(err["loc"])}"', ("spec", *err["loc"]))
                        for err in errors if err["type"] == "extra_forbidden"]
            schema += [_problem(err) for err in errors if err["type"] not in ("extra_forbidden", "value_error")]
            cel += [_problem(err) for err in errors if err["type"] == "value_error"]
    if unknown:  # a strict decoding error: the API server says only that
        raise Invalid([Problem(", ".join(unknown), unknown[0].path)])
    name = str(meta.get("name") or "")
    problems = _name_problems(name, meta.get("generateName"))
    if schema:  # the API server evaluates no CEL rule on an object that fails its schema
        raise Invalid(problems + schema)
    if name:
        problems += [Problem(f"metadata: Invalid value: {rule['message']}", ("metadata", "name"))
                     for ok, rule in _ROOT_CHECKS if not ok(name)]
    if problems or cel:
        raise Invalid(problems + cel)
    return Pipeline(name, meta.get("namespace"), spec)


def _validate(raw) -> PipelineSpec:
    """The spec as the API server reads it: by the manifest's camelCase names only (the model
    also takes its Python names, which the API server knows as unknown fields)."""
    try:
        return PipelineSpec.model_validate(raw, strict=True, by_alias=True, by_name=False)
    except TypeError:  # pydantic before 2.11 cannot refuse the Python names
        return PipelineSpec.model_validate(raw, strict=True)


def _name_problems(name: str, generate_name: str | None) -> list[str]:
    at = ("metadata", "name")
    if not name:
        return [] if generate_name else [Problem("metadata.name: Required value: name or generateName is required", at)]
    if len(name) > 253:
        return [Problem(f'metadata.name: Invalid value: "{name}": must be no more than 253 characters', at)]
    if not re.fullmatch(DNS1123_SUBDOMAIN, name):
        return [Problem(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                        "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                        f"alphanumeric character (e.g. 'example.com', regex used for validation is "
                        f"'{DNS1123_SUBDOMAIN}')", at)]
    return []


def _without_nulls(value):
    """The API server drops null fields of a structural schema before it validates."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _path(loc) -> str:
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _value(v) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _problem(err: dict) -> Problem:
    return Problem(_message(err), ("spec", *err["loc"]))


def _key_hint(value: str) -> str:
    """The object form of the CLI's key shorthand (`json:id`), which the manifest does not take."""
    try:
        key = KeySpec.parse(value)
    except ValueError:
        return ("write the key as an object: {from: recordKey}, {from: header, name: NAME} "
                "or {from: jsonField, name: FIELD}")
    if key.kind == "jsonField" and any("." in part for part in key.path):
        # A dotted name would read as a nested path: the list form keeps each name whole.
        return f"write the key as an object: {{from: jsonField, path: [{', '.join(key.path)}]}}"
    return f"write the key as an object: {{from: {key.kind}" + (f", name: {key.name}}}" if key.name else "}")


def _message(err: dict) -> str:
    """One pydantic error as the API server words the same failure; where its words (a type, a
    regular expression) would not tell what to write, what to write."""
    path, kind, value, ctx = _path(err["loc"]), err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == DURATION_PATTERN:
        # What the pattern accepts: Go durations in these units, no sign (no d: a day is 24h).
        return (f"{path}: {_value(value)} is not a duration: use Go duration syntax in h, m, s or ms, "
                "such as 15m, 24h or 168h")
    if kind == "missing":
        return f"{path}: Required value"
    if kind == "value_error":  # a validator: its text is the CEL rule's message
        # The API server shows a scalar that fails a rule, not an object (`Invalid value: "0s": ...`).
        shown = f"{_value(value)}: " if isinstance(value, (str, int, float, bool)) else ""
        return f"{path}: Invalid value: {shown}{ctx.get('error', err['msg'])}"
    if kind == "string_pattern_mismatch":
        return f"{path}: Invalid value: {_value(value)}: {path} in body should match '{ctx['pattern']}'"
    if kind == "string_too_short":
        return (f"{path}: Invalid value: {_value(value)}: {path} in body should be at least "
                f"{ctx['min_length']} chars long")
    if kind == "string_too_long":
        return f"{path}: Too long: may not be more than {ctx['max_length']} bytes"
    if kind in ("greater_than_equal", "less_than_equal"):
        bound, word = (ctx["ge"], "greater") if kind == "greater_than_equal" else (ctx["le"], "less")
        return f"{path}: Invalid value: {_value(value)}: {path} in body should be {word} than or equal to {bound}"
    if kind == "literal_error":
        allowed = ", ".join(f'"{v}"' for v in re.findall(r"'([^']*)'", ctx.get("expected", "")))
        return f"{path}: Unsupported value: {_value(value)}: supported values: {allowed}"
    expected = _EXPECTED.get(kind.split("_", 1)[0])
    if expected is not None and (kind.endswith("_type") or kind.endswith("_parsing")):
        got = _JSON_TYPES.get(type(value), "object")
        said = f'{path}: Invalid value: "{got}": {path} in body must be of type {expected}: "{got}"'
        return f"{said}; {_key_hint(value)}" if err["loc"] == ("dedup", "key") and isinstance(value, str) else said
    return f"{path}: {err['msg']}"
