"""The channel layer from Python without a GPU: two processes register host memory, exchange the
descriptors, connect over shared host memory (and over Ethernet), and rank 0 writes into rank 1's
buffer and signals; rank 1 checks every byte. Also: descriptors round-trip through serialize(), and device handles come
out as bytes of the C++ struct's size."""

import ctypes
import os
import random

import pytest

import ferry
from rank_processes import run_ranks

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
NBYTES = 1 << 20


def _pattern(seed):
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(NBYTES))


def _rank(uid, rank, transport_name, results):
    try:
        boot = ferry.TcpBootstrap.create(uid, rank, 2, timeout=30)
        comm = ferry.Communicator(boot)
        peer = 1 - rank
        mine = ferry.host_alloc(NBYTES)
        ctypes.memset(mine.address, 0xA5, NBYTES)  # poison: what the write must replace
        transport = getattr(ferry.Transport, transport_name)
        reg = comm.register_memory(mine.address, NBYTES, transport)
        assert (reg.nbytes, reg.rank, reg.is_local, reg.device) == (NBYTES, rank, True, -1)
        comm.send_memory(reg, peer)
        pending_mem = comm.recv_memory(peer)
        pending_conn = comm.connect(peer, transport)
        theirs = pending_mem.get()
        conn = pending_conn.get()
        assert (theirs.rank, theirs.is_local, conn.remote_rank) == (peer, False, peer)
        sem = ferry.Host2HostSemaphore(comm, conn)
        if rank == 0:
            data = _pattern(7)
            ctypes.memmove(mine.address, data, NBYTES)
            conn.write(theirs, 0, reg, 0, NBYTES)
            conn.flush(timeout=20)
            sem.signal()
            results.put((rank, "ok"))
        else:
            sem.wait(timeout=20)
            got = ctypes.string_at(mine.address, NBYTES)
            results.put((rank, "ok" if got == _pattern(7) else "wrong bytes"))
        boot.barrier()
    except BaseException as e:
        results.put((rank, f"{type(e).__name__}: {e}"))


def test_a_write_over_a_host_memory_connection_lands_byte_for_byte():
    uid = ferry.UniqueId.create()
    # Spawned, not forked: host_alloc registers memory with CUDA, which a child forked from a
    # process that has used CUDA (the GPU tests before this one) cannot do.
    got, _ = run_ranks(_rank, 2, lambda r: (uid, r, "host_memory"), method="spawn")
    got = dict(got)
    assert got == {0: "ok", 1: "ok"}


def test_a_write_over_an_ethernet_connection_lands_byte_for_byte():
    # The same over TCP: the bytes travel, and rank 1's side of the connection writes them in.
    uid = ferry.UniqueId.create()
    got, _ = run_ranks(_rank, 2, lambda r: (uid, r, "ethernet"), method="spawn")
    got = dict(got)
    assert got == {0: "ok", 1: "ok"}


def test_a_descriptor_round_trips_and_garbage_is_a_protocol_error():
    boot = ferry.TcpBootstrap.create(ferry.UniqueId.create(), 0, 1, timeout=10)
    comm = ferry.Communicator(boot)
    mine = ferry.host_alloc(4096)
    reg = comm.register_memory(mine.address, 4096, [ferry.Transport.host_memory])
    again = ferry.RegisteredMemory.deserialize(reg.serialize())
    assert (again.address, again.nbytes, again.is_local) == (mine.address, 4096, True)
    with pytest.raises(ferry.ProtocolError):
        ferry.RegisteredMemory.deserialize(b"\x00" * 40)


def test_device_handles_have_the_sizes_of_the_cpp_structs():
    assert ferry._ferry.memory_channel_handle_bytes > ferry._ferry.semaphore_handle_bytes > 0
    assert ferry._ferry.port_channel_handle_bytes > 0
