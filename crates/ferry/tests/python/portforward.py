"""Python client's portforward (WebSocket, v4.channel.k8s.io) to a pod's port: an HTTP
request through it answers with the pod's hostname; a port nothing listens on reports an
error on the port's error channel."""
import select
import sys
import time

from kubernetes import client, config
from kubernetes.stream import portforward

config.load_kube_config()
core = client.CoreV1Api()
pod, port, want = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def fetch():
    pf = portforward(core.connect_get_namespaced_pod_portforward, pod, "default", ports=str(port))
    sock = pf.socket(port)
    sock.setblocking(True)
    sock.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    data = b""
    deadline = time.time() + 30
    while time.time() < deadline and want.encode() not in data:
        r, _, _ = select.select([sock], [], [], 1)
        if r:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    sock.close()
    err = pf.error(port)
    pf.close()
    return data, err


data, err = fetch()
assert want.encode() in data, data
assert err is None, err
# Twice: every connection is its own WebSocket session.
data, _ = fetch()
assert want.encode() in data, data
print("OK")
