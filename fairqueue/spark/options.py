"""The command-line options of the Spark commands (``fairqueue archive``, ``fairqueue report``)."""

from __future__ import annotations

import argparse
from typing import Any


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. spark.driver.memory=4g")
    return key.strip(), value.strip()


def add_spark_options(parser: argparse.ArgumentParser) -> None:
    """``--master URL`` and the repeatable ``--conf KEY=VALUE``."""
    parser.add_argument("--master", metavar="URL", help="Spark master (default local[*] or $FAIRQUEUE_SPARK_MASTER)")
    parser.add_argument(
        "--conf",
        dest="spark_conf",
        action="append",
        type=_conf_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, repeatable: e.g. --conf spark.driver.memory=4g, "
        "--conf spark.jars.packages=org.apache.hadoop:hadoop-aws:<version>",
    )


def spark_config(args: Any) -> dict[str, str]:
    """The settings a command starts Spark with: no console progress bars, then the ``--conf`` given."""
    config = {"spark.ui.showConsoleProgress": "false"}
    for key, value in getattr(args, "spark_conf", None) or []:
        config[key] = value
    return config
