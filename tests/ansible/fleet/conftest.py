"""The fleet scenario is a sequence of steps on one shared fleet.

A step that fails leaves the fleet in an unknown state, so the steps after
it are skipped (named) rather than failing for a reason that is not theirs.
The measured times are printed at the end of the run, pass or fail.
"""

import pytest

TIMINGS = []


def pytest_runtest_makereport(item, call):
    failed = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
    if failed and call.when in ("setup", "call"):
        item.session.sv_failed_step = item.name


def pytest_runtest_setup(item):
    failed = getattr(item.session, "sv_failed_step", None)
    if failed is not None:
        pytest.skip("an earlier step failed: " + failed)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("fleet timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)
