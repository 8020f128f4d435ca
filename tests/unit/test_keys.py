"""Dedup key extraction (eopipe/core/keys.py): the worker and `eopipe verify` must agree on a
record's identity, and a record without a usable key is malformed (the DLQ), never a crash."""

import json
import random

import pytest

from eopipe.core import native
from eopipe.core.keys import KeySpec, MalformedRecord, batch_extractor, extract, extractor


def key_of(spec, key, value, headers):
    """extract()'s answer, after checking that the worker's extractor(spec) gives the same key,
    or raises the same error, and that its batch_extractor(spec) gives the same key or leaves
    the record to the per-record path (None), alone and in a batch with a common record."""
    many = batch_extractor(spec)
    common = b'{"id": "c", "user": {"id": "c"}}'
    try:
        want = extract(spec, key, value, headers)
    except MalformedRecord as e:
        with pytest.raises(MalformedRecord) as got:
            extractor(spec)(key, value, headers)
        assert str(got.value) == str(e)
        if many:
            assert many([value]) is None and many([common, value]) is None
        raise
    assert extractor(spec)(key, value, headers) == want
    if many:
        assert many([value]) in (None, [want])
        assert many([common, value]) in (None, [b"c", want])
    return want

ID = KeySpec("jsonField", "id")


@pytest.mark.parametrize("value, key", [
    (b'{"id": "a-1", "n": 2}', b"a-1"),
    (b'{"id": 42}', b"42"),
    (b'{"id": 0.1}', b"0.1"),
    (b'{"id": 1E2}', b"100.0"),
    (b'{"id": true}', b"True"),
    (b'{"id": "\\u00e9"}', "é".encode()),
    (b'{"id": 1, "id": 2}', b"2"),  # the last one, as json has it
    # where orjson differs from json, the key stays json's
    (b'{"id": 123456789012345678901234567890}', b"123456789012345678901234567890"),
    (b'{"id": -9223372036854775809}', b"-9223372036854775809"),
    (b'{"id": NaN}', b"nan"),
    (b'{"id": 1.5e400}', b"inf"),
    (b'\xef\xbb\xbf{"id": 7}', b"7"),
    (b'{"id": "x", "other": NaN}', b"x"),
])
def test_json_field_keys_are_what_json_reads(value, key):
    assert key_of(ID, None, value, None) == key
    assert key == str(json.loads(value)["id"]).encode()


@pytest.mark.parametrize("value, reason", [
    (None, "no value"),
    (b"not json", "not JSON"),
    (b'{"id": "\xff"}', "not JSON"),  # invalid UTF-8
    (b"[1, 2]", "no field 'id'"),
    (b'{"other": 1}', "no field 'id'"),
    (b'{"id": ""}', "no field 'id'"),
    (b'{"id": null}', "no field 'id'"),
    (b'{"id": "\\ud800"}', "not valid Unicode"),  # a lone surrogate: no UTF-8 key exists
])
def test_records_without_a_usable_json_key_are_malformed(value, reason):
    with pytest.raises(MalformedRecord, match=reason):
        key_of(ID, None, value, None)


@pytest.mark.parametrize("spec, key, headers, expected", [
    (KeySpec("recordKey"), b"k", None, b"k"),
    (KeySpec("header", "event-id"), None, [("other", b"x"), ("event-id", b"e1")], b"e1"),
])
def test_record_key_and_header_keys(spec, key, headers, expected):
    assert key_of(spec, key, b"{}", headers) == expected


@pytest.mark.parametrize("spec, key, headers, reason", [
    (KeySpec("recordKey"), None, None, "no key"),
    (KeySpec("recordKey"), b"", None, "no key"),
    (KeySpec("header", "event-id"), b"k", [("event-id", b"")], "no header"),
    (KeySpec("header", "event-id"), b"k", None, "no header"),
])
def test_missing_record_keys_and_headers_are_malformed(spec, key, headers, reason):
    with pytest.raises(MalformedRecord, match=reason):
        key_of(spec, key, b"{}", headers)


USER_ID = KeySpec("jsonField", "user.id")


@pytest.mark.parametrize("value, key", [
    (b'{"user": {"id": "u-1"}, "id": "top"}', b"u-1"),
    (b'{"user": {"id": 42}}', b"42"),
    (b'{"user": {"id": 1E2}}', b"100.0"),
    (b'{"user": {"id": true}}', b"True"),
    (b'{"user": {"id": [1, 2]}}', b"[1, 2]"),  # a non-scalar is its text, as at the top level
    (b'{"user": {"id": 123456789012345678901234567890}}', b"123456789012345678901234567890"),
    (b'{"user": {"id": NaN}}', b"nan"),
    (b'{"user": {"id": 1}, "user": {"id": 2}}', b"2"),
])
def test_nested_fields_are_read_as_top_level_ones_are(value, key):
    assert key_of(USER_ID, None, value, None) == key
    assert key == str(json.loads(value)["user"]["id"]).encode()


@pytest.mark.parametrize("value, reason", [
    (b'{"user.id": "flat"}', "no field 'user.id'"),  # a dotted name is a path, not one name
    (b'{"user": "u-1"}', "no field 'user.id'"),
    (b'{"user": ["id"]}', "no field 'user.id'"),
    (b'{"user": {"id": null}}', "no field 'user.id'"),
    (b'{"user": {"id": ""}}', "no field 'user.id'"),
    (b'{"user": {}}', "no field 'user.id'"),
    (b'{"user": {"id": "\\ud800"}}', "not valid Unicode"),
    (b'{"user": {"id": NaN', "not JSON"),
])
def test_nested_records_without_a_usable_key_are_malformed(value, reason):
    with pytest.raises(MalformedRecord, match=reason):
        key_of(USER_ID, None, value, None)


@pytest.mark.parametrize("text, path", [
    ("json:id", ("id",)),
    ("json:user.id", ("user", "id")),
    ("json:a.b.c", ("a", "b", "c")),
    ('json:["a.b", "c"]', ("a.b", "c")),
    ('json:["user", "id"]', ("user", "id")),
    ('json:["[x"]', ("[x",)),
])
def test_text_forms_of_a_json_path_and_their_round_trip(text, path):
    spec = KeySpec.parse(text)
    assert spec.path == path
    assert KeySpec.parse(str(spec)) == spec == KeySpec("jsonField", path=path)


def test_a_name_with_a_dot_is_read_by_the_list_form():
    spec = KeySpec("jsonField", path=("a.b", "c"))
    assert str(spec) == 'json:["a.b", "c"]'
    assert key_of(spec, None, b'{"a.b": {"c": "x"}, "a": {"b": {"c": "y"}}}', None) == b"x"


@pytest.mark.parametrize("text", ["json:.id", "json:user.", "json:a..b", "json:[]", 'json:[""]',
                                  "json:[1]", 'json:["a"', "json:"])
def test_bad_json_paths_are_refused(text):
    with pytest.raises(ValueError, match="bad"):
        KeySpec.parse(text)


def test_json_keys_of_a_batch_at_once():
    """The worker's batch path takes the common case itself (else it would gain nothing) and
    leaves anything else to the per-record path; the compiled scan takes it first."""
    assert batch_extractor(ID)([b'{"id": "a"}', b'{"id": "b", "n": 1}']) == [b"a", b"b"]
    assert batch_extractor(USER_ID)([b'{"user": {"id": "u"}}']) == [b"u"]
    assert batch_extractor(ID)([]) == []
    assert batch_extractor(ID)([b'{"id": "a"}', b'{"id": 42}']) == [b"a", b"42"]
    assert batch_extractor(ID)([b'{"id": "a"}', b'{"id": 4.2}']) is None  # a float: one by one
    assert batch_extractor(KeySpec.parse("json:a.b.c"))([b'{"a": {"b": {"c": "d"}}}']) == [b"d"]
    assert batch_extractor(KeySpec()) is None and batch_extractor(KeySpec("header", "h")) is None
    event = (b'{"id":"3f1c2a9e-6b1d-4a57-9c1e-2f0b8d7e6a51","user":{"id":"3f1c2a9e-6b1d-4a57-9c1e-2f0b8d7e6a51"},'
             b'"seq":7,"account":"acct-0042","amount_cents":1999,"currency":"EUR","ts":1800000000000}')
    assert native.json_keys([event, event], ("user", "id")) == [b"3f1c2a9e-6b1d-4a57-9c1e-2f0b8d7e6a51"] * 2
    assert native.json_keys([event], ("seq",)) == [b"7"]


# The scan's hard cases, each in the documents the fuzz test below mutates.
_TRICKY = [
    b'{"id": "a\\u0062"}', b'{"id": "\\ud800"}', b'{"\\u0069d": "x", "id": "y"}', b'{"id": "x", "id": "y"}',
    b'{"id": "x", "id": 1}', b'{"id": -0}', b'{"id": -12}', b'{"id": 012}', b'{"id": 1.0}', b'{"id": NaN}',
    b'{"id": ""}', b'{"id": null}', b'\xef\xbb\xbf{"id": "x"}', b'{"id": "\xc3\xa9t\xc3\xa9"}',
    b'{"id": "\xed\xa0\x80"}', b'{"id": "\xc0\xaf"}', b'{"id": "\xf4\x90\x80\x80"}', b'{"id": "tab\there"}',
    b' {"a": [1, {"id": 2}], "id" : "z" } ', b'{"id": "x",}', b'[{"id": "x"}]', b'{"id": "x"} {}',
    b'{"user": {"id": "u"}, "user": 3}', b'{"user": [{"id": "u"}]}', b'{"user": {"id": "u", "x": [true, false]}}',
    b'{"n": 1e5, "m": -0.5E-3, "id": "k"}', b'{"n": 1., "id": "k"}',
    b'{"id": "k", "deep": ' + b"[" * 70 + b"]" * 70 + b"}",
]


@pytest.mark.parametrize("path", [("id",), ("user", "id")])
def test_the_compiled_scan_agrees_with_the_json_reading(path):
    """A key from native.json_keys is exactly extract()'s; where extract() finds the record
    malformed, or reads it otherwise, the scan gives up (None). Fuzzed: random documents and
    byte-level mutations of them and of the hard cases."""
    rng = random.Random(11)
    spec = KeySpec("jsonField", path=path)

    def doc(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice([rng.randrange(-10**20, 10**20), rng.random() * 1e6, "", "é😀\"\\\n", True, None,
                               "".join(rng.choice("ab-1_ ") for _ in range(rng.randrange(8))), float("nan")])
        if r < 0.5:
            return [doc(depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(["id", "user", "x", "i\u0064", "ïd"]): doc(depth + 1) for _ in range(rng.randrange(5))}

    corpus = list(_TRICKY)
    for _ in range(3000):
        d = doc()
        if isinstance(d, dict) and rng.random() < 0.8:  # mostly with the field, as records are
            node = d
            for name in path[:-1]:
                if not isinstance(node.get(name), dict):
                    node[name] = {}
                node = node[name]
            node[path[-1]] = rng.choice([str(rng.random()), rng.randrange(-10**12, 10**12), "id-é"])
        seps = rng.choice([(",", ":"), (", ", ": ")])
        corpus.append(json.dumps(d, ensure_ascii=rng.random() < 0.5, separators=seps).encode())
    taken = 0
    for base in corpus:
        for v in [base] + [_mutate(rng, base) for _ in range(5)]:
            got = native.json_keys([v], path)
            try:
                want = extract(spec, None, v, None)
            except MalformedRecord:
                want = None
            if got is not None:
                taken += 1
                assert want is not None and got == [want], v
    assert taken > 500  # the scan takes the common case itself


def _mutate(rng, v: bytes) -> bytes:
    b = bytearray(v)
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(b) + 1)
        op = rng.randrange(4)
        if op == 0 and b:
            del b[min(i, len(b) - 1)]
        elif op == 1:
            b[i:i] = bytes([rng.choice(b'{}[]",:\\ 0-.eE\x00\x80\xc3\xa9\xff')])
        elif op == 2 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        else:
            b = b[:i]
    return bytes(b)