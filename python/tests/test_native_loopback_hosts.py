"""Two "hosts" on one machine (network namespaces joined by a veth pair): a rank that advertises a
loopback address to ranks on the other host is named as misconfigured (its address, and
FERRY_SOCKET_IFNAME), not as gone. Needs root and `ip` (iproute2); skips where namespaces cannot be
made (an unprivileged container)."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

import ferry

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

# What each rank runs: join; then rank 2 sends to rank 1, which only listens (so that no connection
# rank 1 opened could carry rank 2's message: rank 2 must connect to rank 1's advertised address).
RANK = r"""
import os, sys, ferry
uid = ferry.UniqueId.from_hex(sys.argv[1])
rank = int(sys.argv[2])
boot = ferry.TcpBootstrap.create(uid, rank, 3, timeout=8)
try:
    if rank == 2:
        boot.send(b"hello", 1, 7)
        boot.barrier()
    elif rank == 1:
        boot.recv(2, 7)
    print("ok")
except ferry.Error as e:
    print(type(e).__name__ + ": " + str(e))
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    tag = uuid.uuid4().hex[:6]
    a, b = f"ferry-a-{tag}", f"ferry-b-{tag}"
    try:
        _ip("netns", "add", a)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot make network namespaces here: {e}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        _ip("link", "set", f"va{tag}", "netns", a)
        _ip("link", "set", f"vb{tag}", "netns", b)
        for ns, dev, addr in ((a, f"va{tag}", "10.77.0.1/24"), (b, f"vb{tag}", "10.77.0.2/24")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield (a, f"va{tag}"), (b, f"vb{tag}")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def test_a_rank_advertising_loopback_to_another_host_is_named_as_such(two_hosts):
    (ns_a, dev_a), (ns_b, _) = two_hosts
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # Rank 0 (the root) and rank 2 on host a, on its veth address; rank 1 on host b, advertising
    # its loopback address (FERRY_SOCKET_IFNAME=lo): reachable from nowhere but host b.
    root_id = subprocess.run(
        ["ip", "netns", "exec", ns_a, sys.executable, "-c",
         "import ferry; print(ferry.UniqueId.create().hex())"],
        capture_output=True, text=True, timeout=60, env=dict(env, FERRY_SOCKET_IFNAME=dev_a),
    )
    assert root_id.returncode == 0, root_id.stderr
    # The id's port was reserved by that process, which has exited: rank 0 binds it again.
    uid = root_id.stdout.strip()
    places = {0: (ns_a, dev_a), 1: (ns_b, "lo"), 2: (ns_a, dev_a)}
    procs = {
        r: subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", RANK, uid, str(r)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(env, FERRY_SOCKET_IFNAME=ifname, FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT="3"),
        )
        for r, (ns, ifname) in places.items()
    }
    out = {r: p.communicate(timeout=90)[0] for r, p in procs.items()}
    # Rank 2 reaches rank 1's advertised address 127.0.0.1 on its own host, where nothing listens.
    assert "advertises a loopback address" in out[2], out
    assert "FERRY_SOCKET_IFNAME" in out[2], out
    assert "rank 1" in out[2], out
