"""``fairqueue migrate``: create, upgrade or remove fairqueue's schema in a database."""

from __future__ import annotations

import argparse
from typing import Any

from fairqueue.cli.args import database_url_option
from fairqueue.urls import redact


def _cmd_migrate(args: argparse.Namespace) -> int:
    from fairqueue import migrations
    from fairqueue.urls import resolve

    url = resolve(args.database_url)
    if args.revision == "base":
        migrations.downgrade(url, "base")
    elif args.downgrade:
        migrations.downgrade(url, args.revision)
    else:
        migrations.upgrade(url, args.revision)
    current = migrations.current_revision(url)
    head = migrations.head_revision()
    where = "at head" if current == head else f"at {current or 'base (nothing installed)'}"
    print(f"fairqueue schema in {redact(url)} is {where} ({current or '-'})")
    return 0


def add_migrate_command(commands: Any) -> None:
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade fairqueue's tables and functions in a database",
        description="Apply fairqueue's migrations (Alembic revisions in the fairqueue branch).",
    )
    database_url_option(migrate)
    migrate.add_argument("--revision", default="head", help="target revision (default: head; 'base' removes fairqueue)")
    migrate.add_argument("--downgrade", action="store_true", help="move down to --revision instead of up")
    migrate.set_defaults(func=_cmd_migrate)
