"""One rank of test_native_netns.py, started inside a network namespace of its own (a "host") by
`ip netns exec`, so that the two ranks reach each other only over the veth pair between the
namespaces, through ferry's Ethernet connection.

    python netns_rank.py RANK UID_FILE SCENARIO

Rank 0 makes the UniqueId (its bootstrap listens on its namespace's address) and writes it to
UID_FILE; rank 1 reads it from there. Each rank prints progress lines ("sending", "waiting") that
the test waits for, and its last line is "ok" or "error: ...". Exit status 0 when it printed "ok".
"""

import ctypes
import os
import random
import sys
import time

import ferry

POISON = 0xA5
# Odd sizes and offsets; the largest crosses the connection's staging chunks many times.
SIZES = (1, 3, 4097, (1 << 20) + 13, (64 << 20) + 5)


def _pattern(seed, n):
    return random.Random(seed).randbytes(n)


def _setup(rank, uid_file, nbytes):
    if rank == 0:
        uid = ferry.UniqueId.create()
        tmp = uid_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(uid.hex())
        os.replace(tmp, uid_file)
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(uid_file):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 1: rank 0 wrote no UniqueId to {uid_file} in 30 s")
            time.sleep(0.05)
        with open(uid_file) as f:
            uid = ferry.UniqueId.from_hex(f.read())
    boot = ferry.TcpBootstrap.create(uid, rank, 2, timeout=30)
    comm = ferry.Communicator(boot)
    peer = 1 - rank
    mine = ferry.host_alloc(nbytes)
    reg = comm.register_memory(mine.address, nbytes, [ferry.Transport.ethernet])
    comm.send_memory(reg, peer)
    pending_mem = comm.recv_memory(peer)
    pending_conn = comm.connect(peer, ferry.Transport.ethernet)
    theirs, conn = pending_mem.get(), pending_conn.get()
    sem = ferry.Host2HostSemaphore(comm, conn)
    return boot, mine, reg, theirs, conn, sem


def transfers(rank, uid_file):
    """Both directions, every size, each at an odd offset and cut into three writes of uneven
    length before one signal: the receiver checks every byte of the range right after its wait
    (a signal that overtook a write shows as poison), and the poison on both sides of it."""
    top = max(SIZES) + 64
    boot, mine, reg, theirs, conn, sem = _setup(rank, uid_file, top)
    for i, size in enumerate(SIZES * 2):
        sender = i % 2
        off = 7 + i
        ctypes.memset(mine.address, POISON, top)
        boot.barrier()  # the receiver is poisoned before anything is written into it
        data = _pattern(i, size)
        if rank == sender:
            ctypes.memmove(mine.address + off, data, size)
            cuts = sorted({0, size // 3, (2 * size) // 3 + 1, size})
            cuts = [c for c in cuts if c <= size]
            for a, b in zip(cuts, cuts[1:]):
                conn.write(theirs, off + a, reg, off + a, b - a)
            conn.flush(timeout=60)
            sem.signal()
        else:
            sem.wait(timeout=60)
            got = ctypes.string_at(mine.address + off, size)
            if got != data:
                bad = next(k for k in range(size) if got[k] != data[k])
                return f"error: round {i}: {size} bytes from rank {sender}: first wrong byte at {bad}"
            edges = ctypes.string_at(mine.address + off - 1, 1) + ctypes.string_at(mine.address + off + size, 1)
            if edges != bytes([POISON, POISON]):
                return f"error: round {i}: a byte outside the {size} written was changed"
    boot.barrier()
    return "ok"


def killed(rank, uid_file):
    """Rank 0 writes 256 MiB at a time until the test kills it; rank 1 waits for a signal that never
    comes: its wait must end as soon as the connection breaks, with an error that names rank 0."""
    nbytes = 256 << 20
    boot, mine, reg, theirs, conn, sem = _setup(rank, uid_file, nbytes)
    boot.barrier()
    if rank == 0:
        print("sending", flush=True)
        while True:
            conn.write(theirs, 0, reg, 0, nbytes)
            conn.flush(timeout=60)
    print("waiting", flush=True)
    start = time.monotonic()
    try:
        sem.wait(timeout=10)
    except Exception as e:  # noqa: BLE001  (which ferry error it is, the test reads from the line)
        return f"ok: {type(e).__name__} after {time.monotonic() - start:.1f} s: {e}"
    return "error: the wait returned though rank 0 never signalled"


def main():
    rank, uid_file, scenario = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    try:
        line = {"transfers": transfers, "killed": killed}[scenario](rank, uid_file)
    except Exception as e:  # noqa: BLE001  (reported to the test, which fails on it)
        line = f"error: {type(e).__name__}: {e}"
    print(line, flush=True)
    sys.exit(0 if line.startswith("ok") else 1)


if __name__ == "__main__":
    main()
