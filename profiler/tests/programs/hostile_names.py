# Spins in a function whose code object has a hostile name and file name, as a process can make
# them: `python3 hostile_names.py hostile|long SECONDS`. Chain: <module> -> main -> outer -> it.
import sys
import time

# Control characters (C0, DEL, C1), the folded separator, a newline, XML's specials, a lone
# surrogate (the str becomes UCS-2) and, in the file name, an astral char too (UCS-4).
HOSTILE_NAME = "evil\x1b[31m\x00;\n<&>\x7f\x85\udcff"
HOSTILE_FILE = "bad\x1b\x00;\r\n\U0001F600\udcff.py"
# 100,000 characters: the cap keeps the end, so the marker must survive and the start must not.
LONG_NAME = "start_" + "x" * 99_984 + "_tail_marker"


def spin(until):
    x = 0
    while time.monotonic() < until:
        for i in range(10_000):
            x += i
    return x


def renamed(fn, name, filename):
    changes = {"co_name": name, "co_filename": filename}
    if sys.version_info >= (3, 11):
        changes["co_qualname"] = name
    code = fn.__code__.replace(**changes)
    return type(fn)(code, fn.__globals__, name)


def outer(hot, until):
    return hot(until)


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode == "hostile":
        hot = renamed(spin, HOSTILE_NAME, HOSTILE_FILE)
    else:
        hot = renamed(spin, LONG_NAME, "long.py")
    outer(hot, time.monotonic() + seconds)


main()
