# An HTTPS stand-in for Pyroscope's push endpoint, for the agent's TLS test: accepts every push,
# counts them in a file. Usage: tls_sink.py CERT KEY PORTFILE COUNTFILE
import http.server
import ssl
import sys

cert, key, port_file, count_file = sys.argv[1:5]


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(count_file, "a") as f:
            f.write("push\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Sink)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file, "w") as f:
    f.write(str(server.server_address[1]))
server.serve_forever()
