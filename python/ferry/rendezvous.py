"""How ranks launched by torchrun (or any job with a torch.distributed store) find each other.

A ferry bootstrap from a UniqueId carries a random secret: only processes that were handed the id
can join. Under torchrun the natural way to hand it over is the key-value store every rank can
already reach: rank 0 makes the id and sets it there, the other ranks read it. Which store:

- torch.distributed's default process group's store, when init_process_group has run;
- else torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts a TCPStore at
  MASTER_ADDR:MASTER_PORT that its workers join as clients);
- else none: TcpBootstrap.from_environment() joins through MASTER_ADDR and MASTER_PORT + 1, its
  secret derived from FERRY_BOOTSTRAP_SECRET or from the address (and says so in a warning).
"""

import os

from ferry import _ferry

# Each bootstrap made through a store takes the next key of its prefix; the ranks that make them
# make them in the same order (they are collective), so the n-th of rank 0 meets the n-th of the
# others. One count per prefix and process, not per store object (torch may hand out a new wrapper
# object for the same store), and not one for all prefixes: a bootstrap of a subgroup is made only
# by its members, and must not shift the keys of the others.
_made = {}


def bootstrap_from_store(store, rank, world_size, *, timeout=None, prefix="ferry/bootstrap"):
    """Collective: a TcpBootstrap of `world_size` ranks whose UniqueId (made by rank 0) travels
    through `store` (a torch.distributed Store: set/get). Waits at most `timeout` seconds for the
    other ranks (default: FERRY_BOOTSTRAP_TIMEOUT)."""
    n = _made.get(prefix, 0)
    key = f"{prefix}/{n}"
    _made[prefix] = n + 1
    if rank == 0:
        uid = _ferry.UniqueId.create()
        store.set(key, uid.hex())
    else:
        # Store.get waits for the key, up to the store's own timeout.
        uid = _ferry.UniqueId.from_hex(store.get(key).decode())
    return _ferry.TcpBootstrap.create(uid, rank, world_size, timeout=timeout)


def torch_store():
    """(store, rank, world_size) of torch.distributed's default group, else of torchrun's agent
    store, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size()
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "MASTER_ADDR" in env:
        return _agent_store(dist), int(env["RANK"]), int(env["WORLD_SIZE"])
    return None


_agent = None


def _agent_store(dist):
    # One client connection per process, however many Comms it makes.
    global _agent
    if _agent is None:
        import datetime

        env = os.environ
        seconds = min(float(env.get("FERRY_BOOTSTRAP_TIMEOUT", "120")), 86400.0 * 365)
        _agent = dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            int(env["WORLD_SIZE"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=seconds),
        )
    return _agent


def bootstrap_from_environment(timeout=None):
    """The bootstrap ferry.Comm() makes without one: through torch's store when there is one
    (torch_store), else from torchrun's variables alone (TcpBootstrap.from_environment)."""
    found = torch_store()
    if found is None:
        return _ferry.TcpBootstrap.from_environment(timeout=timeout)
    store, rank, world_size = found
    return bootstrap_from_store(store, rank, world_size, timeout=timeout)
