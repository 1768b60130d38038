# Code objects with names and a file name of a million characters each, as any process can make
# them: `python3 huge_names.py COUNT SECONDS [CHARS]`. Calls COUNT such functions in turn for
# SECONDS; CHARS (default 1,000,000, at least 30) sets the length.
import sys
import time


def spin(until):
    x = 0
    while time.monotonic() < until:
        for i in range(1_000):
            x += i
    return x


def main():
    count, seconds = int(sys.argv[1]), float(sys.argv[2])
    chars = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    filename = "f" * (chars - 3) + ".py"
    hot = []
    for i in range(count):
        # Distinct names: each is a code object of its own for gpuflame to read.
        name = f"start{i:05d}_" + "n" * (chars - 21) + f"_tail{i:05d}"
        changes = {"co_name": name, "co_filename": filename}
        if sys.version_info >= (3, 11):
            changes["co_qualname"] = name
        hot.append(type(spin)(spin.__code__.replace(**changes), spin.__globals__, name))
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for fn in hot:
            fn(time.monotonic() + 0.004)


main()
