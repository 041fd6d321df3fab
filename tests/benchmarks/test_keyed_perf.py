"""benchmarks/keyed_perf.py: how it reads perf's call stacks, and (where perf may attach to the server) a
smallest run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.keyed_perf import in_take_keyed, phase, samples

ROOT = Path(__file__).resolve().parents[2]

# leaf first, as perf script prints them; the claim (called in FROM by the client's statement) calls _take_keyed
# in FROM, and _advance_vtime_floor in an expression
CLAIM = ["plpgsql_exec_function", "plpgsql_call_handler", "fmgr_security_definer", "ExecMakeTableFunctionResult"]
CLAIM += ["FunctionNext", "ExecScan", "standard_ExecutorRun", "PortalRun", "PostgresMain", "main"]
TAKE_KEYED = ["plpgsql_exec_function", "plpgsql_call_handler", "ExecMakeTableFunctionResult", "FunctionNext"]
TAKE_KEYED += ["standard_ExecutorRun", "_SPI_execute_plan", "exec_stmt_execsql", "exec_stmts"]
FLOOR = ["plpgsql_exec_function", "plpgsql_call_handler", "ExecInterpExpr", "exec_eval_simple_expr", "exec_stmts"]


def test_a_sample_is_put_in_take_keyed_only_when_its_innermost_function_was_called_in_from() -> None:
    index_scan = ["_bt_first", "IndexNext", "ExecScan", "standard_ExecutorRun", "_SPI_execute_plan"]
    setup = ["ExecInitNode", "standard_ExecutorStart", "_SPI_execute_plan"]
    assert in_take_keyed(index_scan + TAKE_KEYED + CLAIM)
    assert phase(index_scan + TAKE_KEYED + CLAIM) == "statement run (ExecutorRun/Finish)"
    assert in_take_keyed(setup + TAKE_KEYED + CLAIM)
    assert phase(setup + TAKE_KEYED + CLAIM) == "statement set-up (ExecutorStart)"
    assert not in_take_keyed(index_scan + CLAIM)  # the claim's own statements
    assert not in_take_keyed(index_scan + FLOOR + CLAIM)  # another function the claim calls
    assert not in_take_keyed(["XLogFlush", "CommitTransaction", "PostgresMain", "main"])
    assert phase(["XLogFlush", "CommitTransaction", "PostgresMain", "main"]) == "commit (WAL flush)"


def test_the_stacks_of_perf_script_are_read_leaf_first() -> None:
    text = "\n\t  5c4acf _bt_first\n\t  16e4c2 IndexNext\n\n\t  1236f2 XLogFlush\n\t  16dc98 [unknown]\n"
    assert list(samples(text)) == [["_bt_first", "IndexNext"], ["XLogFlush", "[unknown]"]]


def _perf_may_attach() -> bool:
    if shutil.which("perf") is None:
        return False
    try:
        paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return False
    return os.geteuid() == 0 or paranoid <= 1


@pytest.mark.slow
@pytest.mark.skipif(not _perf_may_attach(), reason="perf is missing or may not attach to the server's processes")
def test_a_smallest_run_profiles_the_keyed_claim() -> None:
    small = ["--jobs", "2000", "--channels", "20", "--keys", "10", "--rounds", "100", "--frequency", "499"]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.keyed_perf", *small],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "claim of 10: p50" in out.stdout
    assert "in _take_keyed: " in out.stdout and "everything else: " in out.stdout
