"""scripts/gpu-bundle.sh: what `pack` puts in the bundle, and that `tests` runs every GPU test
program the way ctest does (plan directories, timeouts) under the guard, with a summary that
names the failures. Fake programs stand in for the real ones: shell scripts that print how they
were run, which is enough to check the script without a GPU."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LIBM = next((p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/lib64/libm.so.6"),
                          Path("/usr/lib64/libm.so.6")) if p.exists()), None)

PROGRAMS = ["tests/gpu/gpu_device_primitives", "tests/gpu/gpu_fifo", "tests/gpu/gpu_memory_sharing",
            "tests/gpu/gpu_memory_leak", "tests/gpu/gpu_channels", "tests/gpu/gpu_collectives",
            "tests/gpu/gpu_p2p", "tests/gpu/gpu_runtime_algorithms", "tests/gpu/gpu_foreign_connection",
            "tests/gpu/gpu_host_partners", "tests/gpu/gpu_comm_across_hosts",
            "tests/guard/gpu_guard_driver", "tools/ferry-bench/ferry-bench", "tools/ferry-perf/ferry-perf"]


def fake_checkout(root: Path, failing: str) -> None:
    """A repository with the script and a build/default of fake programs; `failing` exits 3."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts/gpu-bundle.sh", root / "scripts/gpu-bundle.sh")
    build = root / "build/default"
    for program in PROGRAMS:
        path = build / program
        path.parent.mkdir(parents=True, exist_ok=True)
        status = 3 if path.name == failing else 0
        path.write_text('#!/bin/sh\necho "ran $0 $* plans=$FERRY_PLAN_DIR lanes=$FERRY_PLAN_LANES '
                        f'test_plans=$FERRY_TEST_PLAN_DIR preload=$LD_PRELOAD libs=$LD_LIBRARY_PATH"\nexit {status}\n')
        path.chmod(0o755)
    (build / "tools/guard").mkdir(parents=True)
    (build / "tools/guard/libferry_guard.so").write_bytes(b"")  # preloading it only warns
    (build / "tools/guard/libferry_guard.so").chmod(0o755)
    # libferry.so: any shared library with a soname stands in.
    (build / "src").mkdir()
    shutil.copy(LIBM, build / "src/libferry.so.0.1.0")
    os.symlink("libferry.so.0.1.0", build / "src/libferry.so.0.1")
    os.symlink("libferry.so.0.1", build / "src/libferry.so")
    (build / "tests/unit/compiled_plans").mkdir(parents=True)
    (build / "tests/unit/compiled_plans/allgather_port_2.json").write_text("{}")


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("objcopy") is None or LIBM is None,
                    reason="needs xz, objcopy and a libm.so.6 to stand in for libferry.so")
def test_pack_then_tests_runs_each_program_as_ctest_does(tmp_path):
    fake_checkout(tmp_path, failing="gpu_fifo")
    script = tmp_path / "scripts/gpu-bundle.sh"
    packed = subprocess.run([str(script), "pack"], capture_output=True, text=True)
    assert packed.returncode == 0, packed.stderr
    listing = subprocess.run(["tar", "-tJf", str(tmp_path / ".gpu-bin/bundle.tar.xz")], capture_output=True,
                             text=True).stdout.split()
    names = {Path(n).name for n in listing}
    assert {"gpu_collectives", "gpu_guard_driver", "ferry-bench", "libferry_guard.so", "libm.so.6",
            "allgather_port_2.json"} <= names

    out = tmp_path / "out"
    ran = subprocess.run([str(script), "tests"], capture_output=True, text=True,
                         env={**os.environ, "OUT": str(out)})
    assert ran.returncode != 0  # gpu_fifo failed
    summary = (out / "summary.txt").read_text()
    assert "gpu_fifo" in summary and "FAILED(3)" in summary
    assert "14 run, 1 failed" in summary
    plans = (out / "gpu_collectives_plans_one_lane.log").read_text()
    assert "gpu_collectives --gtest_filter=*Plan*" in plans
    assert "compiled_plans lanes=1" in plans
    assert "libferry_guard.so" in plans
    assert "test_plans= " in (out / "gpu_p2p.log").read_text()  # only where ctest sets it
    assert "test_plans=" + str(tmp_path / "build-bundle/compiled_plans") in \
        (out / "gpu_runtime_algorithms.log").read_text()

    # A second lane beside the first: every program still runs once, the failure still counts.
    beside = subprocess.run([str(script), "tests"], capture_output=True, text=True,
                            env={**os.environ, "OUT": str(tmp_path / "out3"), "GPU_TESTS_BESIDE": "fifo|^gpu_p2p$"})
    assert beside.returncode != 0
    lines = (tmp_path / "out3/summary.txt").read_text().splitlines()
    assert "14 run, 1 failed" in lines[-1]
    names = sorted(line.split()[0] for line in lines[:-1])
    assert names == sorted(line.split()[0] for line in summary.splitlines()[:-1])

    # All but those GPU_TESTS_EXCLUDE names.
    rest = subprocess.run([str(script), "tests"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path / "out5"),
                               "GPU_TESTS_EXCLUDE": "^gpu_memory_leak$|fifo"})
    assert rest.returncode == 0, rest.stdout + rest.stderr
    ran = (tmp_path / "out5/summary.txt").read_text()
    assert "12 run, 0 failed" in ran and "gpu_memory_leak" not in ran and "gpu_fifo" not in ran

    # The tests on a variant's library: its folder first on the library path.
    made = subprocess.run([str(script), "variant", "v1"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    on_variant = subprocess.run([str(script), "with", "v1", "tests", "p2p"], capture_output=True, text=True,
                                env={**os.environ, "OUT": str(tmp_path / "out4")})
    assert on_variant.returncode == 0, on_variant.stdout + on_variant.stderr
    libs = (tmp_path / "out4/gpu_p2p.log").read_text().split("libs=")[1].split(":")
    assert libs[0].endswith("/v1") and libs[1] == str(tmp_path / "build-bundle")

    only = subprocess.run([str(script), "tests", "p2p"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path / "out2")})
    assert only.returncode == 0, only.stdout + only.stderr
    assert "1 run, 0 failed" in (tmp_path / "out2/summary.txt").read_text()


@pytest.mark.skipif(LIBM is None, reason="needs a libm.so.6 to stand in for libferry.so")
def test_run_refuses_without_a_bundle(tmp_path):
    fake_checkout(tmp_path, failing="")
    ran = subprocess.run([str(tmp_path / "scripts/gpu-bundle.sh"), "run", "./ferry-bench"], capture_output=True,
                         text=True)
    assert ran.returncode == 1
    assert "bundle.tar.xz is missing" in ran.stderr
