"""Make the collection in packaging/ansible importable for the unit tests.

Modules import their module_utils as ansible_collections.<ns>.<name>..., so
the collection must sit in such a tree: a symlink to the source in a temp
directory (namespace packages, no __init__.py needed) puts it there
without copying.
"""

import os
import pathlib
import sys
import tempfile

COLLECTION = pathlib.Path(__file__).resolve().parents[3] / "packaging" / "ansible" / "sparse_volume"

_tree = tempfile.TemporaryDirectory(prefix="sv-ansible-unit-")
_namespace = pathlib.Path(_tree.name) / "ansible_collections" / "sparse_volume"
_namespace.mkdir(parents=True)
os.symlink(COLLECTION, _namespace / "sparse_volume")
sys.path.insert(0, _tree.name)
