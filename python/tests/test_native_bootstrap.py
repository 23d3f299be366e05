"""The C++ extension without a GPU: UniqueId round trips, the TCP bootstrap between processes over
loopback, the error types, and that waiting releases the GIL.

Needs ferry._ferry on the path (a build's python/ folder, or an installed package). Without it the
tests skip, unless FERRY_REQUIRE_NATIVE=1 (as scripts/test.sh sets when it built the extension):
then its absence is a failure.
"""

import os
import pickle
import threading
import time

import pytest

import ferry
from rank_processes import run_ranks

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

# Every rank listens on loopback: the tests run on machines without a second interface.
os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")


def test_unique_id_round_trips_through_hex_and_pickle():
    uid = ferry.UniqueId.create()
    assert ferry.UniqueId.from_hex(uid.hex()) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert uid.root_address.startswith("127.")
    assert uid != ferry.UniqueId.create()


def test_a_bad_hex_id_is_invalid_usage_and_a_value_error():
    with pytest.raises(ferry.InvalidUsage) as info:
        ferry.UniqueId.from_hex("not hex")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ferry.Error)
    assert info.value.code == 2  # ErrorCode::InvalidUsage


def _rank_main(uid, rank, size, results):
    try:
        boot = ferry.TcpBootstrap.create(uid, rank, size, timeout=30)
        gathered = boot.all_gather(bytes([rank]) * 3)
        boot.barrier()
        if rank == 0:
            boot.send(b"hello from 0", 1, 7)
        if rank == 1:
            assert boot.recv(0, 7) == b"hello from 0"
        sub = boot.split(rank % 2, rank)
        results.put((rank, gathered, sub.rank, sub.size, boot.local_size))
    except BaseException as e:  # reported to the parent, which fails the test
        results.put((rank, repr(e), None, None, None))


def test_ranks_meet_gather_send_and_split_across_processes():
    size = 3
    uid = ferry.UniqueId.create()
    got, codes = run_ranks(_rank_main, size, lambda r: (uid, r, size))
    assert codes == [0] * size
    for rank, gathered, sub_rank, sub_size, local_size in sorted(got):
        assert gathered == [bytes([r]) * 3 for r in range(size)], gathered
        assert (sub_rank, sub_size) == (rank // 2, 2 if rank % 2 == 0 else 1)
        assert local_size == size


def test_ranks_spawned_by_the_process_that_made_the_id():
    # Spawned ranks get the id pickled: the parent's reservation of the root port is given up, so
    # the spawned rank 0 can listen there (it would fail with "Address already in use" otherwise).
    size = 2
    uid = ferry.UniqueId.create()
    got, codes = run_ranks(_rank_main, size, lambda r: (uid, r, size), method="spawn", timeout=120)
    assert codes == [0] * size
    got = sorted(got)
    assert [g[1] for g in got] == [[bytes([r]) * 3 for r in range(size)]] * size, got


def test_a_rank_that_never_comes_is_a_timeout_naming_it():
    uid = ferry.UniqueId.create()
    start = time.monotonic()
    with pytest.raises(ferry.Timeout) as info:
        ferry.TcpBootstrap.create(uid, 0, 2, timeout=1.0)
    assert time.monotonic() - start < 10
    assert isinstance(info.value, TimeoutError)
    assert "rank" in str(info.value)


def test_bad_arguments_are_refused_before_anything_waits():
    uid = ferry.UniqueId.create()
    with pytest.raises(ferry.InvalidUsage):
        ferry.TcpBootstrap.create(uid, 5, 2, timeout=1.0)
    with pytest.raises(ferry.InvalidUsage):
        ferry.TcpBootstrap.create(uid, 0, 2, timeout=-1)


def test_waiting_for_ranks_releases_the_gil():
    uid = ferry.UniqueId.create()
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        with pytest.raises(ferry.Timeout):
            ferry.TcpBootstrap.create(uid, 0, 2, timeout=1.0)
    finally:
        stop.set()
        counter.join()
    assert ticks > 100, "the other thread barely ran while the bootstrap waited"


def test_enums_carry_the_cpp_values():
    assert int(ferry.DataType.bfloat16) == 9
    assert ferry.size_of(ferry.DataType.bfloat16) == 2
    assert int(ferry.ReduceOp.avg) == 4
    assert int(ferry.Collective.all_to_all) == 3
