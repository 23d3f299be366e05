"""The Ethernet (TCP) transport's bandwidth between two processes, beside a plain socket that moves
the same bytes, to show what ferry's connection costs over the wire it uses:

    python -m ferry.net_bench                    # loopback, 4 KiB to 256 MiB
    python -m ferry.net_bench -b 64K -e 1G -n 20

Rank 0 writes `size` bytes of host memory into rank 1's registered buffer (Connection.write) and
flushes, `iters` times; the time is from the first write to the last flush's confirmation. The
socket column sends the same bytes with socket.sendall to a process that receives them into a
buffer (recv_into) and answers once per message, as ferry's flush is answered. GB/s = bytes /
time. Both run on FERRY_SOCKET_IFNAME's interface (default: loopback). No GPU is needed; the
device-memory path (staged through host buffers) is not timed here.
"""

import argparse
import multiprocessing
import os
import socket
import sys
import time

from ferry import _ferry
from ferry.bench import parse_size


def _ferry_rank(uid, rank, sizes, iters, results):
    try:
        boot = _ferry.TcpBootstrap.create(uid, rank, 2, timeout=60)
        comm = _ferry.Communicator(boot)
        peer = 1 - rank
        top = max(sizes)
        mine = _ferry.host_alloc(top)
        reg = comm.register_memory(mine.address, top, [_ferry.Transport.ethernet])
        comm.send_memory(reg, peer)
        pending_mem, pending_conn = comm.recv_memory(peer), comm.connect(peer, _ferry.Transport.ethernet)
        theirs, conn = pending_mem.get(), pending_conn.get()
        times = {}
        for size in sizes:
            boot.barrier()
            if rank == 0:
                conn.write(theirs, 0, reg, 0, size)  # warm-up
                conn.flush(timeout=120)
                start = time.perf_counter()
                for _ in range(iters):
                    conn.write(theirs, 0, reg, 0, size)
                    conn.flush(timeout=120)
                times[size] = (time.perf_counter() - start) / iters
            boot.barrier()
        results.put((rank, times))
    except BaseException as e:  # noqa: BLE001  (reported by the parent)
        results.put((rank, f"{type(e).__name__}: {e}"))


def _socket_receiver(port_queue, sizes, iters, host):
    listener = socket.create_server((host, 0))
    port_queue.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(max(sizes))
    view = memoryview(buf)
    for size in sizes:
        for _ in range(iters + 1):
            got = 0
            while got < size:
                n = conn.recv_into(view[got:size])
                if n == 0:
                    return
                got += n
            conn.sendall(b"k")  # the answer, as ferry's flush gets one


def _socket_times(sizes, iters, host):
    ctx = multiprocessing.get_context("spawn")
    port_queue = ctx.Queue()
    receiver = ctx.Process(target=_socket_receiver, args=(port_queue, sizes, iters, host))
    receiver.start()
    s = socket.create_connection((host, port_queue.get(timeout=60)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = bytes(max(sizes))
    view = memoryview(data)
    times = {}
    for size in sizes:
        s.sendall(view[:size])
        s.recv(1)
        start = time.perf_counter()
        for _ in range(iters):
            s.sendall(view[:size])
            s.recv(1)
        times[size] = (time.perf_counter() - start) / iters
    s.close()
    receiver.join(timeout=60)
    return times


def _interface_address():
    name = os.environ.get("FERRY_SOCKET_IFNAME", "lo")
    if name == "lo":
        return "127.0.0.1"
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.net_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", default="4K")
    p.add_argument("-e", "--maxbytes", default="256M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=10)
    a = p.parse_args(argv)
    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    sizes = []
    size = parse_size(a.minbytes)
    while size <= parse_size(a.maxbytes):
        sizes.append(size)
        size *= a.stepfactor
    uid = _ferry.UniqueId.create()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ferry_rank, args=(uid, r, sizes, a.iters, results)) for r in range(2)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    if not isinstance(got.get(0), dict) or not isinstance(got.get(1), dict):
        print(f"ferry.net_bench: the ferry ranks failed: {got}", file=sys.stderr)
        return 1
    sock = _socket_times(sizes, a.iters, _interface_address())
    print(f"# Ethernet connection vs a plain socket, {os.environ['FERRY_SOCKET_IFNAME']}, host memory, "
          f"{a.iters} writes + flushes per size; GB/s = bytes / time per message")
    print(f"{'bytes':>12} {'ferry us':>12} {'ferry GB/s':>11} {'socket us':>12} {'socket GB/s':>12} {'ferry/socket':>13}")
    for size in sizes:
        f, s = got[0][size], sock[size]
        print(f"{size:>12} {f * 1e6:>12.1f} {size / f / 1e9:>11.2f} {s * 1e6:>12.1f} {size / s / 1e9:>12.2f} "
              f"{s / f:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
