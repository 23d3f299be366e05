"""ferry.rendezvous without torch: ranks meet through a store of their own (what torchrun's agent
store or torch.distributed's store is to ferry.Comm()), twice in a row, each time with a fresh id."""

import multiprocessing
import os
import time

import pytest

import ferry
from rank_processes import run_ranks

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

from ferry import rendezvous  # noqa: E402

os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")


class _SharedStore:
    """torch.distributed.Store's set/get over a dict shared between processes: get waits for the
    key, as a TCPStore's does."""

    def __init__(self, table):
        self.table = table

    def set(self, key, value):
        self.table[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        deadline = time.monotonic() + 30
        while key not in self.table:
            if time.monotonic() > deadline:
                raise TimeoutError(key)
            time.sleep(0.01)
        return self.table[key]


def _rank_main(table, rank, size, results):
    try:
        store = _SharedStore(table)
        for round in range(2):
            boot = rendezvous.bootstrap_from_store(store, rank, size, timeout=30)
            assert (boot.rank, boot.size) == (rank, size)
            assert boot.all_gather(bytes([rank, round])) == [bytes([r, round]) for r in range(size)]
        results.put((rank, "ok"))
    except BaseException as e:  # reported to the parent, which fails the test
        results.put((rank, f"{type(e).__name__}: {e}"))


def test_ranks_meet_through_a_store_twice_with_fresh_ids():
    size = 3
    with multiprocessing.get_context("fork").Manager() as manager:
        table = manager.dict()
        got, _ = run_ranks(_rank_main, size, lambda r: (table, r, size))
        got = dict(got)
        assert got == {r: "ok" for r in range(size)}
        ids = sorted(k for k in table.keys())
        assert ids == ["ferry/bootstrap/0", "ferry/bootstrap/1"]
        assert table["ferry/bootstrap/0"] != table["ferry/bootstrap/1"]  # a fresh secret each time


def test_without_a_store_or_torchrun_variables_the_error_names_them(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    if rendezvous.torch_store() is not None or "RANK" in os.environ:
        pytest.skip("this process runs under torchrun or torch.distributed")
    with pytest.raises(ferry.InvalidUsage, match="RANK"):
        rendezvous.bootstrap_from_environment(timeout=1.0)
