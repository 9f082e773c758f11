"""Stand-ins for the Kubeflow training operator (PyTorchJob) and the SageMaker HyperPod training
operator (HyperPodPyTorchJob) on the test bed, as far as this project relies on them.

Neither runs here: Kubeflow's needs its images, HyperPod's is a closed EKS add-on. The stand-in
does what their sources say they do with a job this operator creates:
- creates one pod per replica from the job's pod templates, owned by the job (so Kubernetes'
  garbage collector removes them with it); for a PyTorchJob with Kubeflow's rendezvous
  variables (training-operator pkg/controller.v1/pytorch/envvar.go);
- appends conditions as each controller does: `Created`, `Running` once every pod runs, and at
  the end `Succeeded` (Kubeflow) or `Completed` (HyperPod), or `Failed`;
- with `delete_finished=True`, deletes a finished job at once, which is what HyperPod does with
  `runPolicy.ttlSecondsAfterFinished: 0`, the HyperPod CLI model's default. With
  `report_finish=False` it deletes it without a last condition, as if this operator's watch
  had missed it.
The node agent then runs the pods' commands (the stand-in trainer in these tests).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType, PatchType

from mtrl_testbed.cluster import LocalCluster

PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
HyperPodPyTorchJob = create_namespaced_resource("sagemaker.amazonaws.com", "v1",
                                                "HyperPodPyTorchJob", "hyperpodpytorchjobs")
JOB_LABEL = "standin.mtrl.dev/job"
DONE = {"PyTorchJob": "Succeeded", "HyperPodPyTorchJob": "Completed"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _replicas(kind: str, job: dict[str, Any]) -> list[tuple[str, int, dict[str, Any], str | None]]:
    """(replica type, count, pod template, replica restartPolicy) per replica spec."""
    spec = job["spec"]
    if kind == "PyTorchJob":
        return [(rtype, r.get("replicas", 1), r["template"], r.get("restartPolicy"))
                for rtype, r in spec["pytorchReplicaSpecs"].items()]
    return [(r["name"], r.get("replicas", 1), r["template"], None) for r in spec["replicaSpecs"]]


class StandInTrainingOperators:
    def __init__(self, cluster: LocalCluster, namespace: str, *, delete_finished: bool = False,
                 report_finish: bool = True) -> None:
        self.client = Client(KubeConfig.from_file(str(cluster.kubeconfig)),
                             field_manager="standin-training-operator")
        self.namespace = namespace
        self.delete_finished = delete_finished
        self.report_finish = report_finish
        self.seen: dict[str, str] = {}  # job uid -> name: every job ever created
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> StandInTrainingOperators:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            for resource in (PyTorchJob, HyperPodPyTorchJob):
                try:
                    for obj in self.client.list(resource, namespace=self.namespace):
                        self._reconcile(resource, obj.to_dict())
                except ApiError as exc:
                    if exc.status.code not in (404, 409):  # kind not installed, or a race
                        self.errors.append(repr(exc))
                except Exception as exc:  # reported by the test, never a silently dead thread
                    self.errors.append(repr(exc))

    def _reconcile(self, resource: Any, job: dict[str, Any]) -> None:
        kind, meta = job["kind"], job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        self.seen[meta["uid"]] = meta["name"]
        conditions = list((job.get("status") or {}).get("conditions") or [])
        types = [c["type"] for c in conditions]
        if DONE[kind] in types or "Failed" in types:
            return
        pods = [p.to_dict() for p in self.client.list(
            Pod, namespace=self.namespace, labels={JOB_LABEL: meta["name"]})]
        if not conditions:
            self._create_pods(kind, job)
            self._set(resource, meta["name"], conditions, "Created")
            return
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        if pods and "Failed" in phases:
            self._finish(resource, meta["name"], conditions, "Failed")
        elif pods and all(ph == "Succeeded" for ph in phases):
            self._finish(resource, meta["name"], conditions, DONE[kind])
        elif pods and "Running" not in types and all(ph in ("Running", "Succeeded")
                                                     for ph in phases):
            self._set(resource, meta["name"], conditions, "Running")

    def _finish(self, resource: Any, name: str, conditions: list[dict[str, Any]],
                type_: str) -> None:
        if self.report_finish:
            self._set(resource, name, conditions, type_)
        if self.delete_finished:
            self.client.delete(resource, name, namespace=self.namespace,
                               cascade=CascadeType.BACKGROUND)

    def _set(self, resource: Any, name: str, conditions: list[dict[str, Any]],
             type_: str) -> None:
        now = _now()
        conditions = [{**c, "status": "False"} if c["type"] == "Running" and type_ != "Running"
                      else c for c in conditions]
        conditions.append({"type": type_, "status": "True", "reason": type_,
                           "message": f"job {type_.lower()} (stand-in)",
                           "lastTransitionTime": now})
        self.client.patch(resource.Status, name, {"status": {"conditions": conditions}},
                          namespace=self.namespace, patch_type=PatchType.MERGE)

    def _create_pods(self, kind: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        owner = {"apiVersion": job["apiVersion"], "kind": kind, "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
        replicas = _replicas(kind, job)
        total = sum(count for _, count, _, _ in replicas)
        rank = 0
        for rtype, count, template, restart in replicas:
            for index in range(count):
                pod_spec = dict(template["spec"])
                if restart:
                    pod_spec["restartPolicy"] = restart
                if kind == "PyTorchJob":
                    extra = [{"name": "MASTER_ADDR", "value": f"{meta['name']}-master-0"},
                             {"name": "MASTER_PORT", "value": "29500"},
                             {"name": "WORLD_SIZE", "value": str(total)},
                             {"name": "RANK", "value": str(rank)},
                             {"name": "PET_NODE_RANK", "value": str(rank)},
                             {"name": "PET_NNODES", "value": str(total)}]
                    pod_spec["containers"] = [{**c, "env": [*c.get("env", []), *extra]}
                                              for c in pod_spec["containers"]]
                labels = {**(template.get("metadata") or {}).get("labels", {}),
                          JOB_LABEL: meta["name"]}
                self.client.create(Pod.from_dict({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{meta['name']}-{rtype.lower()}-{index}",
                                 "namespace": self.namespace, "labels": labels,
                                 "annotations": (template.get("metadata") or {}).get(
                                     "annotations", {}),
                                 "ownerReferences": [owner]},
                    "spec": pod_spec}))
                rank += 1
