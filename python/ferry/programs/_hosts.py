"""The host layout of the hierarchical programs (allreduce_hierarchical, allgather_hierarchical,
reducescatter_hierarchical): rank r is local rank ``r % L`` of host ``r // L``."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.dsl import MemoryChannel, PortChannel


@dataclass(frozen=True)
class Hosts:
    """``world_size`` ranks on ``hosts`` hosts of ``per_host`` ranks each."""

    per_host: int
    hosts: int

    @property
    def world_size(self) -> int:
        return self.per_host * self.hosts

    def host(self, r: int) -> int:
        return r // self.per_host

    def local(self, r: int) -> int:
        return r % self.per_host

    def rank(self, host: int, local: int) -> int:
        return host * self.per_host + local

    def on_host(self, r: int) -> list[int]:
        """The other ranks of r's host, in rank order."""
        return [self.rank(self.host(r), k) for k in range(self.per_host) if k != self.local(r)]

    def across(self, r: int) -> list[int]:
        """The ranks of r's local index on the other hosts, in host order."""
        return [self.rank(g, self.local(r)) for g in range(self.hosts) if g != self.host(r)]


def layout(world_size: int, ranks_per_host: int | None = None, *, program: str = "hierarchical") -> Hosts:
    """The hosts of a program: ``ranks_per_host`` each, by default the shape of two hosts
    (world_size / 2 ranks each, or one rank per host for an odd world size)."""
    per_host = ranks_per_host or (world_size // 2 if world_size % 2 == 0 else 1)
    if per_host < 1 or world_size % per_host:
        raise ValueError(f"{program}: {world_size} ranks do not split into hosts of {per_host}")
    return Hosts(per_host, world_size // per_host)


def memory_channels(hosts: Hosts) -> dict[tuple[int, int], MemoryChannel]:
    """(r, p) -> the memory channel from r to p, for every pair of ranks on one host (inside the
    program's ``with``)."""
    return {(r, p): MemoryChannel(r, p) for r in range(hosts.world_size) for p in hosts.on_host(r)}


def port_channels(hosts: Hosts) -> dict[tuple[int, int], PortChannel]:
    """(r, p) -> the port channel from r to p, for every pair of ranks of one local index on two
    hosts (inside the program's ``with``)."""
    return {(r, p): PortChannel(r, p) for r in range(hosts.world_size) for p in hosts.across(r)}
