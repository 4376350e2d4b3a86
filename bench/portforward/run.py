#!/usr/bin/env python3
"""Port-forward throughput benchmark (issue 15). Not a test: prints figures and ratios.

A pod sends SIZE_MB megabytes on each connection; the client reads them through
`kubectl port-forward` (the machine's kubectl: SPDY tunnelled in WebSocket; Debian's
kubectl 1.20 when FERRY_KUBECTL_120 names it: plain SPDY/3.1) and, as the peer, over a direct
loopback TCP connection to the same server program run outside Ferry. Each path: RUNS runs,
the median MB/s, and its ratio to the direct path. Both the client and kubectl run on this
machine, so the ratio is what the whole chain (kubectl, API server proxy, agent, SPDY
framing) costs over bare TCP.

Run: nice -n 19 python3 bench/portforward/run.py [path/to/ferry]
"""
import os, re, socket, statistics, subprocess, sys, tempfile, time

FERRY = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferry"
SIZE_MB = int(os.environ.get("SIZE_MB", "256"))
RUNS = int(os.environ.get("RUNS", "3"))

SERVER = r"""
import socket, sys
n = int(sys.argv[1]) << 20
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3]))); s.listen(8)
print("ready", flush=True)
chunk = b"x" * (1 << 20)
while True:
    c, _ = s.accept()
    try:
        left = n
        while left > 0:
            k = c.send(chunk[:min(left, len(chunk))]); left -= k
    except OSError:
        pass
    c.close()
"""


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def receive(port):
    c = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(1 << 20); n = 0; t = time.perf_counter()
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        n += k
    dt = time.perf_counter() - t
    c.close()
    assert n == SIZE_MB << 20, f"got {n} bytes"
    return n / dt / 1e6


def median_rate(port):
    return statistics.median(receive(port) for _ in range(RUNS))


def main():
    d = tempfile.mkdtemp(prefix="ferry-bench-pf-")
    env = dict(os.environ, KUBECONFIG=os.path.join(d, "kubeconfig"), HOME=d)
    log = open(os.path.join(d, "ferry.log"), "w")
    p = subprocess.Popen([FERRY, "up", "--data-dir", d, "--listen-api", "127.0.0.1:0",
                          "--agent-port", "0", "--listen-dns", f"127.0.0.1:{free_port()}",
                          "--dns-metrics-listen", "127.0.0.1:0", "--proxy-healthz-listen", "off",
                          "--ingress-http-addr", "127.0.0.1:0", "--ingress-https-addr", "127.0.0.1:0"],
                         stdout=subprocess.DEVNULL, stderr=log)
    peer = None
    try:
        while not os.path.exists(env["KUBECONFIG"]):
            time.sleep(0.1)
        k = lambda *a, **kw: subprocess.run(["kubectl", *a], env=env, check=True,
                                            capture_output=True, text=True, **kw)
        k("run", "src", "--image=busybox", "--restart=Never", "--", "python3", "-c", SERVER,
          str(SIZE_MB), "0.0.0.0", "5201")
        k("wait", "--for=condition=Ready", "pod/src", "--timeout=120s")
        time.sleep(1)
        # The peer: the same server outside Ferry, read over loopback.
        port = free_port()
        peer = subprocess.Popen([sys.executable, "-c", SERVER, str(SIZE_MB), "127.0.0.1", str(port)],
                                stdout=subprocess.PIPE, text=True)
        peer.stdout.readline()
        direct = median_rate(port)
        print(f"direct loopback TCP: {direct:8.1f} MB/s ({SIZE_MB} MB x {RUNS}, median)")
        kubectls = [("kubectl (machine's, WebSocket-tunnelled SPDY)", "kubectl")]
        if os.environ.get("FERRY_KUBECTL_120"):
            kubectls.append(("kubectl 1.20 (SPDY/3.1)", os.environ["FERRY_KUBECTL_120"]))
        for label, bin in kubectls:
            pf = subprocess.Popen([bin, "port-forward", "--address", "127.0.0.1", "pod/src", ":5201"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                line = pf.stdout.readline()
                m = re.search(r"127\.0\.0\.1:(\d+)", line)
                assert m, line
                rate = median_rate(int(m.group(1)))
                print(f"{label}: {rate:8.1f} MB/s, {rate / direct:.2f}x direct")
            finally:
                pf.kill(); pf.wait()
    finally:
        if peer:
            peer.kill(); peer.wait()
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill(); p.wait()


if __name__ == "__main__":
    main()
