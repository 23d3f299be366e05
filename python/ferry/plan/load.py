"""Loading and validating plans (docs/plan-format.md, version 1).

``load_plan`` accepts a path or an already parsed dict and either returns a ``Plan`` that satisfies
every rule of the format, or raises ``PlanError`` naming the JSON path and the rank, e.g.
``ranks[2].thread_blocks[0].ops[5].src.index: 6 is out of range for buffer "scratch" of 4 chunks
(rank 2)``. Malformed input never escapes as KeyError, TypeError or the like.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from typing import Any

from .model import (
    BUFFERS, CHANNEL_TYPES, COLLECTIVES, FORMAT, OP_KINDS, PROTOCOLS, VERSION,
    Channel, ChunkRef, Chunks, Op, Plan, Rank, Send, ThreadBlock,
)


class PlanError(ValueError):
    """A plan that breaks the format. ``kind`` is "out_of_range" for a chunk, channel or peer
    number past what exists, "malformed" otherwise; rank/thread_block/op_index locate it when known."""

    def __init__(self, path: str, message: str, *, rank: int | None = None,
                 thread_block: int | None = None, op_index: int | None = None,
                 kind: str = "malformed"):
        self.path, self.detail, self.kind = path, message, kind
        self.rank, self.thread_block, self.op_index = rank, thread_block, op_index
        where = f" (rank {rank})" if rank is not None else ""
        super().__init__(f"{path}: {message}{where}")


# Fields of each op besides "op"; every one is required, no other is allowed.
_OP_FIELDS = {
    "put": ("channel", "src", "dst"),
    "get": ("channel", "src", "dst"),
    "signal": ("channel",),
    "wait": ("channel",),
    "flush": ("channel",),
    "copy": ("src", "dst"),
    "reduce": ("srcs", "dst"),
    "put_packets": ("channel", "src", "dst"),
    "unpack_packets": ("src", "dst"),
    "reduce_packets": ("src", "dst"),
    "read_reduce_copy_send": ("srcs", "dst", "sends"),
    "barrier": (),
}
assert set(_OP_FIELDS) == set(OP_KINDS)

# Channel types an op may use where not every type can do it (flush completes proxy work; get and
# remote reduce sources are loads from peer memory, which only a memory channel maps).
_OP_CHANNEL_TYPES = {"get": ("memory",), "flush": ("port",)}
_REMOTE_READ_TYPES = ("memory",)


class _Loc:
    """Where in the document a value sits: a JSON path plus the rank/thread block/op it belongs to."""

    def __init__(self, path: str, rank=None, tb=None, op=None):
        self.path, self.rank, self.tb, self.op = path, rank, tb, op

    def at(self, key: str | int, **kw) -> "_Loc":
        sub = f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)
        return _Loc(sub, kw.get("rank", self.rank), kw.get("tb", self.tb), kw.get("op", self.op))

    def error(self, message: str, kind: str = "malformed") -> PlanError:
        return PlanError(self.path or "plan", message, rank=self.rank, thread_block=self.tb,
                         op_index=self.op, kind=kind)


def _obj(value: Any, loc: _Loc, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise loc.error(f"expected an object, found {_kind(value)}")
    for key in value:
        if key not in required and key not in optional:
            raise loc.at(str(key)).error("unknown field")
    for key in required:
        if key not in value:
            raise loc.at(key).error("missing field")
    return value


def _int(value: Any, loc: _Loc, lo: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise loc.error(f"expected an integer, found {_kind(value)}")
    if not -(1 << 63) <= value < (1 << 63):  # as the C++ loader, which reads 64-bit integers
        raise loc.error(f"{value} is too large (this loader reads 64-bit integers)")
    if lo is not None and value < lo:
        raise loc.error(f"{value} is below the minimum {lo}")
    return value


def _str(value: Any, loc: _Loc, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise loc.error(f"expected a string, found {_kind(value)}")
    if choices is not None and value not in choices:
        raise loc.error(f"unknown value {value!r} (expected one of {', '.join(choices)})")
    return value


def _list(value: Any, loc: _Loc, nonempty: bool = False) -> list:
    if not isinstance(value, list):
        raise loc.error(f"expected an array, found {_kind(value)}")
    if nonempty and not value:
        raise loc.error("must not be empty")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# The largest plan file either loader reads (src/executor/plan_loader.cpp has the same bound).
MAX_PLAN_BYTES = 64 << 20


def load_plan(source: str | os.PathLike | dict) -> Plan:
    """Parses and validates a plan from a file path or a dict; raises PlanError on any violation.
    A path must name a regular file of at most MAX_PLAN_BYTES (not a FIFO or a device)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            st = os.stat(source)  # before opening: opening a FIFO would wait for a writer
            if not stat.S_ISREG(st.st_mode):
                raise PlanError(str(source), "not a regular file")
            if st.st_size > MAX_PLAN_BYTES:
                raise PlanError(str(source), f"{st.st_size} bytes, more than a plan may have ({MAX_PLAN_BYTES})")
            with open(source, "rb") as f:
                text = f.read(MAX_PLAN_BYTES + 1)
            if len(text) > MAX_PLAN_BYTES:
                raise PlanError(str(source), f"more than {MAX_PLAN_BYTES} bytes, more than a plan may have")
            source = json.loads(text.decode("utf-8"))
        except PlanError:
            raise
        except OSError as e:
            raise PlanError(str(source), f"cannot read: {e.strerror or e}") from None
        except (ValueError, RecursionError) as e:
            raise PlanError(str(source), f"not valid JSON: {e}") from None
    return _plan(source, _Loc(""))


def _plan(doc: Any, loc: _Loc) -> Plan:
    fields = ("format", "version", "name", "collective", "protocol", "inplace", "world_size",
              "chunks", "min_bytes", "max_bytes", "ranks")
    _obj(doc, loc, fields, ("root",))
    if doc["format"] != FORMAT:
        raise loc.at("format").error(f"expected {FORMAT!r}, found {doc['format']!r}")
    version = _int(doc["version"], loc.at("version"))
    if version != VERSION:
        raise loc.at("version").error(f"version {version} is not supported (this loader reads {VERSION})")
    name = _str(doc["name"], loc.at("name"))
    collective = _str(doc["collective"], loc.at("collective"), COLLECTIVES)
    protocol = _str(doc["protocol"], loc.at("protocol"), PROTOCOLS)
    if not isinstance(doc["inplace"], bool):
        raise loc.at("inplace").error(f"expected a boolean, found {_kind(doc['inplace'])}")
    world = _int(doc["world_size"], loc.at("world_size"), 1)
    chunks = _chunks(doc["chunks"], loc.at("chunks"), collective, world)
    min_bytes = _int(doc["min_bytes"], loc.at("min_bytes"), 0)
    max_bytes = _int(doc["max_bytes"], loc.at("max_bytes"), 0)
    if max_bytes < min_bytes:
        raise loc.at("max_bytes").error(f"{max_bytes} is below min_bytes {min_bytes}")
    root = None
    if collective == "broadcast":
        if "root" not in doc:
            raise loc.at("root").error("missing field (required for broadcast)")
        root = _int(doc["root"], loc.at("root"), 0)
        if root >= world:
            raise loc.at("root").error(f"rank {root} does not exist (world_size {world})", "out_of_range")
    elif "root" in doc:
        raise loc.at("root").error(f"only broadcast has a root, not {collective}")
    rank_docs = _list(doc["ranks"], loc.at("ranks"))
    if len(rank_docs) != world:
        raise loc.at("ranks").error(f"has {len(rank_docs)} entries, world_size is {world}")
    ranks = tuple(_rank(rd, loc.at("ranks").at(r, rank=r), r, world, chunks)
                  for r, rd in enumerate(rank_docs))
    _check_pairs(ranks, loc.at("ranks"))
    return Plan(name=name, collective=collective, protocol=protocol, inplace=doc["inplace"],
                world_size=world, chunks=chunks, min_bytes=min_bytes, max_bytes=max_bytes,
                ranks=ranks, root=root)


def _chunks(value: Any, loc: _Loc, collective: str, world: int) -> Chunks:
    _obj(value, loc, BUFFERS)
    c = Chunks(input=_int(value["input"], loc.at("input"), 1),
               output=_int(value["output"], loc.at("output"), 1),
               scratch=_int(value["scratch"], loc.at("scratch"), 0))
    # The collective fixes how output relates to input; the verifier's expected result needs it.
    if collective == "allgather" and c.output != world * c.input:
        raise loc.at("output").error(f"allgather needs world_size * input = {world * c.input} chunks, found {c.output}")
    if collective == "reducescatter" and c.input != world * c.output:
        raise loc.at("input").error(f"reducescatter needs world_size * output = {world * c.output} chunks, found {c.input}")
    if collective in ("allreduce", "alltoall", "broadcast") and c.output != c.input:
        raise loc.at("output").error(f"{collective} needs as many output chunks as input ({c.input}), found {c.output}")
    if collective == "alltoall" and c.input % world:
        raise loc.at("input").error(f"alltoall needs a multiple of world_size {world}, found {c.input}")
    return c


def _rank(value: Any, loc: _Loc, r: int, world: int, chunks: Chunks) -> Rank:
    _obj(value, loc, ("rank", "channels", "thread_blocks"))
    if _int(value["rank"], loc.at("rank")) != r:
        raise loc.at("rank").error(f"is {value['rank']}, expected its position {r}")
    channels = []
    for i, cd in enumerate(_list(value["channels"], loc.at("channels"))):
        cl = loc.at("channels").at(i)
        _obj(cd, cl, ("type", "peer"))
        ctype = _str(cd["type"], cl.at("type"), CHANNEL_TYPES)
        peer = _int(cd["peer"], cl.at("peer"))
        if not 0 <= peer < world or peer == r:
            why = "is this rank itself" if peer == r else f"does not exist (world_size {world})"
            raise cl.at("peer").error(f"peer {peer} {why}", "out_of_range")
        channels.append(Channel(ctype, peer))
    tbs = []
    for t, td in enumerate(_list(value["thread_blocks"], loc.at("thread_blocks"), nonempty=True)):
        tl = loc.at("thread_blocks").at(t, tb=t)
        _obj(td, tl, ("id", "ops"))
        if _int(td["id"], tl.at("id")) != t:
            raise tl.at("id").error(f"is {td['id']}, expected its position {t}")
        ops = tuple(_op(od, tl.at("ops").at(k, op=k), channels, chunks)
                    for k, od in enumerate(_list(td["ops"], tl.at("ops"))))
        tbs.append(ThreadBlock(t, ops))
    return Rank(r, tuple(channels), tuple(tbs))


def _op(value: Any, loc: _Loc, channels: list[Channel], chunks: Chunks) -> Op:
    if not isinstance(value, dict):
        raise loc.error(f"expected an object, found {_kind(value)}")
    if "op" not in value:
        raise loc.at("op").error("missing field")
    kind = _str(value["op"], loc.at("op"), OP_KINDS)
    _obj(value, loc, ("op",) + _OP_FIELDS[kind])
    f: dict[str, Any] = {}
    if "channel" in value:
        f["channel"] = _channel(value["channel"], loc.at("channel"), channels, _OP_CHANNEL_TYPES.get(kind))
    if "src" in value:
        scratch_only = kind in ("unpack_packets", "reduce_packets")
        f["src"] = _ref(value["src"], loc.at("src"), chunks, scratch_only=scratch_only)
    if "dst" in value:
        f["dst"] = _ref(value["dst"], loc.at("dst"), chunks, scratch_only=kind == "put_packets")
    if "srcs" in value:
        sl = loc.at("srcs")
        f["srcs"] = tuple(_ref(sd, sl.at(i), chunks, channels=channels)
                          for i, sd in enumerate(_list(value["srcs"], sl, nonempty=True)))
    if "sends" in value:
        sl = loc.at("sends")
        sends = []
        for i, sd in enumerate(_list(value["sends"], sl)):
            el = sl.at(i)
            _obj(sd, el, ("channel", "dst"))
            sends.append(Send(_channel(sd["channel"], el.at("channel"), channels, None),
                              _ref(sd["dst"], el.at("dst"), chunks)))
        f["sends"] = tuple(sends)
    op = Op(kind, **f)
    counts = {r.count for r in _refs(op)}
    if len(counts) > 1:
        raise loc.error(f"references of one op must have the same count, found {sorted(counts)}")
    _check_overlap(op, loc)
    return op


_WRITES_LOCAL = ("copy", "reduce", "read_reduce_copy_send", "unpack_packets", "reduce_packets")


def _check_overlap(op: Op, loc: _Loc) -> None:
    """One op's threads work on all its chunks at once: a local source and the local destination are
    the same chunks (in place: copy, reduce) or have none in common; a partial overlap is a race on
    the GPU. An unpack's packets and its data must not meet at all (another layout). The C++ loader
    (src/executor/plan_loader.cpp) applies the same rule."""
    if op.kind not in _WRITES_LOCAL or op.dst is None:
        return
    packets = op.kind in ("unpack_packets", "reduce_packets")
    sources = ([op.src] if op.src is not None else []) + [r for r in op.srcs if r.channel is None]
    d = op.dst
    for s in sources:
        if s.buffer != d.buffer:
            continue
        same = s.index == d.index and not packets
        apart = s.index + s.count <= d.index or d.index + d.count <= s.index
        if same or apart:
            continue
        span = f"{d.buffer}[{s.index}, {s.index + s.count})", f"{d.buffer}[{d.index}, {d.index + d.count})"
        if packets:
            raise loc.error(f"a source {span[0]} and the destination {span[1]} meet; an unpack's packets and its "
                            f"data must not share chunks")
        raise loc.error(f"a source {span[0]} and the destination {span[1]} overlap without being the same chunks; "
                        f"the op's threads would read chunks others write (a race): use disjoint chunks, or the "
                        f"very same ones to work in place")


def _refs(op: Op) -> list[ChunkRef]:
    refs = [r for r in (op.src, op.dst) if r is not None]
    return refs + list(op.srcs) + [s.dst for s in op.sends]


def _channel(value: Any, loc: _Loc, channels: list[Channel], types: tuple[str, ...] | None) -> int:
    c = _int(value, loc)
    if not 0 <= c < len(channels):
        raise loc.error(f"channel {c} does not exist (this rank has {len(channels)})", "out_of_range")
    if types is not None and channels[c].type not in types:
        raise loc.error(f"channel {c} is a {channels[c].type} channel; this needs {' or '.join(types)}")
    return c


def _ref(value: Any, loc: _Loc, chunks: Chunks, *, scratch_only: bool = False,
         channels: list[Channel] | None = None) -> ChunkRef:
    """A chunk reference; ``channels`` is given where a ``channel`` field (peer memory) is allowed."""
    _obj(value, loc, ("buffer", "index", "count"), ("channel",) if channels is not None else ())
    buffer = _str(value["buffer"], loc.at("buffer"), ("scratch",) if scratch_only else BUFFERS)
    index = _int(value["index"], loc.at("index"), 0)
    count = _int(value["count"], loc.at("count"), 1)
    size = chunks.of(buffer)
    if index >= size:
        raise loc.at("index").error(f'{index} is out of range for buffer "{buffer}" of {size} chunks', "out_of_range")
    if index + count > size:
        raise loc.at("count").error(f'chunks [{index}, {index + count}) run past buffer "{buffer}" of {size} chunks',
                                    "out_of_range")
    channel = None
    if "channel" in value:
        channel = _channel(value["channel"], loc.at("channel"), channels, _REMOTE_READ_TYPES)
    return ChunkRef(buffer, index, count, channel)


def _check_pairs(ranks: tuple[Rank, ...], loc: _Loc) -> None:
    """Every channel needs its pair: as many (type) channels from r to p as from p to r."""
    counts = Counter((r.rank, c.peer, c.type) for r in ranks for c in r.channels)
    for r in ranks:
        for i, c in enumerate(r.channels):
            mine, theirs = counts[(r.rank, c.peer, c.type)], counts[(c.peer, r.rank, c.type)]
            if mine != theirs:
                raise loc.at(r.rank, rank=r.rank).at("channels").at(i).error(
                    f"{c.type} channel to rank {c.peer} has no pair: this rank has {mine} {c.type} channels "
                    f"to rank {c.peer}, rank {c.peer} has {theirs} back")
