"""Runs a test's ranks as processes of their own (a module of its own, beside the tests).

    results, exit_codes = run_ranks(target, n, lambda r: (uid, r, n), method="spawn")

Each rank runs target(*args_of(rank), results) and puts what the test checks on `results` (a
multiprocessing queue), errors included, so that the parent reports them instead of a hang.
"""

import multiprocessing


def run_ranks(target, n, args_of, *, method="fork", timeout=60):
    """Starts n processes (multiprocessing start method `method`: "fork", or "spawn" where the
    parent has used CUDA or the child must not inherit its state) and returns (what the ranks put
    on the queue, in arrival order; their exit codes). A rank that puts nothing within `timeout`
    seconds raises queue.Empty here."""
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(rank), results)) for rank in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=timeout) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    return got, [p.exitcode for p in procs]
