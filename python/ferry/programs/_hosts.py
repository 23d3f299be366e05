"""The host layout of the hierarchical programs: the hosts hold consecutive ranks, ``sizes[g]`` of
them on host g, and rank r is local rank ``r - first(host(r))`` of its host.

Hosts of one size pair up by local index: rank (g, k) and rank (h, k) are each other's partner
across hosts. Hosts of different sizes (3 + 1, say) pair each rank with local rank ``k % size(h)``
of host h, so a rank of a small host is the partner of several ranks of a larger one: its
``receives_from`` lists them all, while its own ``sends_to`` names one rank per host. With equal
sizes both lists are the same ranks, the ones of its local index on the other hosts (``across``).
The programs' parts written for equal hosts (every local index on every host) use ``per_host`` and
``across``, which refuse uneven layouts; each program has a part of its own for those."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.dsl import MemoryChannel, PortChannel


@dataclass(frozen=True)
class Hosts:
    """The ranks on each host, in host order."""

    sizes: tuple[int, ...]

    @classmethod
    def even(cls, per_host: int, hosts: int) -> Hosts:
        return cls((per_host,) * hosts)

    @property
    def hosts(self) -> int:
        return len(self.sizes)

    @property
    def world_size(self) -> int:
        return sum(self.sizes)

    @property
    def is_even(self) -> bool:
        return len(set(self.sizes)) == 1

    @property
    def per_host(self) -> int:
        """The ranks of every host, for the programs that need hosts of one size."""
        if not self.is_even:
            raise ValueError(f"this program needs hosts of one size, not {'+'.join(map(str, self.sizes))}")
        return self.sizes[0]

    def first(self, g: int) -> int:
        return sum(self.sizes[:g])

    def host(self, r: int) -> int:
        g = 0
        while r >= self.first(g) + self.sizes[g]:
            g += 1
        return g

    def local(self, r: int) -> int:
        return r - self.first(self.host(r))

    def rank(self, host: int, local: int) -> int:
        return self.first(host) + local

    def on_host(self, r: int) -> list[int]:
        """The other ranks of r's host, in rank order."""
        g = self.host(r)
        return [self.rank(g, k) for k in range(self.sizes[g]) if self.rank(g, k) != r]

    def partner(self, r: int, g: int) -> int:
        """The rank of host g that r sends to: its local index, wrapped to host g's size."""
        return self.rank(g, self.local(r) % self.sizes[g])

    def sends_to(self, r: int) -> list[int]:
        """r's partner on every other host, in host order."""
        return [self.partner(r, g) for g in range(self.hosts) if g != self.host(r)]

    def receives_from(self, r: int) -> list[int]:
        """The ranks of the other hosts whose partner on r's host is r, in rank order."""
        g = self.host(r)
        return [q for q in range(self.world_size) if self.host(q) != g and self.partner(q, g) == r]

    def across(self, r: int) -> list[int]:
        """The ranks of r's local index on the other hosts, in host order (hosts of one size)."""
        self.per_host  # noqa: B018 -- refuses uneven layouts
        return self.sends_to(r)


def layout(world_size: int, ranks_per_host: int | None = None, *, host_sizes: list[int] | None = None,
           program: str = "hierarchical") -> Hosts:
    """The hosts of a program: ``host_sizes`` ranks on each host, or ``ranks_per_host`` each, by
    default the shape of two hosts (world_size / 2 ranks each, or one rank per host for an odd
    world size)."""
    if host_sizes is not None:
        if ranks_per_host is not None:
            raise ValueError(f"{program}: give ranks_per_host or host_sizes, not both")
        if any(s < 1 for s in host_sizes) or sum(host_sizes) != world_size:
            raise ValueError(f"{program}: hosts of {host_sizes} ranks do not make {world_size} ranks")
        return Hosts(tuple(host_sizes))
    per_host = ranks_per_host or (world_size // 2 if world_size % 2 == 0 else 1)
    if per_host < 1 or world_size % per_host:
        raise ValueError(f"{program}: {world_size} ranks do not split into hosts of {per_host}")
    return Hosts.even(per_host, world_size // per_host)


def memory_channels(hosts: Hosts) -> dict[tuple[int, int], MemoryChannel]:
    """(r, p) -> the memory channel from r to p, for every pair of ranks on one host (inside the
    program's ``with``)."""
    return {(r, p): MemoryChannel(r, p) for r in range(hosts.world_size) for p in hosts.on_host(r)}


def port_channels(hosts: Hosts) -> dict[tuple[int, int], PortChannel]:
    """(r, p) -> the port channel from r to p, for every pair of partners across hosts, both ways
    (inside the program's ``with``)."""
    linked = {r: sorted(set(hosts.sends_to(r)) | set(hosts.receives_from(r))) for r in range(hosts.world_size)}
    return {(r, p): PortChannel(r, p) for r in range(hosts.world_size) for p in linked[r]}
