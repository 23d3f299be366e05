"""python -m ferry.net_bench runs end to end on loopback (two ferry ranks and a plain socket) and
prints a row per size."""

import os

import pytest

import ferry

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)


def test_the_table_has_a_row_per_size(capsys, monkeypatch):
    from ferry import net_bench

    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    assert net_bench.main(["-b", "4K", "-e", "64K", "-f", "4", "-n", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line and line[0] != "#"]
    assert [r[0] for r in rows[1:]] == ["4096", "16384", "65536"]
    assert all(float(r[2]) > 0 and float(r[4]) > 0 for r in rows[1:])
