"""Runs a test's ranks as processes of their own (a module of its own, beside the tests).

    results, exit_codes = run_ranks(target, n, lambda r: (uid, r, n), method="spawn")

Each rank runs target(*args_of(rank), results) and puts what the test checks on `results` (a
multiprocessing queue), errors included, so that the parent reports them instead of a hang. A rank
that reports nothing in time is killed, with every other rank still running: a hung rank must fail
the test, not keep pytest (which joins its children at exit) waiting forever; the error says where
each silent rank was waiting (its Python stacks), or how it ended and where it was if it crashed.
"""

import faulthandler
import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import time


class RanksDied(RuntimeError):
    """Every rank that had not reported has exited: nothing more can come (a crash, say)."""


def _rank_main(target, args, stack_path):
    """A rank's process: target(*args), with its Python stacks written to stack_path on SIGUSR1 and
    on a fatal signal (SIGSEGV, SIGABRT, ...), so that the parent can say where a rank that reports
    nothing in time is waiting, or where one that crashed was."""
    with open(stack_path, "w") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        faulthandler.enable(file=stacks, all_threads=True)
        target(*args)


def _exit_reason(code):
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


def _stacks_of(procs, paths, lines=120):
    """The stacks of every thread of each silent rank (the first `lines` lines of a faulthandler
    dump, the innermost frame of each thread first): those still running are asked for theirs
    (SIGUSR1); those that crashed wrote theirs as they died. rank -> text, indented."""
    asked = {}
    for r, p in procs.items():
        if not p.is_alive():
            asked[r] = None  # a fatal signal's dump, if it died of one
            continue
        try:
            os.kill(p.pid, signal.SIGUSR1)
            asked[r] = None
        except OSError as e:
            asked[r] = f"    (no stack: {e})"
    if any(p.is_alive() for p in procs.values()):
        time.sleep(1.0)  # the dump is written from the rank's signal handler
    for r, note in asked.items():
        if note is None:
            try:
                with open(paths[r]) as f:
                    asked[r] = "\n".join("    " + line for line in f.read().splitlines()[:lines]) or "    (no stack)"
            except OSError as e:
                asked[r] = f"    (no stack: {e})"
    return asked


def _named(got):
    """Whether the items name their rank: (rank, ...) tuples (other tests' items do not)."""
    return all(isinstance(item, tuple) and item and isinstance(item[0], int) for item in got)


def _silent(got, n):
    """The ranks that have not reported: by name where the items name them, else every rank."""
    if not _named(got):
        return list(range(n))
    reported = {item[0] for item in got}
    return [r for r in range(n) if r not in reported]


def run_ranks(target, n, args_of, *, method="fork", timeout=60):
    """Starts n processes (multiprocessing start method `method`: "fork", or "spawn" where the
    parent has used CUDA or the child must not inherit its state) and returns (what the ranks put
    on the queue, in arrival order; their exit codes). Raises TimeoutError naming the ranks that put
    nothing within `timeout` seconds of the start (one deadline for all of them), with where each was
    waiting (its Python stacks), after killing every rank still running; raises RanksDied, with their
    exit codes, as soon as every rank that has not reported has exited (every rank, where the items
    do not name their rank)."""
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    stacks = tempfile.mkdtemp(prefix="ranks-")
    paths = [os.path.join(stacks, f"rank{rank}.stack") for rank in range(n)]
    procs = [ctx.Process(target=_rank_main, args=(target, (*args_of(rank), results), paths[rank])) for rank in range(n)]
    try:
        for p in procs:
            p.start()
        got = []
        deadline = time.monotonic() + timeout
        failure = None
        while len(got) < n and failure is None:
            # Whether every rank still silent had exited before this wait: a rank's report reaches the
            # pipe before its process ends (report()), so an empty wait after it means that nothing
            # more is coming. (A rank that reported may linger in its teardown.)
            silent_exited = all(not procs[r].is_alive() for r in _silent(got, n))
            try:
                got.append(results.get(timeout=min(0.5, max(0.0, deadline - time.monotonic()))))
                continue
            except queue.Empty:
                pass
            if silent_exited:
                failure = RanksDied
            elif time.monotonic() >= deadline:
                failure = TimeoutError
        if failure is not None:
            silent = _silent(got, n)
            named = _named(got)
            # How each ended, before the signal that asks the living for their stacks.
            ended = {r: _exit_reason(procs[r].exitcode) for r in silent}
            stacks_of = _stacks_of({r: procs[r] for r in silent}, paths)
            lines = [f"  rank {r}: {ended[r]}" + (f":\n{stacks_of[r]}" if r in stacks_of else "") for r in silent]
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(timeout=10)
            what = (f"within {timeout} s; every rank still running was killed" if failure is TimeoutError
                    else "and every such rank has exited")
            raise failure(f"{n - len(got)} of {n} ranks reported nothing {what} (silent: "
                          f"{silent if named else 'unknown'}):\n" + "\n".join(lines)) from None
        for p in procs:
            p.join(timeout=60)
        for p in procs:
            if p.is_alive():
                p.kill()
        return got, [p.exitcode for p in procs]
    finally:
        shutil.rmtree(stacks, ignore_errors=True)


def report(results, item):
    """A rank's last word: puts item on the queue and waits until it has reached the pipe, so that
    the parent gets it even when the rank's process ends right after (a queue's feeder thread would
    otherwise be cut off)."""
    results.put(item)
    results.close()
    results.join_thread()
