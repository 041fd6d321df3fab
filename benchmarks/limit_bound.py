"""What a shared limit counted where jobs are claimed could give the third tenant: a bound for the
design docs/design.md names as the next step for shared limits ("Limits at every level", Costs).

    python -m benchmarks.limit_bound [--pairs 2] [--seconds 20] [--limit 8] [--job-ms 0]

Runs the shared-limit scenario of benchmarks.fairness three ways, one after the other, --pairs
times: the three tenants without any limit (the control); acme's and globex's jobs under the shared
limit of --limit slots, as scenario 4 runs them; and instead of the limit, acme's and globex's
channels each capped at --limit / 2 running jobs. A channel's cap is counted by the claim that
serves the channel, with no pass through scheduled_job, a limit's line or limit_release, so the
third run shows what the fleet keeps when a cap costs only what the claim already does. For each
run it prints the jobs started per second and initech's share of what acme and globex leave of the
control's fleet (the figure scenario 4 reports), and what an acme or globex job cost in plain jobs.
Prints only (a diagnostic).
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks import fairness
from benchmarks._common import Run, database


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="a server to create the scratch database on (default: embedded)")
    p.add_argument("--pairs", type=int, default=2, help="rounds of the three runs (default 2)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each run (default 20)")
    p.add_argument("--limit", type=int, default=8, help="the shared limit's slots; each cap is half (default 8)")
    p.add_argument("--job-ms", type=int, default=0, help="each job waits this long (default 0: it does nothing)")
    cli = p.parse_args()
    if cli.limit < 2 or cli.limit % 2:
        p.error("--limit must be even and at least 2 (each of the two channels is capped at half)")
    args = argparse.Namespace(
        processes=2, concurrency=10, batch=10, backlog=5000, seconds=cli.seconds, limit=cli.limit,
        quick=False, no_doc=True, database_url=cli.database_url, pairs=1,
    )  # fmt: skip
    ratios: dict[str, list[float]] = {"shared limit": [], "channel caps": []}
    with database(cli.database_url) as url:
        run = Run("fairness", args, url, None, "limit_bound")
        for round_ in range(1, cli.pairs + 1):
            control, _ = fairness._limit_run(run, args, limited=False, job_ms=cli.job_ms)
            fleet = sum(control.values())
            print(f"round {round_}: no limit: {_rates(control)} (fleet {fleet:,.1f} jobs/s)")
            for name, limited, caps in (("shared limit", True, None), ("channel caps", False, cli.limit // 2)):
                rates, _ = fairness._limit_run(run, args, limited=limited, job_ms=cli.job_ms, channel_caps=caps)
                capped = rates["acme"] + rates["globex"]
                ratio = rates["initech"] / (fleet - capped) if fleet > capped else 0.0
                cost = 1 + (fleet - sum(rates.values())) / capped if capped else float("nan")
                ratios[name].append(ratio)
                print(f"round {round_}: {name}: {_rates(rates)}; initech {ratio:.2f} of what is left; "
                      f"an acme or globex job cost {cost:.2f} plain jobs")  # fmt: skip
    for name, values in ratios.items():
        print(f"{name}: initech's share, median {statistics.median(values):.2f} (rounds {_list(values)})")


def _rates(rates: dict[str, float]) -> str:
    return ", ".join(f"{c} {r:,.1f}" for c, r in rates.items()) + " jobs/s"


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
