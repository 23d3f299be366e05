"""What the ranks of test_torch_bench_ranks.py run (a module of its own, so that spawned ranks import
it): rank 1 fails at once, rank 0 stays in a function named stuck_in_a_collective, as a rank
would that waits for a failed peer."""

import time

from rank_processes import report


def stuck_in_a_collective():
    time.sleep(60)


def one_fails_one_hangs(init_file, rank, n, results):
    if rank == 1:
        report(results, (rank, None, "Traceback: rank 1 broke"))
        return
    stuck_in_a_collective()
    report(results, (rank, ["never"], None))


def both_report(init_file, rank, n, tag, results):
    report(results, (rank, [f"{tag} {rank}"], None))
