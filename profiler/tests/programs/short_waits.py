"""One thread that sleeps COUNT times for SECONDS each (short waits: most are not unwound, and
their measured time is carried by those that are), then says how long it was away: slept_ns=N."""
import sys
import time

import gate

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0005


def nap_briefly():
    time.sleep(SECONDS)


def main():
    gate.gate()
    away = 0
    for _ in range(COUNT):
        start = time.perf_counter_ns()
        nap_briefly()
        away += time.perf_counter_ns() - start
    print("slept_ns=%d" % away, file=sys.stderr)


main()
