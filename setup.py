"""Which packages the wheel holds (everything else is in pyproject.toml).

Found, not listed by hand: every package under autotune/ and converters/, plus configs/
installed under the name autotune_configs (find cannot rename a folder, hence this file).
tests/test_packaging.py builds the wheel from a clean copy and compares it with the tree.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["autotune", "autotune.*", "converters", "converters.*"])
    + ["autotune_configs"],
    package_dir={"autotune_configs": "configs"},
)
