"""rules.too_deep finds JSON nested deeper than a limit without parsing: the same answer as counting."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policy import rules


def depth(value: Any) -> int:
    """Levels of arrays and objects in `value` (a scalar is 0)."""
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


# Strings holding brackets, quotes and backslashes: the check must skip them.
TEXT = st.text(alphabet='[]{}"\\ab', max_size=6)
JSON = st.recursive(st.none() | st.integers() | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=60)


@settings(max_examples=400, deadline=None)
@given(value=JSON, limit=st.integers(min_value=0, max_value=12))
def test_too_deep_is_counting(value: Any, limit: int) -> None:
    assert rules.too_deep(json.dumps(value).encode(), limit) == (depth(value) > limit)


def test_the_limit_is_exact_at_64() -> None:
    for levels in (63, 64, 65, 900):
        body = ("[" * levels + "]" * levels).encode()
        assert rules.too_deep(body) == (levels > 64), levels
    # deep in one place only, among many shallow items (the outer list is one level)
    for inner in (63, 64):
        wide = json.dumps([[[1]]] * 1000 + [json.loads("[" * inner + "]" * inner)]).encode()
        assert rules.too_deep(wide) == (inner + 1 > 64), inner
