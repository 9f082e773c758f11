#!/usr/bin/env bash
# Builds the real third-party controllers the test bed runs, from their Go modules, once per
# machine, with what they serve from the same module:
#
#   training-operator.v1  github.com/kubeflow/training-operator  (PyTorchJob: binary and CRDs)
#   kueue                 sigs.k8s.io/kueue                     (binary; its config/default
#                                                                 rendered by kubectl kustomize)
#
# Each lands in ~/.cache/mtrl/controllers/<name>-<version>/ (a new version builds a new
# folder; a warm cache makes this a no-op). Prints `<name>=<folder>` for each, one per line.
# mtrl_testbed.training_operator and mtrl_testbed.kueue start them on the local control plane.
set -euo pipefail

TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.9.3}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
ROOT="${HOME}/.cache/mtrl/controllers"
TO_DIR="${ROOT}/training-operator-${TRAINING_OPERATOR_VERSION}"
KUEUE_DIR="${ROOT}/kueue-${KUEUE_VERSION}"
log() { echo "[build-controllers $(date +%T)] $*" >&2; }
need_go() { command -v go >/dev/null || { echo "go toolchain not found; install Go >= 1.24" >&2; exit 1; }; }
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# go install into a private folder, then a rename: a cut build never leaves half a binary.
install_bin() {  # <dest dir> <package@version> [ldflags]
  local tmp
  mkdir -p "$1"
  tmp=$(mktemp -d "$1/.build.XXXXXX")
  CGO_ENABLED=0 GOBIN="${tmp}" nice go install -trimpath -ldflags "-s -w ${3:-}" "$2"
  mv "${tmp}"/* "$1/" && rmdir "${tmp}"
}

if [ ! -x "${TO_DIR}/bin/training-operator.v1" ] || [ ! -s "${TO_DIR}/crds/kubeflow.org_pytorchjobs.yaml" ]; then
  need_go
  mod=github.com/kubeflow/training-operator
  log "building ${mod} ${TRAINING_OPERATOR_VERSION} (about 3 minutes cold on 2 cores)"
  mkdir -p "${TO_DIR}/crds"
  # The standalone overlay's CRDs are these files, unpatched.
  install -m 0644 "$(module_dir "${mod}@${TRAINING_OPERATOR_VERSION}")"/manifests/base/crds/kubeflow.org_*.yaml \
    "${TO_DIR}/crds/"
  install_bin "${TO_DIR}/bin" "${mod}/cmd/training-operator.v1@${TRAINING_OPERATOR_VERSION}"
fi

if [ ! -x "${KUEUE_DIR}/bin/kueue" ] || [ ! -s "${KUEUE_DIR}/manifests.yaml" ]; then
  need_go
  mod=sigs.k8s.io/kueue
  kubectl="$(bash "$(dirname "$0")/build-tools.sh" | tail -1)/kubectl"
  log "building ${mod} ${KUEUE_VERSION} (about 6 minutes cold on 2 cores)"
  mkdir -p "${KUEUE_DIR}"
  # What its release installs (CRDs, webhook configurations, ...), as its Makefile renders it.
  "${kubectl}" kustomize "$(module_dir "${mod}@${KUEUE_VERSION}")/config/default" \
    > "${KUEUE_DIR}/manifests.yaml.tmp"
  mv "${KUEUE_DIR}/manifests.yaml.tmp" "${KUEUE_DIR}/manifests.yaml"
  install_bin "${KUEUE_DIR}/bin" "${mod}/cmd/kueue@${KUEUE_VERSION}" \
    "-X ${mod}/pkg/version.GitVersion=${KUEUE_VERSION}"
fi
echo "training-operator=${TO_DIR}"
echo "kueue=${KUEUE_DIR}"
