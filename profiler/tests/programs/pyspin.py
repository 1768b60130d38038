# A Python stack that stays the same while it spins: for comparing with py-spy dump. It waits at
# the test's gate (gate.py) first.
import gate

gate.gate()


def leaf():
    x = 0
    while True:
        x += 1


def middle():
    leaf()


def top():
    middle()


top()
