# Copyright: The sparse-volume project
# SPDX-License-Identifier: MIT
"""Run the sparse-volume CLI on behalf of this collection's modules.

The CLI owns every decision (what to create, grow, refuse); this file only
finds it, runs it with --json and turns its answer or its refusal into an
Ansible result, so the modules stay a translation of options.
"""

from __future__ import annotations

import json

# The CLI's stderr line for a failure starts with its name.
ERROR_PREFIX = "sparse-volume: "
# ... and a warning with this: it goes to stderr, never into the JSON.
WARNING_PREFIX = ERROR_PREFIX + "warning: "

# The keys of a failure's JSON that the task's result carries too: after a
# change (an apply whose later step failed) `changed` is true and `uuid`
# names the volume made, so the task neither hides the change nor loses
# the UUID the CLI chose.
FAILURE_KEYS = ("changed", "uuid", "actions")


def find_binary(module):
    """The CLI to run: a path as given, a bare name looked up on the node."""
    binary = module.params["binary"]
    if "/" in binary:
        return binary
    # get_bin_path also searches the sbin directories and fails the task
    # with a clear message when the package is not installed.
    return module.get_bin_path(binary, required=True)


def parse_report(stdout):
    """The CLI's JSON object, or None when stdout holds none."""
    try:
        report = json.loads(stdout)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def cli_warnings(stderr):
    """The CLI's warnings, without their prefix, in the order it gave them."""
    return [line.strip()[len(WARNING_PREFIX):] for line in stderr.splitlines()
            if line.strip().startswith(WARNING_PREFIX)]


def error_message(rc, stdout, stderr):
    """The CLI's one-line reason for a failed run."""
    report = parse_report(stdout)
    if report and report.get("error"):
        return report["error"]
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Log lines and warnings ("sparse-volume: warning: ...") may come
    # first; the failure itself is the last prefixed line.
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX) and not line.startswith(WARNING_PREFIX):
            return line[len(ERROR_PREFIX):]
    if lines:
        # A usage error (exit 2) is clap's text: the reason comes first.
        return lines[0]
    return "sparse-volume exited with status %d and printed no message" % rc


def exited_zero(rc, report):
    """The usual meaning of success: exit status 0."""
    return rc == 0


def run_json(module, args, data=None, succeeded=exited_zero):
    """Run the CLI; return its JSON report, or fail the task with its reason.

    `succeeded(rc, report)` says whether the run answered the question
    (`list` answers with exit 1 when a registry file does not read). The
    CLI's warnings become the task's, whatever the outcome.
    """
    cmd = [find_binary(module)] + list(args)
    rc, stdout, stderr = module.run_command(cmd, data=data)
    for warning in cli_warnings(stderr):
        module.warn(warning)
    report = parse_report(stdout)
    if not succeeded(rc, report):
        carried = {key: report[key] for key in FAILURE_KEYS if report and key in report}
        module.fail_json(msg=error_message(rc, stdout, stderr),
                         rc=rc, stdout=stdout, stderr=stderr, cmd=cmd, **carried)
    if report is None:
        module.fail_json(msg="sparse-volume printed no JSON report: %r" % stdout[:200],
                         rc=rc, stdout=stdout, stderr=stderr, cmd=cmd)
    return report
