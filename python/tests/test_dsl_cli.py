"""The command line: compile and verify round trip through subprocesses, and its error messages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
PROGRAMS = PYTHON_DIR / "ferry" / "programs"


def dsl(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    return subprocess.run([sys.executable, "-m", "ferry.dsl", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=60)


def test_compile_then_verify_round_trip(tmp_path):
    out = tmp_path / "plan.json"
    res = dsl("compile", PROGRAMS / "allreduce_ring.py", "--ranks", 4, "-o", out)
    assert res.returncode == 0, res.stderr
    plan = json.loads(out.read_text())
    assert (plan["format"], plan["world_size"], plan["collective"]) == ("ferry-plan", 4, "allreduce")
    res = dsl("verify", out)
    assert res.returncode == 0, res.stdout + res.stderr


def test_verify_fails_on_a_broken_plan(tmp_path):
    res = dsl("compile", PROGRAMS / "allgather_allpairs.py", "--ranks", 2)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    ops = plan["ranks"][1]["thread_blocks"][0]["ops"]
    plan["ranks"][1]["thread_blocks"][0]["ops"] = [o for o in ops if o["op"] != "put"]   # rank 0 never gets data
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    res = dsl("verify", bad)
    assert res.returncode != 0
    assert "rank 0" in res.stdout + res.stderr


def test_program_file_without_function(tmp_path):
    f = tmp_path / "empty.py"
    f.write_text("x = 1\n")
    res = dsl("compile", f, "--ranks", 2)
    assert res.returncode == 2
    assert "defines no function `program(world_size: int) -> CollectiveProgram`" in res.stderr


@pytest.mark.parametrize("body,message", [
    ("def program(w):\n    return 3\n", "returned int, not a CollectiveProgram"),
    ("def program(w):\n    raise ValueError('boom')\n", "program(2) failed: ValueError: boom"),
    ("import no_such_module_xyz\n", "failed to import: ModuleNotFoundError"),
])
def test_program_errors_are_one_line(tmp_path, body, message):
    f = tmp_path / "p.py"
    f.write_text(body)
    res = dsl("compile", f, "--ranks", 2)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_file():
    res = dsl("compile", "/nonexistent/p.py", "--ranks", 2)
    assert res.returncode == 2 and "no such file" in res.stderr


def test_a_program_that_is_not_python_and_an_unwritable_output_are_one_line(tmp_path):
    txt = tmp_path / "program.txt"
    txt.write_text("def program(w):\n    return None\n")
    res = dsl("compile", txt, "--ranks", 2)
    assert res.returncode == 2 and "not a Python file" in res.stderr and "Traceback" not in res.stderr
    res = dsl("compile", PROGRAMS / "allreduce_ring.py", "--ranks", 2, "-o", tmp_path / "no" / "such" / "dir.json")
    assert res.returncode == 2 and "cannot write" in res.stderr and "Traceback" not in res.stderr
