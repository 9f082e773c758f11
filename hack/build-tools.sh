#!/usr/bin/env bash
# Builds the local control plane's binaries from Go modules, once per machine.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes)
#   kubelet, kube-proxy (a real node: tests/kubelet, docs/kubelet.md)  (k8s.io/kubernetes)
#   etcd                                                              (go.etcd.io/etcd/server/v3)
#   helm                                                              (helm.sh/helm/v3)
#   coredns (the plug-ins a cluster's DNS uses; a real node's pods)   (github.com/coredns/coredns)
#
# Binaries land in $MTRL_TOOLS_DIR (default ~/.cache/mtrl/tools-<versions>/bin); a warm
# cache makes this a no-op. Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.6}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
TOOLS_DIR="${MTRL_TOOLS_DIR:-${HOME}/.cache/mtrl/tools-${KEY}}"
BIN="${TOOLS_DIR}/bin"
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
WANT=("${K8S_CMDS[@]}" etcd helm coredns)

# How helm is built. Its stamp file sits beside the binary: a helm built another way (an older
# recipe of this script) is rebuilt alone, without touching the Kubernetes binaries' cache key.
HELM_RECIPE="helm ${HELM_VERSION}; ldflags: version, k8sVersion from its client-go (v1)"
helm_current() { [ -x "${BIN}/helm" ] && [ "$(cat "${BIN}/helm.stamp" 2>/dev/null)" = "${HELM_RECIPE}" ]; }

# CoreDNS likewise, with only the plug-ins below: its own main lists every plug-in, and every
# cloud provider's SDK with them (minutes more on 2 cores).
COREDNS_PLUGINS=(errors health ready kubernetes cache forward)
COREDNS_RECIPE="coredns ${COREDNS_VERSION}; plugins: ${COREDNS_PLUGINS[*]} (v1)"
coredns_current() {
  [ -x "${BIN}/coredns" ] && [ "$(cat "${BIN}/coredns.stamp" 2>/dev/null)" = "${COREDNS_RECIPE}" ]
}

have_all() {
  for b in "${WANT[@]}"; do [ -x "${BIN}/${b}" ] || return 1; done
  helm_current && coredns_current
}
if have_all; then echo "${BIN}"; exit 0; fi

command -v go >/dev/null || { echo "go toolchain not found; install Go >= 1.24" >&2; exit 1; }
mkdir -p "${BIN}" "${TOOLS_DIR}/src"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath"
log() { echo "[build-tools $(date +%T)] $*" >&2; }

# --- Kubernetes: a tiny module that depends on k8s.io/kubernetes, with the staging replaces.
k8s_src="${TOOLS_DIR}/src/k8s"
k8s_missing() { for c in "${K8S_CMDS[@]}"; do [ -x "${BIN}/${c}" ] || return 0; done; return 1; }
if k8s_missing; then
  mkdir -p "${k8s_src}" && cd "${k8s_src}"
  gomod_json=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}")
  upstream_mod=$(printf '%s' "${gomod_json}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging_version="v0.${K8S_VERSION#v1.}"
  {
    echo "module mtrl.local/k8s-tools"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    # k8s.io/kubernetes points its staging modules at ./staging; map each to its release.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "${upstream_mod}" \
      | awk -v v="${staging_version}" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  log "resolving k8s.io/kubernetes ${K8S_VERSION} dependencies"
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@${K8S_VERSION}" >/dev/null
  go mod tidy -e >/dev/null 2>&1 || true
  # One `go build` for every command: it schedules their packages and links over both cores
  # together, where one build after another leaves a core idle at each build's tail.
  pkgs=() && for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${c}"); done
  out="${TOOLS_DIR}/src/k8s-bin.tmp" && rm -rf "${out}" && mkdir -p "${out}"
  log "building ${K8S_CMDS[*]} (a cold build takes about 9 minutes on 2 cores)"
  go build -tags tools -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#v1.}" \
    -o "${out}/" "${pkgs[@]}"
  for c in "${K8S_CMDS[@]}"; do mv "${out}/${c}" "${BIN}/${c}"; done
  rmdir "${out}"
fi

# --- etcd: a three-line main over etcdmain.
if [ ! -x "${BIN}/etcd" ]; then
  etcd_src="${TOOLS_DIR}/src/etcd"
  mkdir -p "${etcd_src}" && cd "${etcd_src}"
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module mtrl.local/etcd\n\ngo 1.24.0\n' > go.mod
  log "building etcd ${ETCD_VERSION}"
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null
  go mod tidy >/dev/null
  go build -ldflags "-s -w" -o "${BIN}/etcd.tmp" . && mv "${BIN}/etcd.tmp" "${BIN}/etcd"
fi

# --- helm: its own module, so its k8s.io versions never meet ours. `go install` alone leaves
# helm's version empty and its default Kubernetes version at v1.20, so `helm template` without
# --kube-version fails a chart's `kubeVersion: >=1.30`. helm's own Makefile sets both with -X:
# internal/version.version, and chartutil/lint rules' k8sVersionMajor/Minor from the client-go
# it requires (v0.34.x -> 1.34).
if ! helm_current; then
  log "building helm ${HELM_VERSION}"
  helm_mod=$(go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  client_go=$(awk '$1 == "k8s.io/client-go" {print $2}' "${helm_mod}")
  [ -n "${client_go}" ] || { echo "no k8s.io/client-go in ${helm_mod}" >&2; exit 1; }
  client_go="${client_go#v}"
  k8s_major=$(( ${client_go%%.*} + 1 ))
  k8s_minor=$(echo "${client_go}" | cut -d. -f2)
  h=helm.sh/helm/v3
  helm_ldflags="-s -w -X ${h}/internal/version.version=${HELM_VERSION}"
  helm_ldflags+=" -X ${h}/internal/version.metadata= -X ${h}/internal/version.gitTreeState=clean"
  for pkg in pkg/chartutil pkg/lint/rules; do
    helm_ldflags+=" -X ${h}/${pkg}.k8sVersionMajor=${k8s_major}"
    helm_ldflags+=" -X ${h}/${pkg}.k8sVersionMinor=${k8s_minor}"
  done
  GOBIN="${TOOLS_DIR}/src/helm-bin" go install -ldflags "${helm_ldflags}" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  mv "${TOOLS_DIR}/src/helm-bin/helm" "${BIN}/helm"
  printf '%s\n' "${HELM_RECIPE}" > "${BIN}/helm.stamp"
fi

# --- CoreDNS: a main of our own that registers only COREDNS_PLUGINS, in this order.
if ! coredns_current; then
  log "building coredns ${COREDNS_VERSION}"
  coredns_src="${TOOLS_DIR}/src/coredns"
  mkdir -p "${coredns_src}" && cd "${coredns_src}"
  {
    echo "// CoreDNS with only the plug-ins a cluster's DNS needs."
    echo "package main"
    echo
    echo "import ("
    echo '	"github.com/coredns/coredns/core/dnsserver"'
    echo '	"github.com/coredns/coredns/coremain"'
    for p in "${COREDNS_PLUGINS[@]}"; do echo "	_ \"github.com/coredns/coredns/plugin/${p}\""; done
    echo ")"
    echo
    printf 'func init() { dnsserver.Directives = []string{'
    printf '"%s", ' "${COREDNS_PLUGINS[@]}"
    echo '} }'
    echo
    echo "func main() { coremain.Run() }"
  } > main.go
  printf 'module mtrl.local/coredns\n\ngo 1.24.0\n' > go.mod
  go get "github.com/coredns/coredns@${COREDNS_VERSION}" >/dev/null
  go mod tidy >/dev/null
  go build -ldflags "-s -w" -o "${BIN}/coredns.tmp" . && mv "${BIN}/coredns.tmp" "${BIN}/coredns"
  printf '%s\n' "${COREDNS_RECIPE}" > "${BIN}/coredns.stamp"
fi

have_all || { echo "build incomplete in ${BIN}" >&2; exit 1; }
echo "${BIN}"
