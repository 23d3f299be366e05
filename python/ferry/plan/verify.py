"""The CPU plan verifier: ``verify(plan)`` lists everything wrong with a loaded plan.

Finding kinds:
- ``deadlock``: a thread block that can never finish (a wait whose signal never comes, a barrier
  that not every thread block reaches, an unpack whose packets are never written);
- ``race``: a chunk access not ordered after a conflicting access of another thread block or rank;
- ``wrong_result``: an output chunk that is not exactly the collective's answer, or an input chunk
  that a plan that is not in-place left changed (checked only when the plan runs to completion);
  located at the op that last wrote the chunk (rank, thread block, op; the rank may be another than
  the chunk's, which the message names), or at the chunk's rank alone when no op writes it;
- ``unmatched_signal``: signals that no wait consumes (they would satisfy the next launch's waits);
- ``unflushed_put``: a put on a port channel that no later flush or signal of that channel waits for
  (its copy may land after the call ends; see simulate.py for how port puts are modelled);
- ``nondeterministic``: a channel end signalled (or waited on) by two thread blocks, or a scratch
  chunk that receives packets twice in one call: what such a plan computes depends on timing (which
  signal a wait pairs with; which packet an unpack sees, since LL flags tell calls apart, not writes),
  and the executor refuses it. Ruling these out is what lets one schedule decide the rest: every
  wait then pairs with a fixed signal and every unpack with a fixed packet write, so happens-before,
  and with it every race, deadlock and result, is the same in every schedule;
- ``too_large``: a plan with more than MAX_CHUNKS chunks in a buffer, which the verifier does not
  expand (its model holds one symbolic value per chunk and rank);
- ``out_of_range`` / ``malformed``: from ``main`` only, for a file that ``load_plan`` rejects.

Command line (also behind ``python -m ferry.dsl verify``): ``python -m ferry.plan.verify plan.json``
prints one finding per line, then a summary; exit status 0 only when nothing was found.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .load import PlanError, load_plan
from .model import Plan
from .semantics import describe_mismatch, expected_output, garbage, input_atom, slot
from .simulate import Simulator


@dataclass(frozen=True)
class Finding:
    """One problem; ``thread_block`` and ``op_index`` are None where it belongs to no single op."""

    kind: str
    rank: int | None
    thread_block: int | None
    op_index: int | None
    message: str

    def __str__(self) -> str:
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.thread_block is not None:
            where.append(f"tb {self.thread_block}")
        if self.op_index is not None:
            where.append(f"op {self.op_index}")
        return f"{' '.join(where) or 'plan'}: {self.kind}: {self.message}"


# The most chunks per buffer the verifier expands: far above what a plan needs (a chunk per rank or
# per pipeline step), far below what would exhaust memory (a 2 KB plan may declare 10^8).
MAX_CHUNKS = 1 << 16


def verify(plan: Plan) -> list[Finding]:
    """Runs ``plan`` (as returned by load_plan) symbolically on all ranks; [] means it is proven."""
    sizes = {"input": plan.chunks.input, "output": plan.chunks.output, "scratch": plan.chunks.scratch}
    big = [f"{b} {n}" for b, n in sizes.items() if n > MAX_CHUNKS]
    if big:
        return [Finding("too_large", None, None, None,
                        f"chunks {', '.join(big)}: more than the {MAX_CHUNKS} per buffer this verifier expands; "
                        f"such a plan is not verified")]
    findings = _check_single_owners(plan)
    sim = Simulator(plan)
    completed = sim.run()
    findings += [Finding(e.kind, e.rank, e.loc[1] if e.loc else None, e.loc[2] if e.loc else None, e.message)
                 for e in sim.events]
    if completed:
        findings += _check_result(plan, sim)
    return findings


def _check_single_owners(plan: Plan) -> list[Finding]:
    """One thread block signals each channel end and one waits on it; one packet write per scratch chunk."""
    findings = []
    owners: dict[tuple, tuple] = {}    # (rank, channel, "signals" | "waits on") -> (tb, op)
    packets: dict[tuple, tuple] = {}   # (receiving rank, scratch chunk) -> (rank, tb, op) of the put_packets
    for r in plan.ranks:
        for tb in r.thread_blocks:
            for k, op in enumerate(tb.ops):
                if op.kind in ("signal", "wait"):
                    verb = "signals" if op.kind == "signal" else "waits on"
                    first = owners.setdefault((r.rank, op.channel, verb), (tb.id, k))
                    if first[0] != tb.id:
                        findings.append(Finding(
                            "nondeterministic", r.rank, tb.id, k,
                            f"{verb} channel {op.channel}, which tb {first[0]} (op {first[1]}) also {verb}: which "
                            f"signal a wait pairs with then depends on timing; give each thread block its own "
                            f"channels"))
                elif op.kind == "put_packets":
                    to = r.channels[op.channel].peer
                    for i in op.dst.indices():
                        first = packets.setdefault((to, i), (r.rank, tb.id, k))
                        if first != (r.rank, tb.id, k):
                            findings.append(Finding(
                                "nondeterministic", r.rank, tb.id, k,
                                f"puts packets into scratch[{i}] of rank {to}, which rank {first[0]} tb {first[1]} "
                                f"op {first[2]} also fills in this call: an unpack cannot tell the two writes "
                                f"apart (LL flags mark the call, not the write)"))
                            break
    return findings


def _check_result(plan: Plan, sim: Simulator) -> list[Finding]:
    findings = []
    for r in range(plan.world_size):
        for i in range(plan.chunks.output):
            s = slot(plan, r, "output", i)
            found, want = sim.memory.get(s, garbage(s)), expected_output(plan, r, i)
            if found != want:
                findings.append(_wrong(r, f"rank {r} output[{i}]", want, found, sim.last_writer(s)))
        if plan.inplace:
            continue
        for i in range(plan.chunks.input):
            s = slot(plan, r, "input", i)
            if sim.memory[s] != input_atom(r, i):
                what = f"rank {r} input[{i}] (the plan is not in-place, so it must stay unchanged)"
                findings.append(_wrong(r, what, input_atom(r, i), sim.memory[s], sim.last_writer(s)))
    return findings


def _wrong(rank: int, what: str, want, found, writer) -> Finding:
    """Located at the op that last wrote the chunk (where a fix usually starts), which may be another
    rank's; a chunk the plan never wrote has only its own rank."""
    if writer is None:
        return Finding("wrong_result", rank, None, None,
                       f"{what}: {describe_mismatch(want, found)} (no op writes it)")
    return Finding("wrong_result", writer[0], writer[1], writer[2],
                   f"{what}: {describe_mismatch(want, found)} (this op wrote it last)")


def main(argv: list[str] | None = None) -> int:
    """``verify PLAN.json [PLAN.json ...]``: prints findings and a summary; 0 only if none found."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or any(a in ("-h", "--help") for a in args):
        print("usage: verify PLAN.json [PLAN.json ...]", file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    total = 0
    for path in args:
        try:
            findings = verify(load_plan(path))
        except PlanError as e:
            findings = [Finding(e.kind, e.rank, e.thread_block, e.op_index, str(e))]
        prefix = f"{path}: " if len(args) > 1 else ""
        for f in findings:
            print(prefix + str(f))
        total += len(findings)
    noun = "plan" if len(args) == 1 else "plans"
    print(f"verify: {total} finding{'s' if total != 1 else ''} in {len(args)} {noun}"
          + ("" if total else " (all proven)"))
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
