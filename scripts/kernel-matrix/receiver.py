"""A stand-in for Pyroscope's push endpoint, for the agent check in the guest: accepts every
request with 200 and prints one line per request, `push PATH BYTES`, which the host counts.
Once it listens it creates READY_FILE, so that the agent is not started against a closed port.

    python3.11 receiver.py PORT READY_FILE
"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()
        print(f"push {self.path} {len(body)}", flush=True)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)
open(sys.argv[2], "w").close()
server.serve_forever()
