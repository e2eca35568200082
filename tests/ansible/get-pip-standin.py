"""Stand-in for the get-pip.py that `ansible-test --venv` downloads.

ansible-test bootstraps pip into each of its virtual environments with a
script it fetches from its own CI file host, which this machine cannot
reach (PyPI it can). run.sh puts this file where ansible-test caches that
script: the venv's own ensurepip provides a pip, which then installs the
pip version ansible-test asked for from PyPI, so its pins still hold.

ansible-test runs this with get-pip.py's arguments (pip options and
requirement specifiers, plus get-pip's own --no-setuptools/--no-wheel,
which only mean "do not install those", the ensurepip default anyway).
"""

import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}

pip_args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"],
               check=True, stdout=subprocess.DEVNULL)
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet"] + pip_args, check=True)
