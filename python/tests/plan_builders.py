"""Small hand-written plans (JSON dicts) for the loader and verifier tests, plus helpers to plant bugs."""

from __future__ import annotations

import copy


def ref(buffer: str, index: int, count: int = 1, **extra) -> dict:
    return {"buffer": buffer, "index": index, "count": count, **extra}


def plan_doc(collective: str, n: int, chunks: tuple[int, int, int], ranks: list[dict], *,
             protocol: str = "Simple", inplace: bool = False, **extra) -> dict:
    cin, cout, scratch = chunks
    return {"format": "ferry-plan", "version": 1, "name": f"test_{collective}_{n}", "collective": collective,
            **extra, "protocol": protocol, "inplace": inplace, "world_size": n,
            "chunks": {"input": cin, "output": cout, "scratch": scratch},
            "min_bytes": 0, "max_bytes": 1 << 20, "ranks": ranks}


def peers(r: int, n: int) -> list[int]:
    return [p for p in range(n) if p != r]


def memory_channels(r: int, n: int) -> list[dict]:
    """One memory channel to every peer, in peer order: channel k goes to peers(r, n)[k]."""
    return [{"type": "memory", "peer": p} for p in peers(r, n)]


def allgather(n: int, *, two_blocks: bool = False) -> dict:
    """All-pairs allgather, one chunk per rank. With ``two_blocks``, tb 0 copies the own chunk into the
    output and tb 1, after a barrier, sends that output chunk to every peer."""
    ranks = []
    for r in range(n):
        local = [{"op": "copy", "src": ref("input", 0), "dst": ref("output", r)}]
        send_src = ref("output", r) if two_blocks else ref("input", 0)
        sends = []
        for c in range(n - 1):
            sends += [{"op": "put", "channel": c, "src": send_src, "dst": ref("output", r)},
                      {"op": "signal", "channel": c}]
        sends += [{"op": "wait", "channel": c} for c in range(n - 1)]
        if two_blocks:
            tbs = [{"id": 0, "ops": local + [{"op": "barrier"}]}, {"id": 1, "ops": [{"op": "barrier"}] + sends}]
        else:
            tbs = [{"id": 0, "ops": local + sends}]
        ranks.append({"rank": r, "channels": memory_channels(r, n), "thread_blocks": tbs})
    return plan_doc("allgather", n, (1, n, 0), ranks)


def allreduce_allpairs(n: int) -> dict:
    """Simple all-pairs allreduce of one chunk: put to every peer's scratch[own rank], signal, wait for
    all, then reduce own input with the peers' scratch chunks."""
    ranks = []
    for r in range(n):
        ops = []
        for c, p in enumerate(peers(r, n)):
            ops += [{"op": "put", "channel": c, "src": ref("input", 0), "dst": ref("scratch", r)},
                    {"op": "signal", "channel": c}]
        ops += [{"op": "wait", "channel": c} for c in range(n - 1)]
        ops.append({"op": "reduce", "srcs": [ref("input", 0)] + [ref("scratch", p) for p in peers(r, n)],
                    "dst": ref("output", 0)})
        ranks.append({"rank": r, "channels": memory_channels(r, n), "thread_blocks": [{"id": 0, "ops": ops}]})
    return plan_doc("allreduce", n, (1, 1, n), ranks)


def allreduce_packets(n: int) -> dict:
    """LL all-pairs allreduce: put_packets own input to every peer's scratch[own rank], copy own input to
    the output, then reduce every peer's packets into it. Needs no signal."""
    ranks = []
    for r in range(n):
        ops = [{"op": "put_packets", "channel": c, "src": ref("input", 0), "dst": ref("scratch", r)}
               for c in range(n - 1)]
        ops.append({"op": "copy", "src": ref("input", 0), "dst": ref("output", 0)})
        ops += [{"op": "reduce_packets", "src": ref("scratch", p), "dst": ref("output", 0)} for p in peers(r, n)]
        ranks.append({"rank": r, "channels": memory_channels(r, n), "thread_blocks": [{"id": 0, "ops": ops}]})
    return plan_doc("allreduce", n, (1, 1, n), ranks, protocol="LL")


def allreduce_two_shot(n: int) -> dict:
    """Two-shot allreduce of n chunks: reduce-scatter (rank r owns chunk r, reading peers' input chunk r
    directly through memory channels after a signal/wait handshake), then allgather of the owned chunk,
    with read_reduce_copy_send doing the reduction and the sends in one op; the input is read remotely,
    so each rank signals "my input is ready" first."""
    ranks = []
    for r in range(n):
        ops = [{"op": "signal", "channel": c} for c in range(n - 1)]
        ops += [{"op": "wait", "channel": c} for c in range(n - 1)]
        ops.append({"op": "read_reduce_copy_send",
                    "srcs": [ref("input", r)] + [ref("input", r, channel=c) for c in range(n - 1)],
                    "dst": ref("output", r),
                    "sends": [{"channel": c, "dst": ref("output", r)} for c in range(n - 1)]})
        # Second handshake: peers have finished reading my input and writing my output.
        ops += [{"op": "signal", "channel": c} for c in range(n - 1)]
        ops += [{"op": "wait", "channel": c} for c in range(n - 1)]
        ranks.append({"rank": r, "channels": memory_channels(r, n), "thread_blocks": [{"id": 0, "ops": ops}]})
    return plan_doc("allreduce", n, (n, n, 0), ranks)


def ops_of(doc: dict, rank: int, tb: int = 0) -> list:
    return doc["ranks"][rank]["thread_blocks"][tb]["ops"]


def mutated(doc: dict, edit) -> dict:
    """A deep copy of ``doc`` after ``edit(copy)``."""
    d = copy.deepcopy(doc)
    edit(d)
    return d
