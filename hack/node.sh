#!/usr/bin/env bash
# What a real node of the test bed needs from Debian's packages (docs/kubelet.md):
#   containerd, ctr, runc   (docker.io, which hack/docker.sh installs, brings them)
#   CNI plug-ins            (containernetworking-plugins: bridge, host-local, loopback, portmap)
#   a static busybox        (busybox-static: the pause image is made from it)
# The kubelet and kube-proxy come from hack/build-tools.sh.
#
#   bash hack/node.sh install   install what is missing (as root, with apt-get); idempotent
set -euo pipefail
log() { echo "[node $(date +%T)] $*" >&2; }

install() {
  local want=()
  command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null \
    || want+=(docker.io)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
    || want+=(containernetworking-plugins)
  [ -x /bin/busybox ] || want+=(busybox-static)
  [ ${#want[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing ${want[*]}: install them (Debian: apt-get install ${want[*]})" >&2
    exit 1
  fi
  log "installing Debian's ${want[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
