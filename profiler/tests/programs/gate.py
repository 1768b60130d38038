"""Holds a test program at the start of its work while the recording loads its unwind tables:
with GPUFLAME_TEST_GATE=PATH set, the program creates PATH.PID (it has mapped all its code by
now) and waits for PATH to exist (tests/common/mod.rs, Gate). Unset, it does nothing. Python 2.7
and 3."""
import os
import time


def gate():
    path = os.environ.get("GPUFLAME_TEST_GATE")
    if not path:
        return
    open("%s.%d" % (path, os.getpid()), "w").close()
    while not os.path.exists(path):
        time.sleep(0.005)
