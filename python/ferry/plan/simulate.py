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

A put on a port channel only queues a copy for the host proxy (the copy engine, one stream per peer),
which reads the source and writes the destination some time later. The executor waits for the
copies queued so far in a port channel's ``flush`` and, before its flag store, in a port channel's
``signal``; a memory channel's signal waits for nothing. So a port put is modelled as completing at
the first flush or signal of its channel that it happens before (one later in its thread block, or
in another thread block of the rank that a barrier or signal/wait orders after the put; one that
is not may have asked the copy engine before the put was queued); until then
- its destination chunks are in flight: any access to them (by any rank or thread block, the
  putting one too) races with the landing copy, except a port put on the same channel ordered after
  it, which the copy engine performs after it; at completion the write counts as done by the completing thread
  block at that op, so a wait for that signal, or for any later signal of that block, orders it;
- its source may still be read: a write to it (by the putting thread block too), or one not
  ordered after the completion, is a race.
A port put still not completed when every thread block has finished is reported: nothing waits for
its copy, which may land after the call ends. (The executor's flush covers every copy to the peer,
whatever the port channel; going by the channel, as docs/plan-format.md promises, is stricter.)
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
    """Who last wrote a chunk and who read it since: (thread, its own clock component, location).

    ``landing`` is the port put whose copy into this chunk may still be in flight (see _PortPut)."""

    write: tuple | None = None
    reads: dict = field(default_factory=dict)
    landing: _PortPut | None = None


@dataclass
class _PortPut:
    """A put on a port channel, from when it is queued until a flush or signal of its channel completes it."""

    rank: int
    channel: int
    gid: int                  # the putting thread and its clock component at the put
    epoch: int
    loc: Loc
    sources: frozenset        # slots the copy engine may still read
    dests: tuple              # slots it may still write
    done: tuple | None = None  # (gid, epoch) of the completing flush or signal


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
        self.port_puts: list[_PortPut] = []
        self.open_port_puts: dict[tuple, list] = {}  # (rank, channel) -> its puts not yet completed

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
            self._check_unfinished_port_puts()
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
        sources, dests = self._slots(t.rank, op.src), self._slots(self._peer(t, op.channel), op.dst)
        if not self._is_port(t, op.channel):
            for s, d in zip(sources, dests):
                self._write(t, d, self._read(t, s))
            return
        put = _PortPut(t.rank, op.channel, t.gid, t.clock[t.gid], self._loc(t), frozenset(sources), tuple(dests))
        for s, d in zip(sources, dests):
            # Checked as a write at the put: whatever is not ordered before the put may meet the copy.
            self._write(t, d, self._read(t, s), port_put=put)
            self.access[d].landing = put
        self.port_puts.append(put)
        self.open_port_puts.setdefault((t.rank, op.channel), []).append(put)

    def _op_get(self, t, op):
        peer = self._peer(t, op.channel)
        for s, d in zip(self._slots(peer, op.src), self._slots(t.rank, op.dst)):
            self._write(t, d, self._read(t, s))

    def _op_copy(self, t, op):
        for s, d in zip(self._slots(t.rank, op.src), self._slots(t.rank, op.dst)):
            self._write(t, d, self._read(t, s))

    def _op_signal(self, t, op):
        self._complete_port_puts(t, op.channel)  # on a port channel, the flag follows the landing
        self.signals.setdefault((t.rank, op.channel), []).append((tuple(t.clock), self._loc(t)))

    def _op_wait(self, t, op):
        key = (t.rank, op.channel)
        n = self.waits.get(key, 0)
        self._join(t, self.signals[self.pairs[key]][n][0])
        self.waits[key] = n + 1

    def _op_flush(self, t, op):
        self._complete_port_puts(t, op.channel)

    def _complete_port_puts(self, t, channel: int) -> None:
        """A flush or signal of a port channel waits for the copies queued before it; a put of another
        thread block that does not happen before it may be queued after it, so it stays open."""
        key = (t.rank, channel)
        still_open = []
        for put in self.open_port_puts.get(key, []):
            if t.clock[put.gid] < put.epoch:
                still_open.append(put)
                continue
            put.done = (t.gid, t.clock[t.gid])
            for d in put.dests:
                acc = self.access[d]
                if acc.landing is put:  # the copy's write happens here, as far as ordering goes
                    acc.write, acc.landing = (t.gid, t.clock[t.gid], put.loc), None
        self.open_port_puts[key] = still_open

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
        if acc.landing:
            self._landing_race(t, s, "reads", acc.landing)
        elif acc.write and acc.write[0] != t.gid and t.clock[acc.write[0]] < acc.write[1]:
            self._race(t, s, "reads", "write", acc.write[2])
        acc.reads[t.gid] = (t.clock[t.gid], self._loc(t))
        return self.memory.get(s, garbage(s))

    def _write(self, t: _Thread, s: Slot, value: Value, port_put: _PortPut | None = None) -> None:
        """``port_put``: the write is that port put's copy (queued now, landing later)."""
        for put in self.port_puts:
            if s in put.sources and (put.done is None or t.clock[put.done[0]] < put.done[1]):
                self._port_race(t, s, put.loc)
        acc = self.access.setdefault(s, _Access())
        if acc.landing and not _lands_before(acc.landing, port_put, t):
            self._landing_race(t, s, "writes", acc.landing)
        elif acc.write and acc.write[0] != t.gid and t.clock[acc.write[0]] < acc.write[1]:
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

    def _race_once(self, t: _Thread, put_loc: Loc, message: str) -> None:
        """A race of this op with that port put, reported once however many chunks show it."""
        key = (self._loc(t), put_loc)
        if key not in self._reported:
            self._reported.add(key)
            self._event("race", t, message)

    def _port_race(self, t: _Thread, s: Slot, put_loc: Loc) -> None:
        self._race_once(t, put_loc, f"writes rank {s[0]} {s[1]}[{s[2]}], the source of the port-channel put by "
                    f"{_where(put_loc)}, which the proxy may still be reading (flush or signal that channel "
                    f"before the source is overwritten, and order this write after it)")

    def _landing_race(self, t: _Thread, s: Slot, verb: str, put: _PortPut) -> None:
        self._race_once(t, put.loc, f"{verb} rank {s[0]} {s[1]}[{s[2]}] while the copy of the port-channel put by "
                    f"{_where(put.loc)} may still be landing (only a flush or signal of that port channel "
                    f"waits for it; order this access after it, e.g. by waiting for that signal)")

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

    def _check_unfinished_port_puts(self) -> None:
        """A port put no flush or signal of its channel waits for may land after the call ends."""
        for put in self.port_puts:
            if put.done is None:
                peer = self.plan.ranks[put.rank].channels[put.channel].peer
                self.events.append(Event("unflushed_put", put.loc, put.rank,
                                         f"put on port channel {put.channel} (to rank {peer}) that no later flush "
                                         f"or signal of that channel waits for (none follows it in this thread "
                                         f"block or is ordered after it): its copy may land, and read its source, "
                                         f"after the call ends"))


def _lands_before(earlier: _PortPut, later: _PortPut | None, t: _Thread) -> bool:
    """Whether port put ``later``, made by ``t``, is queued behind ``earlier`` on one copy-engine stream
    (same channel, ordered after it), which runs copies in order: its copy then lands after."""
    return (later is not None and (earlier.rank, earlier.channel) == (later.rank, later.channel)
            and t.clock[earlier.gid] >= earlier.epoch)


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
