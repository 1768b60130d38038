#!/usr/bin/env python3
"""A stand-in for Pyroscope's push endpoint that keeps the CPU profiles it is sent, for
benches/node.sh: each `process_cpu` series of each push is written to DIR/PUSH-SERIES.pb.gz
(the raw pprof the agent sent), with the push's arrival time in DIR/pushes.txt.

    python node_sink.py PORT DIR
"""
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_stacks import push_series  # noqa: E402  (the protobuf reader the torch bench has)


class Sink(BaseHTTPRequestHandler):
    pushes = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Sink.pushes += 1
        kept = 0
        for k, (labels, raws) in enumerate(push_series(body)):
            if labels.get("__name__") == "process_cpu":
                for j, raw in enumerate(raws):
                    with open(os.path.join(DIR, f"{Sink.pushes:04d}-{k:03d}-{j}.pb.gz"), "wb") as f:
                        f.write(raw)
                    kept += 1
        with open(os.path.join(DIR, "pushes.txt"), "a") as f:
            f.write(f"{Sink.pushes} {time.time():.3f} {kept}\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


DIR = sys.argv[2]
os.makedirs(DIR, exist_ok=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
