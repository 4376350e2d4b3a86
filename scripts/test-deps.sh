#!/usr/bin/env bash
# Installs what Ferry's tests need when it is missing: Debian etcd-server, kubernetes-client
# (kubectl 1.20, unpacked privately when another kubectl owns /usr/bin/kubectl), nftables,
# dnsutils, protobuf-compiler, containernetworking-plugins, iproute2, conntrack, curl, containerd,
# runc, docker-registry, skopeo, apache2-utils, busybox-static; PyPI
# kubernetes; cargo-machete. Idempotent.
set -euo pipefail
TOOLS=${FERRY_TOOLS_DIR:-/var/tmp/ferry-tools}
mkdir -p "$TOOLS"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v dig >/dev/null 2>&1 || need+=(dnsutils)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
# The netns pod network: the reference CNI plugins, iproute2, nsenter (util-linux), conntrack.
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v curl >/dev/null 2>&1 || need+=(curl)
# ferry-cri's containerd tests: containerd (with ctr), runc, a static busybox for the offline
# pause/busybox images, Debian's registry, skopeo to push to it, htpasswd for its auth.
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
# busybox-static replaces the dynamic busybox package; only the static one can go in an image.
if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then need+=(busybox-static); fi
updated=0
if [ ${#need[@]} -gt 0 ]; then
  echo "test-deps: installing ${need[*]}" >&2
  $SUDO apt-get update -qq && updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Debian's kubectl 1.20, kept beside whatever kubectl the machine has.
K120="$TOOLS/kubectl-1.20/usr/bin/kubectl"
if [ ! -x "$K120" ]; then
  echo "test-deps: unpacking Debian kubernetes-client (kubectl 1.20)" >&2
  [ "$updated" = 1 ] || $SUDO apt-get update -qq
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq kubernetes-client >/dev/null)
  dpkg-deb -x "$tmp"/kubernetes-client_*.deb "$TOOLS/kubectl-1.20"
  rm -rf "$tmp"
fi

if ! python3 -c 'import kubernetes' >/dev/null 2>&1; then
  echo "test-deps: pip install kubernetes" >&2
  python3 -m pip install -q --disable-pip-version-check kubernetes
fi
# cargo-machete: the test command refuses unused dependencies.
if ! command -v cargo-machete >/dev/null 2>&1; then
  echo "test-deps: cargo install cargo-machete" >&2
  cargo install -q --locked cargo-machete >&2
fi
echo "$K120"
