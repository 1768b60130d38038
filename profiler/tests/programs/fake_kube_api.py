#!/usr/bin/env python3
"""A fake Kubernetes API server for the agent's tests: GET /api/v1/pods over TLS with a bearer
token and the field selector of one node; a list, or (watch=1) a chunked stream of watch events
that sends DELETED for every pod UID written as a line to CONTROL_DIR/delete. Every request's
path is logged to CONTROL_DIR/requests.log.

    fake_kube_api.py PORT_FILE CERT KEY TOKEN NODE PODS_JSON CONTROL_DIR
"""
import json
import os
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

port_file, cert, key, token, node, pods_file, control = sys.argv[1:8]


def pods():
    with open(pods_file) as f:
        return json.load(f)


def deleted():
    try:
        with open(os.path.join(control, "delete")) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        with open(os.path.join(control, "requests.log"), "a") as f:
            f.write(self.path + "\n")
        url = urlparse(self.path)
        q = parse_qs(url.query)
        if self.headers.get("Authorization") != "Bearer " + token:
            return self.reply(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
        if url.path != "/api/v1/pods" or q.get("fieldSelector") != ["spec.nodeName=" + node]:
            return self.reply(400, {"kind": "Status", "code": 400, "message": "bad request " + self.path})
        if q.get("watch") != ["1"]:
            return self.reply(200, {"kind": "PodList", "metadata": {"resourceVersion": "100"}, "items": pods()})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = set()
        version = 100
        try:
            while True:
                for uid in deleted():
                    if uid in sent:
                        continue
                    sent.add(uid)
                    for pod in pods():
                        if pod["metadata"]["uid"] == uid:
                            version += 1
                            pod["metadata"]["resourceVersion"] = str(version)
                            self.chunk({"type": "DELETED", "object": pod})
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
