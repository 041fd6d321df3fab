"""The log records docs/operations.md tells operators to alert on are ones the worker writes: every
message of its table is in the package's source, as written (a message reworded in the code and not in
the table would leave an alert that never fires)."""

from __future__ import annotations

import re

from tests.docs.snippets import REPO

OPERATIONS = REPO / "docs" / "operations.md"


def _table_messages() -> list[str]:
    doc = OPERATIONS.read_text()
    start = doc.index("The records worth alerting on")
    table = doc[start : doc.index("\n### ", start)]
    messages = []
    for line in table.splitlines():
        if line.startswith("| `"):
            messages += re.findall(r"`([^`]+)`", line.split(" | ")[0])
    return messages


def test_every_message_of_the_alerting_table_is_one_the_worker_writes() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "fairqueue").rglob("*.py"))
    messages = _table_messages()
    assert len(messages) >= 15, messages  # the table was found and read
    missing = [m for m in messages if f'"{m}"' not in source]
    assert not missing, f"docs/operations.md lists log messages the code does not write: {missing}"
