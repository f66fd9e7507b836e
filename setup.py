"""Packaging that pyproject.toml cannot say: install the repository's ``plugins/`` folder as
the package ``aggregator_plugins``, so that no top-level ``plugins`` package lands in
site-packages where another distribution's could clash with it. Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["aggregator", "aggregator.*"]), "aggregator_plugins"],
    package_dir={"aggregator_plugins": "plugins"},
)
