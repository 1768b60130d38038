# Generators and coroutines under the Python walk: a generator driven by a coroutine that asyncio
# runs (its task steps in C, _asyncio, between the event loop's frames and the coroutine's).
import asyncio
import sys
import time


def produce(n):
    for i in range(n):
        x = i
        for j in range(2000):
            x = (x * 31 + j) % 1000003
        yield x


async def consume(seconds):
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        for x in produce(50):
            total += x
        await asyncio.sleep(0)
    return total

__import__("gate").gate()
asyncio.run(consume(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0))
