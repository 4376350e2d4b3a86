#!/usr/bin/env python3
"""Pod network benchmark (issue 10). Not a test: prints figures and ratios.

1. create -> Ready latency of 100 pods spread over 3 nodes of `ferry up --nodes 3` (netns pod
   network, reference CNI plugins): p50 / p99 / max, measured client-side from the create call
   to the watch event showing the pod Ready.
2. pod-to-pod TCP throughput across nodes (pod on node 1 -> pod on node 3), against the same
   path built by hand in throwaway namespaces: pod veth -> node bridge -> node veth -> cluster
   bridge -> node veth -> node bridge -> pod veth, with the same addresses and routes but none
   of Ferry's rules. Same tool (iperf3 when installed, else a Python sender/receiver), same
   duration, same direction; the ratio is what Ferry's pod network costs over bare kernel
   links (its nftables tables in the node namespaces, CNI's bridge settings).

Run as root: nice -n 19 python3 bench/podnet/run.py [path/to/ferry]
Everything lives in namespaces this script (or ferry) creates, removed at the end.
"""
import json, os, shutil, signal, subprocess, sys, tempfile, threading, time

FERRY = sys.argv[1] if len(sys.argv) > 1 else "target/release/ferry"
N_PODS = int(os.environ.get("PODS", "100"))
SECONDS = int(os.environ.get("SECONDS_PER_RUN", "10"))
RUNS = int(os.environ.get("RUNS", "3"))
IPERF = shutil.which("iperf3")

RECV = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5201)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t = None
buf = bytearray(1 << 20)
while True:
    k = c.recv_into(buf)
    if not k: break
    if t is None: t = time.perf_counter()
    n += k
print(n / (time.perf_counter() - t) / 1e6, flush=True)
"""
SEND = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5201))
b = b"x" * (1 << 20); end = time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    s.sendall(b)
s.close()
"""


def sh(*a, **kw):
    return subprocess.run(a, check=True, capture_output=True, text=True, **kw).stdout


def throughput_once(recv_ns, send_ns, dst):
    """MB/s received from send_ns to dst (in recv_ns) over SECONDS."""
    if IPERF:
        r = subprocess.Popen(["ip", "netns", "exec", recv_ns, IPERF, "-s", "-1", "-p", "5201"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(50):
                if subprocess.run(["ip", "netns", "exec", recv_ns, "ss", "-ltnH", "sport = :5201"],
                                  capture_output=True, text=True).stdout.strip():
                    break
                time.sleep(0.1)
            out = sh("ip", "netns", "exec", send_ns, IPERF, "-c", dst, "-p", "5201",
                     "-t", str(SECONDS), "-J")
            return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8e6
        finally:
            r.wait(timeout=30)
    r = subprocess.Popen(["ip", "netns", "exec", recv_ns, "python3", "-c", RECV],
                         stdout=subprocess.PIPE, text=True)
    assert r.stdout.readline().strip() == "ready"
    sh("ip", "netns", "exec", send_ns, "python3", "-c", SEND, dst, str(SECONDS))
    mbps = float(r.stdout.readline())
    r.wait()
    return mbps


def throughput(recv_ns, send_ns, dst):
    """The median of RUNS runs."""
    v = sorted(throughput_once(recv_ns, send_ns, dst) for _ in range(RUNS))
    return v[len(v) // 2]


def by_hand():
    """The cross-node path built by hand: pod A - node 1 bridge - cluster bridge - node 3
    bridge - pod B, addresses and routes as Ferry's, no rules."""
    t = f"fb{os.getpid() % 100000}"
    pa, n1, cl, n3, pb = (f"{t}-{x}" for x in ("pa", "n1", "cl", "n3", "pb"))
    names = [pa, n1, cl, n3, pb]
    try:
        for n in names:
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        # The cluster bridge and the two nodes on it.
        sh("ip", "-n", cl, "link", "add", "fbr0", "type", "bridge")
        sh("ip", "-n", cl, "addr", "add", "198.18.0.1/24", "dev", "fbr0")
        sh("ip", "-n", cl, "link", "set", "fbr0", "up")
        for i, (node, ip, podnet) in enumerate(((n1, "198.18.0.11", "10.244.0.0/24"),
                                               (n3, "198.18.0.13", "10.244.2.0/24")), 1):
            sh("ip", "-n", cl, "link", "add", f"fv{i}", "type", "veth", "peer", "name", "eth0",
               "netns", node)
            sh("ip", "-n", cl, "link", "set", f"fv{i}", "master", "fbr0", "up")
            sh("ip", "-n", node, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", node, "link", "set", "eth0", "up")
            sh("ip", "-n", node, "route", "add", "default", "via", "198.18.0.1")
            sh("ip", "-n", cl, "route", "add", podnet, "via", ip)
            sh("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "netns", "exec", cl, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # A pod on each node: veth into the node's bridge cni0 (gateway .1), as CNI bridge does.
        for node, pod, gw, addr in ((n1, pa, "10.244.0.1", "10.244.0.2"),
                                    (n3, pb, "10.244.2.1", "10.244.2.2")):
            sh("ip", "-n", node, "link", "add", "cni0", "type", "bridge")
            sh("ip", "-n", node, "addr", "add", f"{gw}/24", "dev", "cni0")
            sh("ip", "-n", node, "link", "set", "cni0", "up")
            sh("ip", "-n", node, "link", "add", "veth0", "type", "veth", "peer", "name", "eth0",
               "netns", pod)
            sh("ip", "-n", node, "link", "set", "veth0", "master", "cni0", "up")
            sh("ip", "-n", pod, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", pod, "link", "set", "eth0", "up")
            sh("ip", "-n", pod, "route", "add", "default", "via", gw)
        return throughput(pb, pa, "10.244.2.2")
    finally:
        for n in reversed(names):
            subprocess.run(["ip", "netns", "delete", n])


def main():
    d = tempfile.mkdtemp(prefix="ferry-bench-")
    log = open(os.path.join(d, "ferry.log"), "w")
    p = subprocess.Popen([FERRY, "up", "--data-dir", d, "--pod-network", "netns", "--nodes", "3",
                          "--listen-api", "127.0.0.1:0", "--agent-port", "0",
                          "--dns-metrics-listen", "127.0.0.1:0", "--node-name", "bench",
                          "--proxy-healthz-listen", "off"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        kc = os.path.join(d, "kubeconfig")
        while not os.path.exists(kc):
            time.sleep(0.1)
        from kubernetes import client, config, watch
        config.load_kube_config(kc)
        v1 = client.CoreV1Api()
        while sum(1 for n in v1.list_node().items for c in n.status.conditions or []
                  if c.type == "Ready" and c.status == "True") < 3:
            time.sleep(0.2)
        created, ready = {}, {}

        def watcher():
            w = watch.Watch()
            for ev in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=600):
                pod = ev["object"]
                if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
                    ready.setdefault(pod.metadata.name, time.perf_counter())
                if len(ready) >= N_PODS:
                    w.stop()
        t = threading.Thread(target=watcher); t.start()
        time.sleep(0.5)
        for i in range(N_PODS):
            name = f"p{i}"
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": f"bench-{i % 3 + 1}",
                             "containers": [{"name": "c", "image": "busybox",
                                             "command": ["sleep", "3600"]}]}}
            created[name] = time.perf_counter()
            v1.create_namespaced_pod("default", body)
        t.join()
        lat = sorted(ready[n] - created[n] for n in created if n in ready)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print(f"create->Ready, {len(lat)} pods over 3 nodes: p50 {pct(0.5)*1000:.0f} ms, "
              f"p99 {pct(0.99)*1000:.0f} ms, max {lat[-1]*1000:.0f} ms")
        prefix = json.load(open(os.path.join(d, "netns.json")))["prefix"]
        uid = lambda n: v1.read_namespaced_pod(n, "default").metadata.uid
        ip = v1.read_namespaced_pod("p0", "default").status.pod_ip  # on node 1
        # Pod namespaces are named per node: <prefix>-pod<node>-<uid>.
        pod_ns = lambda n, node: f"{prefix}-pod{node}-{uid(n)}"
        cross = throughput(pod_ns("p0", 1), pod_ns("p2", 3), ip)  # p2 is on node 3
        hand = by_hand()
        tool = "iperf3" if IPERF else "python"
        print(f"pod-to-pod TCP across nodes ({tool}, median of {RUNS} x {SECONDS} s): ferry "
              f"{cross:.0f} MB/s; same path by hand {hand:.0f} MB/s; ratio {cross / hand:.2f}")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)


if __name__ == "__main__":
    main()
