#!/usr/bin/env bash
# Builds the real third-party controllers the test bed runs, from their Go modules, once per
# machine, and copies the CRDs they serve from the same module:
#
#   training-operator.v1   github.com/kubeflow/training-operator  (PyTorchJob and its kin)
#
# They land in ~/.cache/mtrl/controllers-<versions>/{bin,crds} (a new version builds a new
# folder; a warm cache makes this a no-op). Prints the folder on its last line.
# mtrl_testbed.training_operator starts them against the local control plane.
set -euo pipefail

TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.9.3}"
KEY="training-operator-${TRAINING_OPERATOR_VERSION}"
DIR="${HOME}/.cache/mtrl/controllers-${KEY}"
log() { echo "[build-controllers $(date +%T)] $*" >&2; }

if [ ! -x "${DIR}/bin/training-operator.v1" ] || [ ! -s "${DIR}/crds/kubeflow.org_pytorchjobs.yaml" ]; then
  command -v go >/dev/null || { echo "go toolchain not found; install Go >= 1.24" >&2; exit 1; }
  mod=github.com/kubeflow/training-operator
  mkdir -p "${DIR}/bin" "${DIR}/crds"
  log "building ${mod} ${TRAINING_OPERATOR_VERSION} (about 3 minutes cold on 2 cores)"
  tmp=$(mktemp -d "${DIR}/bin.XXXXXX")
  CGO_ENABLED=0 GOBIN="${tmp}" nice go install -trimpath -ldflags "-s -w" \
    "${mod}/cmd/training-operator.v1@${TRAINING_OPERATOR_VERSION}"
  src=$(go mod download -json "${mod}@${TRAINING_OPERATOR_VERSION}" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  # The standalone overlay's CRDs are these files, unpatched.
  for f in "${src}"/manifests/base/crds/kubeflow.org_*.yaml; do
    install -m 0644 "${f}" "${DIR}/crds/"
  done
  mv "${tmp}/training-operator.v1" "${DIR}/bin/training-operator.v1" && rmdir "${tmp}"
fi
echo "${DIR}"
