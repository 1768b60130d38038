"""A rank that is stuck: its main thread waits for a peer on a lock nobody releases, while a
second thread spins. `before`: it blocks at once (the test attaches after); `after SECONDS`: it
sleeps that long first, then says when it blocks (BLOCKING_AT=wall-clock ns) and blocks.
`spin`: a thread spins beside it."""
import sys
import threading
import time

lock = threading.Lock()
lock.acquire()


def spin():
    x = 0
    while True:
        x += 1


def wait_for_peer():
    lock.acquire()


def all_reduce_like():
    wait_for_peer()


def main():
    args = sys.argv[1:]
    if "spin" in args:
        threading.Thread(target=spin, daemon=True, name="spinner").start()
    if args and args[0] == "after":
        print("ready", flush=True)
        time.sleep(float(args[1]))
        sys.stderr.write("BLOCKING_AT=%d\n" % time.time_ns())
        sys.stderr.flush()
    else:
        print("ready", flush=True)
    all_reduce_like()


main()
