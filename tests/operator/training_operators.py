"""A stand-in for the SageMaker HyperPod training operator (HyperPodPyTorchJob) on the test bed,
as far as this project relies on it.

HyperPod's operator is a closed EKS add-on; Kubeflow's training operator (PyTorchJob) runs for
real on the test bed (`mtrl_testbed.training_operator`). The stand-in does what the sources say
HyperPod does with a job this operator creates, and what Kubeflow's controller does where the
two share behaviour:
- creates one pod per replica from the job's pod templates, owned by the job (so Kubernetes'
  garbage collector removes them with it);
- appends conditions: `Created`, `Running` once every pod runs, and at the end `Completed`, or
  `Failed`;
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

HyperPodPyTorchJob = create_namespaced_resource("sagemaker.amazonaws.com", "v1",
                                                "HyperPodPyTorchJob", "hyperpodpytorchjobs")
JOB_LABEL = "standin.mtrl.dev/job"
DONE = "Completed"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _replicas(job: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(replica name, count, pod template) per replica spec."""
    return [(r["name"], r.get("replicas", 1), r["template"]) for r in job["spec"]["replicaSpecs"]]


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
            try:
                for obj in self.client.list(HyperPodPyTorchJob, namespace=self.namespace):
                    self._reconcile(HyperPodPyTorchJob, obj.to_dict())
            except ApiError as exc:
                if exc.status.code not in (404, 409):  # kind not installed, or a race
                    self.errors.append(repr(exc))
            except Exception as exc:  # reported by the test, never a silently dead thread
                self.errors.append(repr(exc))

    def _reconcile(self, resource: Any, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        self.seen[meta["uid"]] = meta["name"]
        conditions = list((job.get("status") or {}).get("conditions") or [])
        types = [c["type"] for c in conditions]
        if DONE in types or "Failed" in types:
            return
        pods = [p.to_dict() for p in self.client.list(
            Pod, namespace=self.namespace, labels={JOB_LABEL: meta["name"]})]
        if not conditions:
            self._create_pods(job)
            self._set(resource, meta["name"], conditions, "Created")
            return
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        if pods and "Failed" in phases:
            self._finish(resource, meta["name"], conditions, "Failed")
        elif pods and all(ph == "Succeeded" for ph in phases):
            self._finish(resource, meta["name"], conditions, DONE)
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

    def _create_pods(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
        for rtype, count, template in _replicas(job):
            for index in range(count):
                labels = {**(template.get("metadata") or {}).get("labels", {}),
                          JOB_LABEL: meta["name"]}
                self.client.create(Pod.from_dict({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{meta['name']}-{rtype.lower()}-{index}",
                                 "namespace": self.namespace, "labels": labels,
                                 "annotations": (template.get("metadata") or {}).get(
                                     "annotations", {}),
                                 "ownerReferences": [owner]},
                    "spec": template["spec"]}))
