"""Map the source folders to their import names: operator/ -> strata.operator,
cacheserver/ -> strata.cacheserver. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = {"strata.operator": "operator", "strata.cacheserver": "cacheserver"}


def mapped_packages() -> list[str]:
    packages = []
    for name, folder in FOLDERS.items():
        packages.append(name)
        packages.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return packages


setup(packages=mapped_packages(), package_dir=FOLDERS)
