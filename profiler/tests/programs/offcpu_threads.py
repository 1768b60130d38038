"""Three threads that wait in three ways, under known Python functions, for DURATION seconds: one
blocked in queue.get, one in time.sleep, one reading a pipe. The main thread joins them."""
import os
import queue
import sys
import threading
import time

import gate

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0


def wait_for_work(q):
    try:
        q.get(timeout=DURATION)
    except queue.Empty:
        pass


def consumer(q):
    wait_for_work(q)


def nap():
    time.sleep(DURATION)


def sleeper():
    nap()


def read_request(fd):
    return os.read(fd, 1)


def reader(fd):
    read_request(fd)


def main():
    gate.gate()
    q = queue.Queue()
    r, w = os.pipe()
    threads = [
        threading.Thread(target=consumer, args=(q,), name="consumer"),
        threading.Thread(target=sleeper, name="sleeper"),
        threading.Thread(target=reader, args=(r,), name="reader"),
    ]
    for t in threads:
        t.start()
    time.sleep(DURATION)
    os.write(w, b"x")
    for t in threads:
        t.join()


main()
