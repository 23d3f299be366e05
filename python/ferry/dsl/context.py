"""Which collective program is being written: the stack of CollectivePrograms whose ``with`` block
is running. A channel joins the innermost one when it is created (channel.py), so the modules that
record a program need only this, not the program's own module (program.py sits above them)."""

from __future__ import annotations

_active: list = []  # CollectiveProgram, innermost last


def enter(program) -> None:
    _active.append(program)


def leave(program) -> None:
    _active.remove(program)


def current_program():
    """The innermost CollectiveProgram whose ``with`` block is running; RuntimeError if none."""
    if not _active:
        raise RuntimeError("channels need an active CollectiveProgram: create them inside "
                           "`with CollectiveProgram(...) as prog:`")
    return _active[-1]
