"""A paged LIST is one snapshot: 2,000 ConfigMaps listed 500 per page while a writer changes
them, then a watch from the list's resourceVersion; list + events must equal the final state
(no lost or phantom event), as kube-rs reflectors and client-go informers rely on."""
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

config.load_kube_config()
core = client.CoreV1Api()
ns = "paged"
core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

N = 2000
for i in range(N):
    core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"cm-{i:04d}"), data={"v": "0"})
    )

stop = threading.Event()
writes = []


def writer():
    # Touches objects on both sides of the list cursor: early names (already listed) and
    # late ones, plus creates and deletes.
    k = 0
    while not stop.is_set():
        k += 1
        name = f"cm-{(k * 37) % N:04d}"
        try:
            core.patch_namespaced_config_map(name, ns, {"data": {"v": str(k)}})
            writes.append(("patch", name))
            if k % 5 == 0:
                core.create_namespaced_config_map(
                    ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"new-{k:05d}"), data={"v": "n"})
                )
                writes.append(("create", f"new-{k:05d}"))
            if k % 7 == 0:
                core.delete_namespaced_config_map(f"cm-{(k * 11) % N:04d}", ns)
                writes.append(("delete", f"cm-{(k * 11) % N:04d}"))
        except ApiException as e:
            if e.status != 404:
                raise


t = threading.Thread(target=writer)
t.start()
time.sleep(0.2)

state = {}
rvs = []
cont = None
pages = 0
while True:
    lst = core.list_namespaced_config_map(ns, limit=500, _continue=cont)
    pages += 1
    rvs.append(lst.metadata.resource_version)
    for cm in lst.items:
        state[cm.metadata.name] = cm.data.get("v") if cm.data else None
    cont = lst.metadata._continue
    if not cont:
        break
    time.sleep(0.3)  # let the writer change things between pages
assert pages >= 4, pages
assert len(set(rvs)) == 1, f"every page must be served at the first page's revision: {rvs}"
list_rv = rvs[-1]

time.sleep(0.5)
stop.set()
t.join()
assert len(writes) > 20, len(writes)

final = {cm.metadata.name: (cm.data or {}).get("v") for cm in core.list_namespaced_config_map(ns).items}
final_rv = core.list_namespaced_config_map(ns, limit=1).metadata.resource_version

w = watch.Watch()
for ev in w.stream(core.list_namespaced_config_map, ns, resource_version=list_rv, timeout_seconds=30):
    obj = ev["object"]
    name = obj.metadata.name
    if ev["type"] == "DELETED":
        assert name in state, f"DELETED for {name} that the list never had"
        del state[name]
    elif ev["type"] == "ADDED":
        assert name not in state, f"ADDED for {name} that the list already had"
        state[name] = (obj.data or {}).get("v")
    elif ev["type"] == "MODIFIED":
        assert name in state, f"MODIFIED for {name} that the list never had"
        state[name] = (obj.data or {}).get("v")
    if int(obj.metadata.resource_version) >= int(final_rv) and state == final:
        w.stop()
assert state == final, (len(state), len(final), sorted(set(state.items()) ^ set(final.items()))[:10])

# Invalid resourceVersions are refused; a continue token at a revision is honoured.
for rv, code in [("abc", 400), ("99999999999999999999", 400)]:
    try:
        core.list_namespaced_config_map(ns, resource_version=rv)
        raise AssertionError(f"rv={rv} accepted")
    except ApiException as e:
        assert e.status == code, (rv, e.status, e.body)
cases = [
    (dict(resource_version_match="Exact"), 422, "resourceVersionMatch is forbidden unless resourceVersion is provided"),
    (dict(resource_version="0", resource_version_match="Exact"), 422, 'resourceVersionMatch \\"exact\\" is forbidden'),
    (dict(resource_version="5", resource_version_match="Bogus"), 422, "supported values"),
    (dict(_continue="invalidContinueToken"), 400, "continue key is not valid"),
]
for kwargs, code, text in cases:
    try:
        core.list_namespaced_config_map(ns, **kwargs)
        raise AssertionError(f"{kwargs} accepted")
    except ApiException as e:
        assert e.status == code and text in e.body, (kwargs, e.status, e.body)
# Exact at the list's revision gives the snapshot back.
exact = core.list_namespaced_config_map(ns, resource_version=list_rv, resource_version_match="Exact")
assert exact.metadata.resource_version == list_rv
# A watch from a resourceVersion the server has not reached: 504 after a few seconds.
t0 = time.time()
try:
    core.list_namespaced_config_map(ns, watch=True, resource_version=str(int(final_rv) + 1000000), _preload_content=False)
    raise AssertionError("future watch accepted")
except ApiException as e:
    assert e.status == 504 and "Too large resource version" in e.body, (e.status, e.body)
print("OK", pages, "pages", len(writes), "writes")
