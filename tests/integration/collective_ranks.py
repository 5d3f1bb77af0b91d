"""One rank of tests/integration/test_learner_collectives.py (gloo, a 3 s collective timeout).

    python collective_ranks.py idle|stuck    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

idle:  rank 0 stays away 3x the collective timeout, then sends "stop"; the follower waits for it
       on the store (`worker._next_command`), as followers wait between steps and runs.
stuck: rank 1 stops itself (SIGSTOP) before an all-reduce: rank 0's all-reduce must fail within
       about the timeout, not hang.
"""

import os
import signal
import sys
import time

import torch

from magic.learner import backends, worker

TIMEOUT = 3.0


def main(mode: str) -> None:
    rank, _ = backends.init_distributed(torch.device("cpu"), TIMEOUT)
    if mode == "idle":
        if rank == 0:
            time.sleep(3 * TIMEOUT)
            worker._broadcast(("stop",))
        else:
            t0 = time.monotonic()
            cmd = worker._next_command(0, poll_seconds=1.0)
            print(f"follower got {cmd!r} after {time.monotonic() - t0:.1f} s", flush=True)
            assert cmd == ("stop",)
    else:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            torch.distributed.all_reduce(torch.ones(4))
        except Exception as exc:  # noqa: BLE001
            print(f"all_reduce failed after {time.monotonic() - t0:.1f} s: {type(exc).__name__}", flush=True)
            os._exit(3)  # gloo's threads with the stopped peer abort a normal interpreter exit
        print("all_reduce returned", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
