#!/usr/bin/env python3
"""Sorts the user stacks of a folded profile (benches/short_lived.sh's) by how they end: complete
(no marker at the root), or by the cause the marker and the process tell. Kernel-only stacks (a
kernel thread, a process in execve) have no user stack and are left out, as the `-v` summary's
share leaves them out.

    benches/short_lived_roots.py OUT.folded...
"""
import collections
import sys


def cause(comm, user):
    root, after = user[0], (user[1] if len(user) > 1 else "")
    if not (root.startswith("[native") or root == "[truncated]"):
        return "complete"
    if root == "[native: no unwind info]" and after in ("_start", "_dl_start_user"):
        return "the loader's entry code (no unwind info)"
    if root == "[native: unknown code]" and comm == "bash":
        return "a forked shell before exec (unknown code)"
    if root == "[native: unknown code]" and comm in ("true", "ls"):
        return "a command before its maps were read (unknown code)"
    if root == "[native: unwind table not loaded yet]":
        return "a table not loaded yet"
    return "other: " + root


for path in sys.argv[1:]:
    causes = collections.Counter()
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        user = [f for f in frames[1:] if not f.endswith("_[k]")]
        if user:
            causes[cause(frames[0], user)] += int(count)
    total = sum(causes.values())
    print(f"{path}: {total} user stacks")
    for what, n in causes.most_common():
        print(f"  {n:6d} {100 * n / max(total, 1):5.1f}%  {what}")
