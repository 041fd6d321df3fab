"""Input checks at the edge (fairqueue.validation) seen through the public Python API: what the
database could not take, or what would break claims for every channel, is refused before writing."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.validation import clean_text

TOO_WIDE: list[tuple[dict[str, Any], str]] = [
    ({"rate_limit": "1/1000000000d"}, "is too slow: at least 1 job per 365 days"),
    ({"rate_limit": "1/366d"}, "is too slow"),
    ({"rate_limit": "1000001/s"}, "is too fast: at most 1,000,000 jobs per second"),
    ({"rate_limit": "9" * 400 + "/s"}, "is not understood"),
    ({"rate_limit": "9" * 90 + "/s"}, "is too fast"),
    ({"rate_limit": "1/" + "9" * 90 + "d"}, "is too slow"),
    ({"rate_limit": "1/s", "burst": 3_000_000_000}, "burst must be at most 1,000,000"),
    ({"max_concurrency": 99_999_999_999}, "max_concurrency must be at most 1,000,000"),
    ({"max_concurrency": 2**31}, "max_concurrency must be at most"),
]


@pytest.mark.parametrize(("kwargs", "message"), TOO_WIDE, ids=[str(k) for k, _ in TOO_WIDE])
def test_configure_channel_refuses_limits_the_claim_cannot_use(
    conn: psycopg.Connection[Any], worker: int, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(fairqueue.InvalidChannelConfigError, match=message):
        fairqueue.configure_channel(conn, "acme", **kwargs)
    assert conn.execute("SELECT count(*) FROM fairqueue.channel").fetchone() == (0,)
    fairqueue.enqueue(conn, "k", channel="other")
    assert len(fairqueue.claim_batch(conn, worker, 5)) == 1


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("plain", "plain"),
        ("bad \x00 text", "bad \\0 text"),
        ("\ud800", "\\ud800"),
        ("a\x00\udcff", "a\\0\\udcff"),
        ("ünïcødé ✓", "ünïcødé ✓"),
    ],
)
def test_clean_text_makes_any_text_storable(conn: psycopg.Connection[Any], text: str, cleaned: str) -> None:
    assert clean_text(text) == cleaned
    assert conn.execute("SELECT %s::text", (clean_text(text),)).fetchone() == (cleaned,)


NUL_OR_NOT = [
    ("\x00", True),
    ("a\x00b", True),
    ("\\\x00", True),  # a backslash, then a NUL: JSON writes \\ then \u0000
    ("\\u0000", False),  # the six characters \u0000: JSON writes \\u0000
    ("\\\\u0000", False),  # two backslashes, then u0000
    ("\\\\\x00", True),
    ("C:\\u0000\\x", False),
]


@pytest.mark.parametrize(("text", "is_nul"), NUL_OR_NOT, ids=[repr(t) for t, _ in NUL_OR_NOT])
def test_only_a_real_nul_character_is_refused_in_json(text: str, is_nul: bool) -> None:
    from fairqueue.errors import InvalidJobError
    from fairqueue.validation import encode_json

    for value in ({"text": text}, {text: 1}, {"list": [1, {"deep": text}]}):
        if is_nul:
            with pytest.raises(InvalidJobError, match="contains a NUL character"):
                encode_json("args", value, limit=1 << 20, require_object=True)
        else:
            assert json.loads(encode_json("args", value, limit=1 << 20, require_object=True)) == value


def test_visible_writes_every_control_character_as_an_escape() -> None:
    from fairqueue.text import visible

    assert visible("plain name-1.é") == "plain name-1.é"
    assert visible("a\nb\rc\td\x1b[2Je\x00f\x7fg\x85h\x9bi\u2028j") == (
        "a\\nb\\rc\\td\\x1b[2Je\\x00f\\x7fg\\x85h\\x9bi\\u2028j"
    )
    assert visible("Traceback\n  File\x1b\r\n", keep_newlines=True) == "Traceback\n  File\\x1b\\r\n"
    assert visible("a\\nb") == "a\\nb"  # a backslash stays as it is
