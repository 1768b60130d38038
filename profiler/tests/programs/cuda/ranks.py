"""A data-parallel training job on the CUDA and NCCL stand-ins, through ctypes.

    NCCL=.../libnccl.so.2 CUDA=.../libcuda.so.1 python3 ranks.py NRANKS STEPS SLOW_RANK

The launcher (no RANK in its environment) makes a unique id and starts NRANKS ranks, this script
again with --rank and RANK, LOCAL_RANK, WORLD_SIZE and NCCL_UNIQUE_ID_HEX in their environment, as
torchrun does; it waits for them and exits non-zero if one failed (the others are then killed).
Each rank initialises CUDA (cuInit: where the stand-in driver loads a CUDA injection library) and a
communicator, prints `rank=R pid=P`, then for each step computes (a pure-Python CPU loop that runs
for 20 ms per unit: 3 units on SLOW_RANK, 1 elsewhere), all-reduces its gradients (ncclAllReduce of
1048576 float32: 4 MiB) and gathers metrics (ncclAllGather of 1024 int64: 8 KiB). The fast ranks
then wait in ncclAllReduce for the slow one, about 2 units a step. At the end each rank prints
`rank=R allreduce_calls=N allreduce_bytes=B allgather_calls=M allgather_bytes=C`.

With STUCK_RANK=R in the environment, rank R never reaches its first all-reduce: after its first
compute it waits for a batch that never comes (load_batch), and the others wait for it in
ncclAllReduce until FAKE_NCCL_TIMEOUT_S. Each rank prints `rank=R stuck=1` or `rank=R waiting=1`
first."""
import ctypes
import os
import queue
import signal
import subprocess
import sys
import time

UNIT_S = 0.020
NCCL_FLOAT32, NCCL_INT64, NCCL_SUM = 7, 4, 0
GRADIENTS = 1048576  # float32 elements
METRICS = 1024  # int64 elements


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def load_nccl():
    nccl = ctypes.CDLL(os.environ["NCCL"])
    nccl.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    nccl.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    nccl.ncclGetErrorString.argtypes = [ctypes.c_int]
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    buffers = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    nccl.ncclAllReduce.argtypes = buffers + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    nccl.ncclAllGather.argtypes = buffers + [ctypes.c_void_p, ctypes.c_void_p]
    return nccl


def say(line):
    # One write(2) per line, so that the ranks' lines never interleave on a shared stdout.
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def check(nccl, what, rc):
    if rc != 0:
        raise RuntimeError(f"{what} failed: {rc} ({nccl.ncclGetErrorString(rc).decode()})")


def compute(units):
    # A forward and backward pass. It runs for a wall-clock time, not a number of iterations or CPU
    # seconds: on a box with fewer cores than ranks those would depend on how the scheduler places
    # the ranks (3 fast ranks sharing one core finish with the slow one on the other, and wait 0),
    # while this keeps the fast ranks' wait at 2 units a step however the CPUs are shared.
    end = time.monotonic() + units * UNIT_S
    x = 0
    while time.monotonic() < end:
        for i in range(1000):
            x = (x * 31 + i) % 1000003
    return x


def load_batch():
    # A data loader that never delivers: the rank waits on an empty queue.
    return queue.Queue().get()


class Rank:
    def __init__(self, nccl, comm, world):
        self.nccl, self.comm = nccl, comm
        self.gradients = (ctypes.c_float * GRADIENTS)()
        self.reduced = (ctypes.c_float * GRADIENTS)()
        self.metrics = (ctypes.c_int64 * METRICS)()
        self.gathered = (ctypes.c_int64 * (METRICS * world))()
        self.allreduce_calls = self.allreduce_bytes = self.allgather_calls = self.allgather_bytes = 0

    def all_reduce_gradients(self):
        rc = self.nccl.ncclAllReduce(ctypes.addressof(self.gradients), ctypes.addressof(self.reduced), GRADIENTS,
                                     NCCL_FLOAT32, NCCL_SUM, self.comm, None)
        check(self.nccl, "ncclAllReduce", rc)
        self.allreduce_calls += 1
        self.allreduce_bytes += GRADIENTS * 4

    def gather_metrics(self):
        rc = self.nccl.ncclAllGather(ctypes.addressof(self.metrics), ctypes.addressof(self.gathered), METRICS,
                                     NCCL_INT64, self.comm, None)
        check(self.nccl, "ncclAllGather", rc)
        self.allgather_calls += 1
        self.allgather_bytes += METRICS * 8


def rank_main(world, steps, slow_rank):
    rank = int(os.environ["RANK"])
    cuda = ctypes.CDLL(os.environ["CUDA"])  # before NCCL, which needs libcuda.so.1: the same one
    # NCCL is mapped before CUDA is initialised, as `import torch` maps it (libtorch_cuda.so
    # links it) long before the first CUDA call: a profiler that holds cuInit until it is ready
    # (gpuflame's CUPTI library) has NCCL hooked by then.
    nccl = load_nccl()
    if cuda.cuInit(0) != 0:
        raise RuntimeError("cuInit failed")
    uid = UniqueId.from_buffer_copy(bytes.fromhex(os.environ["NCCL_UNIQUE_ID_HEX"]))
    comm = ctypes.c_void_p()
    check(nccl, "ncclCommInitRank", nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank))
    say(f"rank={rank} pid={os.getpid()}")
    r = Rank(nccl, comm, world)
    stuck = os.environ.get("STUCK_RANK")
    if stuck is not None:
        compute(1)
        say(f"rank={rank} {'stuck' if int(stuck) == rank else 'waiting'}=1")
        if int(stuck) == rank:
            load_batch()
        r.all_reduce_gradients()
    for _ in range(steps):
        compute(3 if rank == slow_rank else 1)
        r.all_reduce_gradients()
        r.gather_metrics()
    say(f"rank={rank} allreduce_calls={r.allreduce_calls} allreduce_bytes={r.allreduce_bytes} "
        f"allgather_calls={r.allgather_calls} allgather_bytes={r.allgather_bytes}")
    check(nccl, "ncclCommDestroy", nccl.ncclCommDestroy(comm))


def launch(world, steps, slow_rank):
    nccl = load_nccl()
    uid = UniqueId()
    check(nccl, "ncclGetUniqueId", nccl.ncclGetUniqueId(ctypes.byref(uid)))
    children = {}
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   NCCL_UNIQUE_ID_HEX=bytes(uid).hex())
        args = [sys.executable, os.path.abspath(__file__), "--rank", str(world), str(steps), str(slow_rank)]
        children[subprocess.Popen(args, env=env).pid] = rank
    failed = None
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failed is None:
            failed = rank
            print(f"ranks.py: rank {rank} failed ({code}); stopping the others", file=sys.stderr)
            for other in children:  # they would wait for it until FAKE_NCCL_TIMEOUT_S
                os.kill(other, signal.SIGTERM)
    return 0 if failed is None else 1


def main():
    args = [a for a in sys.argv[1:] if a != "--rank"]
    world, steps, slow_rank = (int(a) for a in args)
    if "RANK" in os.environ:
        rank_main(world, steps, slow_rank)
        return 0
    return launch(world, steps, slow_rank)


if __name__ == "__main__":
    sys.exit(main())
