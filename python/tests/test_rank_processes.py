"""rank_processes.run_ranks, the harness of the multi-process tests: a rank that hangs fails the
test in time and the error shows where it waits; ranks that crash fail it at once, with how they
ended and where; ranks that report come back with their exit codes."""
import os
import time

import pytest

from rank_processes import RanksDied, report, run_ranks


def _reports(rank, results):
    report(results, (rank, rank * 10))


def _hangs_in_rank_1(rank, results):
    if rank == 1:
        time.sleep(600)
    report(results, (rank, "done"))


def _crashes(rank, results):
    os._exit(3)


def _rank_0_reports_and_lingers(rank, results):
    if rank == 0:
        report(results, (0, "done"))
        time.sleep(600)  # (a teardown that takes its time)
    os._exit(3)


def _segfaults(rank, results):
    if rank == 1:
        import ctypes

        ctypes.string_at(0)  # a read of address 0: SIGSEGV
    report(results, (rank, "done"))


def test_every_rank_reports():
    got, codes = run_ranks(_reports, 3, lambda r: (r,))
    assert sorted(got) == [(0, 0), (1, 10), (2, 20)]
    assert codes == [0, 0, 0]


def test_a_hung_rank_is_named_with_where_it_waits():
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        run_ranks(_hangs_in_rank_1, 2, lambda r: (r,), timeout=3)
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert "silent: [1]" in message and "rank 1: still running" in message
    assert "_hangs_in_rank_1" in message  # its stack


def test_ranks_that_crash_fail_at_once_with_their_exit_codes():
    start = time.monotonic()
    with pytest.raises(RanksDied) as info:
        run_ranks(_crashes, 2, lambda r: (r,), timeout=60)
    assert time.monotonic() - start < 20
    assert "rank 0: exited with code 3" in str(info.value)
    assert "rank 1: exited with code 3" in str(info.value)


def test_a_crash_is_seen_at_once_while_a_rank_that_reported_lingers():
    start = time.monotonic()
    with pytest.raises(RanksDied) as info:
        run_ranks(_rank_0_reports_and_lingers, 2, lambda r: (r,), timeout=60)
    assert time.monotonic() - start < 20
    assert "silent: [1]" in str(info.value) and "rank 1: exited with code 3" in str(info.value)


def test_a_crashed_rank_shows_where_it_was():
    with pytest.raises(RanksDied) as info:
        run_ranks(_segfaults, 2, lambda r: (r,), method="spawn", timeout=60)
    text = str(info.value)
    assert "rank 1: killed by signal 11 (SIGSEGV)" in text
    assert "Segmentation fault" in text and "in _segfaults" in text
