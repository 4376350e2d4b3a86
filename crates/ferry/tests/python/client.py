"""Drives Ferry with the Python kubernetes client: CRUD, errors, watch, reconnect."""
import json
import sys
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

config.load_kube_config()
core = client.CoreV1Api()
disc = client.DiscoveryV1Api()
ns = "default"


def expect_error(fn, status, reason):
    try:
        fn()
    except ApiException as e:
        body = json.loads(e.body)
        assert e.status == status, (e.status, e.body)
        assert body["reason"] == reason, body
        assert body["kind"] == "Status", body
        return body
    raise AssertionError(f"expected {status} {reason}")


svc = client.V1Service(
    metadata=client.V1ObjectMeta(name="py-svc", labels={"app": "py"}),
    spec=client.V1ServiceSpec(selector={"app": "py"}, ports=[client.V1ServicePort(port=80, target_port=8080)]),
)
created = core.create_namespaced_service(ns, svc)
assert created.metadata.uid and created.metadata.resource_version
assert created.spec.ports[0].protocol == "TCP"
lst = core.list_namespaced_service(ns)
assert any(s.metadata.name == "py-svc" for s in lst.items), lst
assert lst.metadata.resource_version
got = core.read_namespaced_service("py-svc", ns)
assert got.spec.ports[0].target_port == 8080
patched = core.patch_namespaced_service("py-svc", ns, {"metadata": {"labels": {"tier": "web"}}})
assert patched.metadata.labels["tier"] == "web"
jp = core.patch_namespaced_service("py-svc", ns, [{"op": "replace", "path": "/spec/ports/0/port", "value": 81}])
assert jp.spec.ports[0].port == 81
got.metadata.resource_version = jp.metadata.resource_version
got.spec.ports[0].port = 82
rep = core.replace_namespaced_service("py-svc", ns, got)
assert rep.spec.ports[0].port == 82
# A stale resourceVersion conflicts.
got.metadata.resource_version = created.metadata.resource_version
expect_error(lambda: core.replace_namespaced_service("py-svc", ns, got), 409, "Conflict")
expect_error(lambda: core.create_namespaced_service(ns, svc), 409, "AlreadyExists")
expect_error(lambda: core.read_namespaced_service("nope", ns), 404, "NotFound")
bad = client.V1Service(metadata=client.V1ObjectMeta(name="bad"), spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=70000)]))
body = expect_error(lambda: core.create_namespaced_service(ns, bad), 422, "Invalid")
assert any(c["field"] == "spec.ports[0].port" for c in body["details"]["causes"]), body

# EndpointSlices, and a watch that sees the changes.
events = []


def watcher():
    w = watch.Watch()
    for ev in w.stream(disc.list_namespaced_endpoint_slice, ns, timeout_seconds=4):
        events.append((ev["type"], ev["object"].metadata.name))


t = threading.Thread(target=watcher)
t.start()
time.sleep(0.5)
eps = client.V1EndpointSlice(
    metadata=client.V1ObjectMeta(name="py-eps", labels={"kubernetes.io/service-name": "py-svc"}),
    address_type="IPv4",
    endpoints=[client.V1Endpoint(addresses=["10.0.0.1"], conditions=client.V1EndpointConditions(ready=True))],
    ports=[client.DiscoveryV1EndpointPort(name="http", port=8080, protocol="TCP")],
)
disc.create_namespaced_endpoint_slice(ns, eps)
disc.patch_namespaced_endpoint_slice("py-eps", ns, {"metadata": {"labels": {"x": "y"}}})
disc.delete_namespaced_endpoint_slice("py-eps", ns)
t.join()
kinds = [e[0] for e in events if e[1] == "py-eps"]
assert kinds == ["ADDED", "MODIFIED", "DELETED"], events

# Watch resumes from a resourceVersion: only later events.
rv = core.list_namespaced_service(ns).metadata.resource_version
core.patch_namespaced_service("py-svc", ns, {"metadata": {"labels": {"again": "1"}}})
seen = []
w = watch.Watch()
for ev in w.stream(core.list_namespaced_service, ns, resource_version=rv, timeout_seconds=2):
    seen.append((ev["type"], ev["object"].metadata.name))
assert seen == [("MODIFIED", "py-svc")], seen

deleted = core.delete_namespaced_service("py-svc", ns)
assert deleted.metadata.name == "py-svc"
expect_error(lambda: core.read_namespaced_service("py-svc", ns), 404, "NotFound")
print("OK")
