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


def find_binary(module):
    """The CLI to run: a path as given, a bare name looked up on the node."""
    binary = module.params["binary"]
    if "/" in binary:
        return binary
    # get_bin_path also searches the sbin directories and fails the task
    # with a clear message when the package is not installed.
    return module.get_bin_path(binary, required=True)


def error_message(rc, stdout, stderr):
    """The CLI's one-line reason for a failed run."""
    try:
        report = json.loads(stdout)
    except ValueError:
        report = None
    if isinstance(report, dict) and report.get("error"):
        return report["error"]
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Log lines and warnings ("sparse-volume: warning: ...") may come
    # first; the failure itself is the last prefixed line.
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX) and not line.startswith(ERROR_PREFIX + "warning:"):
            return line[len(ERROR_PREFIX):]
    if lines:
        # A usage error (exit 2) is clap's text: the reason comes first.
        return lines[0]
    return "sparse-volume exited with status %d and printed no message" % rc


def run_json(module, args, data=None):
    """Run the CLI; return its JSON report, or fail the task with its reason."""
    cmd = [find_binary(module)] + list(args)
    rc, stdout, stderr = module.run_command(cmd, data=data)
    if rc != 0:
        module.fail_json(msg=error_message(rc, stdout, stderr),
                         rc=rc, stdout=stdout, stderr=stderr, cmd=cmd)
    try:
        return json.loads(stdout)
    except ValueError as e:
        module.fail_json(msg="sparse-volume printed no JSON report: %s" % e,
                         rc=rc, stdout=stdout, stderr=stderr, cmd=cmd)
