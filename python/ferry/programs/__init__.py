"""The shipped collective programs. Each module defines ``program(world_size) -> CollectiveProgram``
and compiles with ``python -m ferry.dsl compile ferry/programs/NAME.py --ranks N``.

``PROGRAMS`` names them all. It is not a hand-kept list: it is every file of this directory that
matches ``PROGRAM_GLOB``, the pattern tests/unit/CMakeLists.txt compiles for the C++ cross-check, so
pytest verifies exactly the programs the C++ side loads and a new file cannot be left out of either.
A helper module that is not a program must start with an underscore (like this file) to stay out."""

from pathlib import Path

PROGRAM_GLOB = "[a-z]*.py"



def discover(directory: Path) -> tuple[str, ...]:
    """The names of the program files in ``directory``, sorted."""
    return tuple(sorted(p.stem for p in directory.glob(PROGRAM_GLOB)))


_HERE = Path(__file__).parent
PROGRAMS = discover(_HERE)


def path_of(name: str) -> Path:
    """The program file of shipped program ``name``."""
    return _HERE / f"{name}.py"
