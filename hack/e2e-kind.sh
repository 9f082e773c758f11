#!/usr/bin/env bash
# `make e2e-kind`: the demo on a kind cluster, for people with a Docker engine.
#
# Builds the three images, loads them into kind, runs moto in the cluster as the AWS endpoint,
# installs the chart, applies the tiny CPU run with the images and endpoint filled in, waits
# for it to succeed, and uninstalls. Needs docker, kind, kubectl and helm on PATH.
# CI does not run it: CI's machines have a Docker engine (hack/docker.sh) but reach no image
# registry, and kind needs its node image (`kindest/node`, pulled) or, to build one, Kubernetes'
# release tarballs and the `kindest/base` image, none of which can be fetched there (the exact
# errors are in docs/kubelet.md). tests/kubelet runs the same end to end on a real kubelet and
# containerd joined to the test bed's control plane instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER="${KIND_CLUSTER:-mtrl-e2e}"
TAG="${TAG:-e2e}"
MOTO_IMAGE="${MOTO_IMAGE:-motoserver/moto:5.1.0}"
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind needs $tool on PATH" >&2; exit 1; }
done

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kubectl config use-context "kind-$CLUSTER"
for image in operator worker trainer; do
  docker build -f "images/$image/Dockerfile" -t "mtrl-$image:$TAG" .
  kind load docker-image "mtrl-$image:$TAG" --name "$CLUSTER"
done
# The kind node plays a HyperPod p5 node for the trainer's node affinity.
kubectl label nodes --all --overwrite node.kubernetes.io/instance-type=ml.p5.48xlarge \
  sagemaker.amazonaws.com/node-health-status=Schedulable

kubectl create namespace mtrl-system --dry-run=client -o yaml | kubectl apply -f -
kubectl -n mtrl-system create deployment moto --image="$MOTO_IMAGE" --port=5000 \
  --dry-run=client -o yaml | kubectl apply -f -
kubectl -n mtrl-system expose deployment moto --port=5000 --dry-run=client -o yaml | kubectl apply -f -
kubectl -n mtrl-system rollout status deployment/moto --timeout=180s
ENDPOINT="http://moto.mtrl-system.svc:5000"
AWS_ENV='[{"name":"AWS_ENDPOINT_URL","value":"'"$ENDPOINT"'"},{"name":"AWS_ACCESS_KEY_ID","value":"testing"},{"name":"AWS_SECRET_ACCESS_KEY","value":"testing"},{"name":"AWS_REGION","value":"us-west-2"}]'

helm upgrade --install mtrl-operator charts/mtrl-operator -n mtrl-system --wait --timeout 300s \
  --set image.repository=mtrl-operator --set image.tag="$TAG" --set image.pullPolicy=Never \
  --set-json "operator.extraEnv=$AWS_ENV"

# The run's output bucket, made with the worker image's boto3.
kubectl -n default run make-bucket --rm -i --restart=Never --image="mtrl-worker:$TAG" \
  --image-pull-policy=Never --overrides='{"spec":{"containers":[{"name":"make-bucket","image":"mtrl-worker:'"$TAG"'","imagePullPolicy":"Never","env":'"$AWS_ENV"',"command":["python","-c","import boto3; boto3.client(\"s3\").create_bucket(Bucket=\"mtrl-demo\", CreateBucketConfiguration={\"LocationConstraint\": \"us-west-2\"})"]}]}}'

"${PYTHON:-.venv/bin/python}" - "$TAG" "$AWS_ENV" <<'PY' | kubectl apply -f -
import json, sys
import yaml
tag, env = sys.argv[1], json.loads(sys.argv[2])
run = yaml.safe_load(open("manifests/examples/tiny-cpu.yaml"))
spec = run["spec"]
spec["trainer"].update(image=f"mtrl-trainer:{tag}", env=env)
spec["workers"].update(image=f"mtrl-worker:{tag}", env=env)
print(json.dumps(run))
PY
kubectl wait --for=jsonpath='{.status.phase}'=Succeeded mtrlrun/tiny-target --timeout=900s
kubectl get mtrlruns
helm uninstall mtrl-operator -n mtrl-system --wait --timeout 300s
echo "e2e-kind passed; delete the cluster with: kind delete cluster --name $CLUSTER"
