"""The examples of docs/python.md without a GPU: each parses, and the CUDA kernel that
custom_allreduce.py compiles at run time compiles here against the repository's device headers
(with nvcc; skipped where there is none). The GPU check runs them under torchrun."""

import ast
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "python" / "examples").glob("*.py"))


def _constant(path, name):
    """The value of the module-level string constant `name` in `path`, without running the file."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def test_there_are_examples_and_each_parses():
    assert {p.stem for p in EXAMPLES} >= {"builtin_algorithms", "dsl_plan", "custom_allreduce"}
    for path in EXAMPLES:
        ast.parse(path.read_text(), filename=str(path))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_custom_kernel_compiles_against_the_device_headers(tmp_path):
    source = tmp_path / "kernel.cu"
    source.write_text(_constant(ROOT / "python" / "examples" / "custom_allreduce.py", "KERNEL"))
    # The options the example gives CuPy's nvcc backend, for the GPUs ferry builds for.
    cmd = ["nvcc", "-c", "-std=c++20", "--expt-relaxed-constexpr", "-arch=sm_90", f"-I{ROOT / 'include'}",
           "-o", str(tmp_path / "kernel.o"), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
