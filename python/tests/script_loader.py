"""Loads one of the repo's scripts/*.py (hyphenated names, not importable) as a module for tests."""
import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(file_name: str):
    """The module of scripts/``file_name``, freshly executed."""
    spec = importlib.util.spec_from_file_location(file_name.removesuffix(".py").replace("-", "_"),
                                                  SCRIPTS / file_name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
