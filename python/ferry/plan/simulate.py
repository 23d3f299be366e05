"""Symbolic execution of a plan on all ranks at once, with deadlock and data-race detection.

The scheduler runs any thread block whose next op can proceed until none can:
- ``wait`` proceeds when the paired channel end has sent more signals than this end consumed;
- ``unpack_packets``/``reduce_packets`` proceed when every scratch chunk they read has received its
  next ``put_packets`` (the n-th unpack of a chunk consumes the n-th packet write to it);
- ``barrier`` proceeds when every thread block of the rank stands at a barrier.
One schedule decides a plan in which each channel end has one signalling and one waiting thread block
and each scratch chunk one packet write per call (verify.py checks both): every wait then pairs with
a fixed signal and every unpack with a fixed write, so happens-before is the same in every schedule,
and a blocked wait stays blocked in all of them.

Happens-before is tracked with vector clocks, one component per (rank, thread block): program order,
signal -> the matching wait, the packet write -> the unpack that consumes it, and barriers (which
join every thread block of the rank). Each chunk remembers its last write and the reads since; an
access that is not ordered after a conflicting access of another thread block is a race.

A put on a port channel is performed later by a proxy: its source may be read at any time until the
thread block's next flush or signal on that channel. A write to the source before that (by the same
thread block too), or not ordered after it, is a race.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import ChunkRef, Op, Plan
from .semantics import Slot, Value, garbage, initial_memory, reduce_values, slot

Loc = tuple  # (rank, thread block, op index)


@dataclass
class Event:
    """A finding as the simulator reports it; verify.Finding is the public form."""

    kind: str
    loc: Loc | None
    rank: int
    message: str


@dataclass
class _Access:
    """Who last wrote a chunk and who read it since: (thread, its own clock component, location)."""

    write: tuple | None = None
    reads: dict = field(default_factory=dict)


@dataclass
class _Thread:
    gid: int
    rank: int
    tb: int
    ops: tuple[Op, ...]
    clock: list[int]
    pc: int = 0

    def done(self) -> bool:
        return self.pc >= len(self.ops)

    def next_op(self) -> Op | None:
        return None if self.done() else self.ops[self.pc]


class Simulator:
    """Runs ``plan`` once; afterwards ``memory``, ``writers`` and ``events`` hold the outcome."""

    def __init__(self, plan: Plan):
        self.plan = plan
        blocks = [(r.rank, tb) for r in plan.ranks for tb in r.thread_blocks]
        self.threads = [_Thread(gid, rank, tb.id, tb.ops, [0] * len(blocks))
                        for gid, (rank, tb) in enumerate(blocks)]
        self.memory: dict[Slot, Value] = initial_memory(plan)
        self.access: dict[Slot, _Access] = {}
        self.pairs = _pair_channels(plan)
        self.signals: dict[tuple, list] = {}      # (rank, channel) -> [(clock, loc)] sent
        self.waits: dict[tuple, int] = {}         # (rank, channel) -> signals consumed
        self.packets: dict[Slot, list] = {}       # scratch slot -> [(value, clock)] in write order
        self.unpacked: dict[Slot, int] = {}       # scratch slot -> packet writes consumed
        self.events: list[Event] = []
        self._reported: set = set()
        # Sources of port-channel puts: [slots, put location, (gid, epoch) once flushed or signalled].
        self.port_reads: list[list] = []
        self.open_port_reads: dict[tuple, list] = {}  # (rank, channel) -> entries not yet completed

    # -- scheduling -------------------------------------------------------------------------------

    def run(self) -> bool:
        """Runs to completion or deadlock; returns True when every thread block finished."""
        progress = True
        while progress:
            progress = False
            for t in self.threads:
                while not t.done() and self._step(t):
                    progress = True
        stuck = [t for t in self.threads if not t.done()]
        for t in stuck:
            self._event("deadlock", t, self._why_blocked(t))
        if not stuck:
            self._check_leftover_signals()
        return not stuck

    def _step(self, t: _Thread) -> bool:
        op = t.ops[t.pc]
        if op.kind == "barrier":
            return self._barrier(t.rank)
        if not self._ready(t, op):
            return False
        t.clock[t.gid] += 1
        getattr(self, "_op_" + op.kind)(t, op)
        t.pc += 1
        return True

    def _ready(self, t: _Thread, op: Op) -> bool:
        if op.kind == "wait":
            return len(self.signals.get(self.pairs[(t.rank, op.channel)], ())) > self.waits.get((t.rank, op.channel), 0)
        if op.kind in ("unpack_packets", "reduce_packets"):
            return all(len(self.packets.get(s, ())) > self.unpacked.get(s, 0) for s in self._slots(t.rank, op.src))
        return True

    def _barrier(self, rank: int) -> bool:
        members = [t for t in self.threads if t.rank == rank]
        if any(t.done() or t.ops[t.pc].kind != "barrier" for t in members):
            return False
        joined = [max(c) for c in zip(*(t.clock for t in members))]
        for t in members:
            t.clock = list(joined)
            t.clock[t.gid] += 1
            t.pc += 1
        return True

    # -- operations -------------------------------------------------------------------------------

    def _op_put(self, t, op):
        peer = self._peer(t, op.channel)
        sources = self._slots(t.rank, op.src)
        for s, d in zip(sources, self._slots(peer, op.dst)):
            self._write(t, d, self._read(t, s))
        if self._is_port(t, op.channel):
            entry = [set(sources), self._loc(t), None]
            self.port_reads.append(entry)
            self.open_port_reads.setdefault((t.rank, op.channel), []).append(entry)

    def _op_get(self, t, op):
        peer = self._peer(t, op.channel)
        for s, d in zip(self._slots(peer, op.src), self._slots(t.rank, op.dst)):
            self._write(t, d, self._read(t, s))

    def _op_copy(self, t, op):
        for s, d in zip(self._slots(t.rank, op.src), self._slots(t.rank, op.dst)):
            self._write(t, d, self._read(t, s))

    def _op_signal(self, t, op):
        self._complete_port_reads(t, op.channel)  # a signal follows the landing of earlier puts
        self.signals.setdefault((t.rank, op.channel), []).append((tuple(t.clock), self._loc(t)))

    def _op_wait(self, t, op):
        key = (t.rank, op.channel)
        n = self.waits.get(key, 0)
        self._join(t, self.signals[self.pairs[key]][n][0])
        self.waits[key] = n + 1

    def _op_flush(self, t, op):
        self._complete_port_reads(t, op.channel)

    def _complete_port_reads(self, t, channel: int) -> None:
        for entry in self.open_port_reads.pop((t.rank, channel), []):
            entry[2] = (t.gid, t.clock[t.gid])

    def _op_reduce(self, t, op):
        self._reduce_into(t, op)

    def _op_read_reduce_copy_send(self, t, op):
        values = self._reduce_into(t, op)
        for send in op.sends:
            for v, d in zip(values, self._slots(self._peer(t, send.channel), send.dst)):
                self._write(t, d, v)

    def _op_put_packets(self, t, op):
        peer = self._peer(t, op.channel)
        for s, d in zip(self._slots(t.rank, op.src), self._slots(peer, op.dst)):
            value = self._read(t, s)
            self._write(t, d, value)
            self.packets.setdefault(d, []).append((value, tuple(t.clock)))

    def _op_unpack_packets(self, t, op):
        for s, d in zip(self._slots(t.rank, op.src), self._slots(t.rank, op.dst)):
            self._write(t, d, self._consume_packet(t, s))

    def _op_reduce_packets(self, t, op):
        for s, d in zip(self._slots(t.rank, op.src), self._slots(t.rank, op.dst)):
            value = self._consume_packet(t, s)
            self._write(t, d, reduce_values([self._read(t, d), value]))

    def _reduce_into(self, t, op) -> list[Value]:
        per_src = [self._slots(self._peer(t, s.channel) if s.channel is not None else t.rank, s) for s in op.srcs]
        values = []
        for i, d in enumerate(self._slots(t.rank, op.dst)):
            values.append(reduce_values([self._read(t, src[i]) for src in per_src]))
            self._write(t, d, values[-1])
        return values

    def _consume_packet(self, t, s: Slot) -> Value:
        n = self.unpacked.get(s, 0)
        value, clock = self.packets[s][n]
        self.unpacked[s] = n + 1
        self._join(t, clock)  # LL: the flag arrives with the data, so the data is visible
        self._read(t, s)
        return value

    # -- memory and happens-before ----------------------------------------------------------------

    def _read(self, t: _Thread, s: Slot) -> Value:
        acc = self.access.setdefault(s, _Access())
        if acc.write and acc.write[0] != t.gid and t.clock[acc.write[0]] < acc.write[1]:
            self._race(t, s, "reads", "write", acc.write[2])
        acc.reads[t.gid] = (t.clock[t.gid], self._loc(t))
        return self.memory.get(s, garbage(s))

    def _write(self, t: _Thread, s: Slot, value: Value) -> None:
        for sources, put_loc, done in self.port_reads:
            if s in sources and (done is None or t.clock[done[0]] < done[1]):
                self._port_race(t, s, put_loc)
        acc = self.access.setdefault(s, _Access())
        if acc.write and acc.write[0] != t.gid and t.clock[acc.write[0]] < acc.write[1]:
            self._race(t, s, "writes", "write", acc.write[2])
        for gid, (epoch, loc) in acc.reads.items():
            if gid != t.gid and t.clock[gid] < epoch:
                self._race(t, s, "writes", "read", loc)
        self.access[s] = _Access(write=(t.gid, t.clock[t.gid], self._loc(t)))
        self.memory[s] = value

    def last_writer(self, s: Slot) -> Loc | None:
        acc = self.access.get(s)
        return acc.write[2] if acc and acc.write else None

    def _join(self, t: _Thread, clock: tuple) -> None:
        t.clock = [max(a, b) for a, b in zip(t.clock, clock)]

    # -- helpers ----------------------------------------------------------------------------------

    def _slots(self, rank: int, ref: ChunkRef) -> list[Slot]:
        return [slot(self.plan, rank, ref.buffer, i) for i in ref.indices()]

    def _peer(self, t: _Thread, channel: int) -> int:
        return self.plan.ranks[t.rank].channels[channel].peer

    def _is_port(self, t: _Thread, channel: int) -> bool:
        return self.plan.ranks[t.rank].channels[channel].type == "port"

    def _loc(self, t: _Thread) -> Loc:
        return (t.rank, t.tb, t.pc)

    def _event(self, kind: str, t: _Thread, message: str) -> None:
        self.events.append(Event(kind, self._loc(t), t.rank, message))

    def _race(self, t: _Thread, s: Slot, verb: str, other: str, other_loc: Loc) -> None:
        key = (self._loc(t), other_loc)
        if key in self._reported:
            return  # one finding per pair of ops, not per chunk of a multi-chunk reference
        self._reported.add(key)
        self._event("race", t, f"{verb} rank {s[0]} {s[1]}[{s[2]}] unordered with the {other} by "
                    f"{_where(other_loc)} (no program order, barrier, signal/wait or packet orders them)")

    def _port_race(self, t: _Thread, s: Slot, put_loc: Loc) -> None:
        key = (self._loc(t), put_loc)
        if key in self._reported:
            return
        self._reported.add(key)
        self._event("race", t, f"writes rank {s[0]} {s[1]}[{s[2]}], the source of the port-channel put by "
                    f"{_where(put_loc)}, which the proxy may still be reading (flush or signal that channel "
                    f"before the source is overwritten, and order this write after it)")

    def _why_blocked(self, t: _Thread) -> str:
        op = t.ops[t.pc]
        if op.kind == "wait":
            pair = self.pairs[(t.rank, op.channel)]
            n = self.waits.get((t.rank, op.channel), 0)
            total = _count_signals(self.plan, pair)
            sent = len(self.signals.get(pair, ()))
            peer = self._peer(t, op.channel)
            reason = (f"rank {peer} signals that channel end only {total} times in the whole plan" if total <= n
                      else f"rank {peer} sent {sent} of its {total} signals and is stuck itself")
            return f"wait on channel {op.channel} (to rank {peer}) for signal #{n + 1} never satisfied: {reason}"
        if op.kind == "barrier":
            others = [u for u in self.threads if u.rank == t.rank and (u.done() or u.ops[u.pc].kind != "barrier")]
            passed = sum(1 for o in t.ops[:t.pc] if o.kind == "barrier")
            parts = [f"tb {u.tb} " + ("finished without it" if u.done() else f"is blocked at op {u.pc} ({u.ops[u.pc].kind})")
                     for u in others]
            return f"barrier #{passed + 1} never completes: {', '.join(parts)}"
        missing = [s for s in self._slots(t.rank, op.src)
                   if len(self.packets.get(s, ())) <= self.unpacked.get(s, 0)]
        s = missing[0]
        return (f"{op.kind} waits for packet write #{self.unpacked.get(s, 0) + 1} to scratch[{s[2]}], "
                f"which received only {len(self.packets.get(s, ()))}")

    def _check_leftover_signals(self) -> None:
        """Signals nobody waits for would satisfy the next launch's waits early: report the first."""
        for (rank, ch), sent in sorted(self.signals.items()):
            consumed = self.waits.get(self.pairs[(rank, ch)], 0)
            if len(sent) > consumed:
                r, tb, k = sent[consumed][1]
                self.events.append(Event("unmatched_signal", (r, tb, k), r,
                                         f"signal on channel {ch} (to rank {self.plan.ranks[r].channels[ch].peer}) "
                                         f"is one of {len(sent) - consumed} that no wait consumes"))


def _where(loc: Loc) -> str:
    return f"rank {loc[0]} tb {loc[1]} op {loc[2]}"


def _pair_channels(plan: Plan) -> dict[tuple, tuple]:
    """(rank, channel) -> (peer, channel): the k-th (type, peer) channel of r pairs with the k-th back."""
    nth: dict[tuple, list[int]] = {}
    for r in plan.ranks:
        for i, c in enumerate(r.channels):
            nth.setdefault((r.rank, c.peer, c.type), []).append(i)
    pairs = {}
    for (r, p, ty), mine in nth.items():
        for k, i in enumerate(mine):
            pairs[(r, i)] = (p, nth[(p, r, ty)][k])
    return pairs


def _count_signals(plan: Plan, end: tuple) -> int:
    rank, ch = end
    return sum(1 for tb in plan.ranks[rank].thread_blocks for op in tb.ops
               if op.kind == "signal" and op.channel == ch)
