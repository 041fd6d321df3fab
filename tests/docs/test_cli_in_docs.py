"""Every `fairqueue ...` command the documentation shows is one the CLI accepts: its subcommand
exists and its options parse (the commands are parsed, not run)."""

from __future__ import annotations

import contextlib
import io
import shlex

import pytest

from fairqueue.cli import build_parser
from tests.docs.snippets import Block, all_blocks

SHELLS = {"bash", "sh", "shell", "console"}


def _commands(block: Block) -> list[str]:
    text = block.text.replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip().removeprefix("$ ")
        # a command may follow environment assignments, `&&` or a pipe's left side
        for part in line.split("&&"):
            part = part.strip()
            try:
                words = shlex.split(part, comments=True) if part else []
            except ValueError:  # not shell (a heredoc's body, an SQL line): not a command
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]
            if words[:1] == ["fairqueue"]:
                out.append(shlex.join(words[1:]))
    return out


CASES = [(b.where, c) for b in all_blocks() if b.language in SHELLS for c in _commands(b)]


def test_the_documentation_shows_cli_commands() -> None:
    assert len(CASES) > 20


@pytest.mark.parametrize(("where", "command"), CASES, ids=[f"{w} fairqueue {c}"[:90] for w, c in CASES])
def test_a_documented_command_parses(where: str, command: str) -> None:
    parser = build_parser()
    err = io.StringIO()
    code: object = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(shlex.split(command))
        except SystemExit as exc:  # --help exits 0; a usage error exits 2
            code = exc.code
    assert code == 0, f"{where}: `fairqueue {command}`: {err.getvalue().strip()}"
