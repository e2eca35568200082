"""
Salt extension for sparse-volume. Salt's loader finds the execution module
in modules/ and the state module in states/ through the ``salt.loader``
entry point; the same two files ship as plain _modules/ and _states/ files.
"""
