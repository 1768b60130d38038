"""A stand-in for Pyroscope's push endpoint that decodes everything it is sent, for the agent's run
in scripts/gpu-cost.sh: every series of every push is unpacked (gzip, then pprof) and tallied by
its `__name__` and `service_name` labels. On SIGTERM it prints, per series, the pushes, samples and
sample types it had, and how many profiles did not decode.

    python3 series_sink.py PORT
"""
import gzip
import os
import signal
import sys
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, HTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benches"))
from torch_stacks import _fields, push_series  # noqa: E402  (the protobuf reader the torch bench has)

SEEN = defaultdict(lambda: {"pushes": 0, "samples": 0, "types": set(), "bad": 0})
PUSHES = [0]


def fields(buf):
    return ((number, value) for number, _, value in _fields(buf))


def tally(name, raw):
    entry = SEEN[name]
    entry["pushes"] += 1
    try:
        profile = list(fields(gzip.decompress(raw)))
        strings = [v.decode("utf-8", "replace") for n, v in profile if n == 6]
        for n, v in profile:
            if n == 1:
                t = dict(fields(v))
                entry["types"].add(f"{strings[t.get(1, 0)]}/{strings[t.get(2, 0)]}")
            elif n == 2:
                entry["samples"] += 1
    except Exception:  # noqa: BLE001  (what is counted is whether it decodes)
        entry["bad"] += 1


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        PUSHES[0] += 1
        try:
            for labels, raws in push_series(body):
                name = f"{labels.get('__name__', '?')}{{service_name={labels.get('service_name', '?')}}}"
                for raw in raws:
                    tally(name, raw)
        except Exception:  # noqa: BLE001
            SEEN["(push that did not decode)"]["bad"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def report(*_):
    print(f"pushes={PUSHES[0]}")
    for name, e in sorted(SEEN.items()):
        print(f"series {name}: {e['pushes']} profiles, {e['samples']} samples, types {sorted(e['types'])}, {e['bad']} did not decode")
    sys.stdout.flush()
    os._exit(0)


signal.signal(signal.SIGTERM, report)
signal.signal(signal.SIGINT, report)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
