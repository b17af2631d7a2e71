"""Which packages the wheel holds (everything else is in pyproject.toml).

Found, not listed by hand: every package under autotune/, converters/ (installed as
autotune_converters) and base/ (installed as autotune_base), plus configs/ installed as
autotune_configs (find cannot rename a folder, hence this file).
tests/test_packaging.py builds the wheel from a clean copy and compares it with the tree.
"""

from setuptools import find_packages, setup

# Folder -> installed name: every top-level name in the wheel is the project's own
# (the package index has another project called `converters`).
RENAMED = {"converters": "autotune_converters", "base": "autotune_base",
           "configs": "autotune_configs"}


def _renamed(folder: str) -> list[str]:
    found = [folder] + [f"{folder}.{p}" for p in find_packages(where=folder)]
    return [RENAMED[folder] + p[len(folder):] for p in found]


setup(
    packages=find_packages(include=["autotune", "autotune.*"])
    + _renamed("converters") + _renamed("base") + ["autotune_configs"],
    package_dir={name: folder for folder, name in RENAMED.items()},
)
