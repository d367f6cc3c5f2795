"""The test folders share their helper modules through pytest's ``pythonpath`` (pyproject.toml), so
every folder with a helper is listed there, and no two folders hold a helper of the same name (the
first folder on sys.path would silently win)."""

from __future__ import annotations

import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def helper_modules() -> dict[str, list[str]]:
    """Helper module name -> the test folders that hold one (test modules and conftests excluded)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests").glob("*/*.py")):
        if not path.name.startswith("test_") and path.name != "conftest.py":
            found[path.stem].append(path.parent.relative_to(ROOT).as_posix())
    return found


def test_helper_module_names_are_unique_across_test_folders():
    clashes = {name: folders for name, folders in helper_modules().items() if len(folders) > 1}
    assert clashes == {}


def test_every_folder_with_a_helper_is_on_pytests_pythonpath():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    folders = {folder for holders in helper_modules().values() for folder in holders}
    assert folders and folders <= set(config["pythonpath"])
    assert "tests" not in config["pythonpath"]  # tests/workflows would shadow the real `workflows`
