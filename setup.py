"""The import package `magic` lives in `services/` (the user's layout); this maps one onto the other.

All metadata is in pyproject.toml.
"""

from setuptools import find_packages, setup

packages = ["magic" + name[len("services"):] for name in find_packages(include=["services", "services.*"])]
setup(packages=packages, package_dir={"magic": "services"})
