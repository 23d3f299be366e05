"""Runs a test's ranks as processes of their own (a module of its own, beside the tests).

    results, exit_codes = run_ranks(target, n, lambda r: (uid, r, n), method="spawn")

Each rank runs target(*args_of(rank), results) and puts what the test checks on `results` (a
multiprocessing queue), errors included, so that the parent reports them instead of a hang. A rank
that reports nothing in time is killed, with every other rank still running: a hung rank must fail
the test, not keep pytest (which joins its children at exit) waiting forever.
"""

import multiprocessing
import queue


def run_ranks(target, n, args_of, *, method="fork", timeout=60):
    """Starts n processes (multiprocessing start method `method`: "fork", or "spawn" where the
    parent has used CUDA or the child must not inherit its state) and returns (what the ranks put
    on the queue, in arrival order; their exit codes). Raises TimeoutError naming the ranks that put
    nothing within `timeout` seconds (after killing every rank still running)."""
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(rank), results)) for rank in range(n)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in range(n):
            got.append(results.get(timeout=timeout))
    except queue.Empty:
        # Ranks that put (rank, ...) tuples can be named; other tests' items cannot.
        named = all(isinstance(item, tuple) and item and isinstance(item[0], int) for item in got)
        silent = [r for r in range(n) if r not in {item[0] for item in got}] if named else None
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        raise TimeoutError(
            f"{n - len(got)} of {n} ranks reported nothing within {timeout} s (silent: "
            f"{silent if silent is not None else 'unknown'}); every rank still running was killed") from None
    for p in procs:
        p.join(timeout=60)
    for p in procs:
        if p.is_alive():
            p.kill()
    return got, [p.exitcode for p in procs]


def report(results, item):
    """A rank's last word: puts item on the queue and waits until it has reached the pipe, so that
    the parent gets it even when the rank's process ends right after (a queue's feeder thread would
    otherwise be cut off)."""
    results.put(item)
    results.close()
    results.join_thread()
