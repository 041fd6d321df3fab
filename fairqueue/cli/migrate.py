"""``fairqueue migrate``: create, upgrade or remove fairqueue's schema in a database, say which revision
it is at, pass it to or from a project's own Alembic, and check that Alembic's alembic.ini."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fairqueue.cli.args import EXIT_USAGE, database_url_option, refuse
from fairqueue.sql import HEAD
from fairqueue.urls import redact

_EPILOG = """\
examples:
  fairqueue migrate                                   upgrade to the latest revision (again: nothing to do)
  fairqueue migrate --current                         print the revision the database is at
  fairqueue migrate --revision fq0007 --downgrade     move down to fq0007
  fairqueue migrate --revision base --downgrade --yes-drop-data
                                                      remove fairqueue: its schema, every job, all history
  fairqueue migrate --check-alembic alembic.ini       does your own Alembic find fairqueue's revisions?
  fairqueue migrate --hand-over                       your own Alembic migrates the schema from now on
  fairqueue migrate --take-over                       `fairqueue migrate` migrates it again
see docs/migrations.md"""


def _usage_error(message: str) -> int:
    print(f"fairqueue: error: {message} (see: fairqueue migrate --help)", file=sys.stderr)
    return EXIT_USAGE


def _cmd_migrate(args: argparse.Namespace) -> int:
    from fairqueue import migrations
    from fairqueue.urls import resolve

    modes = [
        ("--current", args.current),
        ("--check-alembic", args.check_alembic is not None),
        ("--hand-over", args.hand_over),
        ("--take-over", args.take_over),
    ]
    mode = next((flag for flag, given in modes if given), None)
    if mode and (args.revision is not None or args.downgrade or args.yes_drop_data):
        return _usage_error(f"{mode} takes no --revision, --downgrade or --yes-drop-data")
    if args.downgrade and args.revision is None:
        return _usage_error("--downgrade needs --revision (the revision to move down to, or base)")
    if args.yes_drop_data and not args.downgrade:
        return _usage_error("--yes-drop-data goes with --downgrade")
    if args.check_alembic is not None:
        from fairqueue.alembic_check import AlembicConfigError, check_alembic_ini

        try:
            print(check_alembic_ini(args.check_alembic))
        except AlembicConfigError as exc:
            return refuse(str(exc))
        return 0

    url = resolve(args.database_url)
    where = redact(url)
    try:
        if args.current:
            state = migrations.schema_state(url)
            if not state.exists:
                return refuse(f"there is no fairqueue schema in {where}")
            if state.revision is None:
                return refuse(f"fairqueue's schema in {where} records no revision (an older fairqueue made it)")
            print(state.revision)
            return 0
        if args.hand_over:
            revision = migrations.hand_over(url)
            print(
                f"fairqueue's schema in {where} is at {revision}: your project's Alembic migrates it from now on "
                f"({migrations.VERSION_TABLE} dropped); upgrade it with `alembic upgrade fairqueue@head`"
            )
            return 0
        if args.take_over:
            revision = migrations.take_over(url)
            print(
                f"fairqueue's schema in {where} is at {revision}: `fairqueue migrate` migrates it from now on "
                f"(recorded in {migrations.VERSION_TABLE}); take fairqueue:_alembic/versions out of your "
                "alembic.ini's version_locations"
            )
            return 0
        revision = args.revision or "head"
        plan = migrations.plan(url, revision, downgrade=args.downgrade)
        if plan.direction is None:
            print(f"fairqueue schema in {where} is already {_at(plan.current)}: nothing to do")
            return 0
        if plan.drops:
            dropped = "; ".join(map(str, plan.drops))
            if not args.yes_drop_data:
                return refuse(
                    f"moving {where} down from {plan.current} to {revision} drops {dropped}: add --yes-drop-data "
                    "to do it; nothing was changed"
                )
            print(f"moving {where} down from {plan.current} to {revision}: dropping {dropped}")
        plan.run(drop_data=args.yes_drop_data)
    except migrations.MigrationRefused as exc:
        return refuse(str(exc))
    print(f"fairqueue schema in {where} is {_at(migrations.current_revision(url))}")
    return 0


def _at(revision: str | None) -> str:
    if revision is None:
        return "at base (nothing installed)"
    return f"at head ({revision})" if revision == HEAD else f"at {revision}"


def _revision(text: str) -> str:
    """argparse type of --revision: a revision id of this fairqueue, head or base."""
    from fairqueue.errors import ConfigurationError
    from fairqueue.migrations import target_revision

    try:
        target_revision(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_migrate_command(commands: Any) -> None:
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade fairqueue's tables and functions in a database",
        description=(
            "Apply fairqueue's migrations (Alembic revisions in the fairqueue branch): upgrade to the\n"
            "latest revision by default. Moving down needs --downgrade, and --yes-drop-data when the\n"
            "revisions it undoes drop data (base drops the schema: every job and all history)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    database_url_option(migrate)
    migrate.add_argument(
        "--revision",
        type=_revision,
        help="the revision to move to: an id such as fq0007, head (the default) or base (no fairqueue at all)",
    )
    migrate.add_argument("--downgrade", action="store_true", help="move down to --revision (refused without it)")
    migrate.add_argument(
        "--yes-drop-data",
        action="store_true",
        help="with --downgrade: confirm that the revisions it undoes may drop tables, columns or the whole schema",
    )
    modes = migrate.add_mutually_exclusive_group()
    modes.add_argument(
        "--current", action="store_true", help="print the revision the database is at (whichever tool migrated it)"
    )
    modes.add_argument(
        "--check-alembic",
        metavar="INI",
        help="check that the Alembic environment of this alembic.ini finds fairqueue's revisions (no database)",
    )
    modes.add_argument(
        "--hand-over",
        action="store_true",
        help="leave the schema to your project's own Alembic (after `alembic stamp <revision>`)",
    )
    modes.add_argument(
        "--take-over",
        action="store_true",
        help="migrate a schema your project's Alembic migrated so far (after `alembic stamp fairqueue@base`)",
    )
    migrate.set_defaults(func=_cmd_migrate)
