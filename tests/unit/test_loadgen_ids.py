"""Where `eopipe load` puts an event's id (eopipe/tools/loadgen.py): at the JSON field paths it is
given, read back by the dedup key of the same path."""

import random

import pytest

from eopipe.core.keys import KeySpec, MalformedRecord, extract
from eopipe.tools.loadgen import _event


@pytest.mark.parametrize("id_at, present, absent", [
    (("id",), ["json:id"], ["json:user.id"]),
    (("user.id",), ["json:user.id"], ["json:id"]),
    (("id", "user.id"), ["json:id", "json:user.id"], ['json:["user.id"]']),
])
def test_the_id_is_where_the_key_reads_it(id_at, present, absent):
    key, value, _ = _event(random.Random(1), 0, 0, id_at)
    for text in present:
        assert extract(KeySpec.parse(text), None, value, None) == key
    for text in absent:
        with pytest.raises(MalformedRecord):
            extract(KeySpec.parse(text), None, value, None)
