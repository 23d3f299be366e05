"""Command line of the DSL.

    python -m ferry.dsl compile PROGRAM.py --ranks 4 -o plan.json
    python -m ferry.dsl verify plan.json

A program file defines ``program(world_size: int) -> CollectiveProgram``: it builds the program for
that many ranks and returns it (ferry/programs/ holds examples). ``compile`` writes the plan as
JSON (to stdout without ``-o``) after checking it with the plan loader. ``verify`` runs the CPU
verifier (``ferry.plan.verify``); the exit status is 0 only when it finds nothing. Errors (no such
file, no ``program`` function, a program that raises) print one line to stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from .program import CollectiveProgram


class CliError(Exception):
    """An error the command line reports in one line, exit status 2."""


def load_program(path: str, world_size: int) -> CollectiveProgram:
    """Runs ``program(world_size)`` from the Python file ``path``; CliError on any failure."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"ferry_program_{file.stem}", file)
    if file.suffix != ".py" or spec is None or spec.loader is None:
        raise CliError(f"{path}: not a Python file (a program is a .py file defining program(world_size))")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise CliError(f"{path}: failed to import: {type(e).__name__}: {e}") from e
    fn = getattr(module, "program", None)
    if not callable(fn):
        raise CliError(f"{path}: defines no function `program(world_size: int) -> CollectiveProgram`")
    try:
        prog = fn(world_size)
    except Exception as e:
        raise CliError(f"{path}: program({world_size}) failed: {type(e).__name__}: {e}") from e
    if not isinstance(prog, CollectiveProgram):
        raise CliError(f"{path}: program({world_size}) returned {type(prog).__name__}, not a CollectiveProgram")
    return prog


def compile_plan(path: str, world_size: int) -> dict:
    """The checked plan dict of the program file ``path`` for ``world_size`` ranks."""
    from ferry.plan.load import PlanError, load_plan
    plan = load_program(path, world_size).to_plan()
    try:
        load_plan(plan)
    except PlanError as e:
        raise CliError(f"{path}: the compiled plan breaks the plan format: {e}") from e
    return plan


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ferry.dsl", description="ferry collective-program DSL")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile PROGRAM.py to a plan")
    c.add_argument("program", help="Python file defining program(world_size) -> CollectiveProgram")
    c.add_argument("--ranks", type=int, required=True, help="world size")
    c.add_argument("-o", "--output", help="plan file to write (default: stdout)")
    v = sub.add_parser("verify", help="verify a plan on the CPU; exit 0 only when nothing is found")
    v.add_argument("plan", help="plan JSON file")
    args = parser.parse_args(argv)
    if args.command == "verify":
        from ferry.plan.verify import main as verify_main
        return verify_main([args.plan])
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, not {args.ranks}")
    try:
        plan = compile_plan(args.program, args.ranks)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(plan, indent=1) + "\n"
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            print(f"error: {args.output}: cannot write: {e.strerror or e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0
