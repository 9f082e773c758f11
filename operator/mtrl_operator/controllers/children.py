"""The runs' children, cached from label-selected watches: trainer workloads, worker
Deployments, progress ConfigMaps and the pods of both, by the UID of the run that owns them;
and the cluster's nodes, for preflight. A reconcile reads these instead of listing (all but a
failed trainer's pods, read once per failed attempt), so its cost stays flat however many runs
there are (docs/scale.md).

Each watch is an informer: list, then watch from the list's version; when the watch ends, list
again, and a fresh list is the truth for its kind and namespace. Until every watch has listed
once, `synced` stays unset: a reconcile that read an empty cache would take a run's trainer for
gone (and, deleting the run, release its finalizer while the trainer still runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from mtrl_operator.adapters.kube import Kube
from mtrl_operator.errors import NotPermitted, NotServed
from mtrl_operator.naming import LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_RUN_UID, MANAGED_BY

log = logging.getLogger("mtrl.children")

TRAINER_KINDS = ("Job", "PyTorchJob", "HyperPodPyTorchJob")
# (kind, component label); the pods of trainers and workers alike carry only the operator's
# managed-by label in common.
WATCHED = (*((kind, "trainer") for kind in TRAINER_KINDS), ("Deployment", "worker"),
           ("ConfigMap", "progress"), ("Pod", None))
CLUSTER = ""  # the scope of the nodes' one cluster-wide watch


def _version(obj: dict[str, Any]) -> str | None:
    return obj["metadata"].get("resourceVersion")


def _run_uid(obj: dict[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN_UID, "")


def _node(obj: dict[str, Any]) -> dict[str, Any]:
    """What preflight reads of a node (its name, labels and allocatable resources): a node's
    status also lists every image it holds, which 1,000 nodes need not keep in memory."""
    meta = obj["metadata"]
    return {"metadata": {"name": meta["name"], "labels": meta.get("labels") or {},
                         "resourceVersion": meta.get("resourceVersion")},
            "status": {"allocatable": (obj.get("status") or {}).get("allocatable") or {}}}


def _keep(cache: dict[str, dict[Any, dict[str, Any]]], uid: str, key: Any,
          obj: dict[str, Any] | None) -> None:
    """Cache one of a run's several children of a kind, or drop it (`obj` None): a drop never
    makes an entry, since a late DELETED after the run's own would leak one."""
    if obj is not None:
        cache.setdefault(uid, {})[key] = obj
    elif (children := cache.get(uid)) is not None:
        children.pop(key, None)
        if not children:
            del cache[uid]


class Children:
    def __init__(self, kube: Kube, scopes: list[str], changed: Callable[[str], None],
                 nodes: bool = True) -> None:
        """`changed(run_uid)` is called whenever one of that run's workloads or progress
        ConfigMaps changes (not its pods: a reconcile reads them when its workloads say
        something is wrong, and the resync finds what the workloads do not say). `nodes`:
        whether to watch the cluster's nodes (for preflight)."""
        self.kube = kube
        self.scopes = scopes
        self.changed = changed
        self.trainers: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # (kind, name)
        self.deployments: dict[str, dict[str, Any]] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, dict[str, Any]]] = {}  # run uid -> pod name -> pod
        # Node name -> what preflight reads (`nodes`: None when not watched, or while the
        # operator may not list them).
        self._nodes: dict[str, dict[str, Any]] | None = {} if nodes else None
        self._refused: set[str] = set()  # kinds whose last list the API server refused (403)
        self.synced = asyncio.Event()
        self._unsynced = {(kind, ns) for kind, _ in WATCHED for ns in scopes}
        if nodes:
            self._unsynced.add(("Node", CLUSTER))

    def watches(self) -> list[asyncio.Task[None]]:
        # Namespaced RBAC allows only per-namespace watches; globs need a cluster-wide one.
        tasks = [asyncio.create_task(self._watch(kind, component, ns))
                 for kind, component in WATCHED for ns in self.scopes]
        if self._nodes is not None:
            tasks.append(asyncio.create_task(self._watch("Node", None, CLUSTER)))
        return tasks

    @property
    def nodes(self) -> dict[str, dict[str, Any]] | None:
        """The cluster's nodes as preflight reads them, or None: not watched, or refused (a
        namespaced install may not list nodes; preflight then does not check them)."""
        return None if "Node" in self._refused else self._nodes

    def forget(self, uid: str) -> None:
        """The run is gone: so is everything cached for it."""
        for cache in (self.trainers, self.deployments, self.progress, self.pods):
            cache.pop(uid, None)

    def pods_of(self, uid: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """The run's cached pods that carry `labels`, in name order (as a list returns them)."""
        return [pod for _, pod in sorted((self.pods.get(uid) or {}).items())
                if labels.items() <= ((pod["metadata"].get("labels") or {}).items())]

    # ------------------------------------------------------------------ events in

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        gone = event_type == "DELETED"
        if kind == "Node":
            if self._nodes is not None:
                if gone:
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = _node(obj)
            return
        uid = _run_uid(obj)
        if not uid:
            return
        if kind == "Pod":
            obj["metadata"].pop("managedFields", None)
            _keep(self.pods, uid, name, None if gone else obj)
            return
        if kind in TRAINER_KINDS:
            _keep(self.trainers, uid, (kind, name), None if gone else obj)
        else:
            cache = self.deployments if kind == "Deployment" else self.progress
            if gone:
                cache.pop(uid, None)
            else:
                cache[uid] = obj
        self.changed(uid)

    def on_listed(self, kind: str, namespace: str, objs: list[dict[str, Any]]) -> None:
        """A fresh list is the truth for its kind and namespace ("*": all): cached children it
        lacks were deleted while no watch was open, and their runs hear of it now."""
        present = {(o["metadata"].get("namespace", CLUSTER), o["metadata"]["name"]) for o in objs}
        for obj in self._cached(kind):
            meta = obj["metadata"]
            where = meta.get("namespace", CLUSTER)
            if namespace in ("*", where) and (where, meta["name"]) not in present:
                self.on_event(kind, "DELETED", obj)
        for obj in objs:  # a relist every few minutes must not wake every run
            cached = self._cached_one(kind, obj)
            if cached is None or _version(cached) != _version(obj):
                self.on_event(kind, "ADDED", obj)

    def _cached(self, kind: str) -> list[dict[str, Any]]:
        if kind == "Node":
            return list((self._nodes or {}).values())
        if kind == "Pod":
            return [pod for pods in self.pods.values() for pod in pods.values()]
        if kind in TRAINER_KINDS:
            return [obj for objs in self.trainers.values()
                    for (kind_, _), obj in objs.items() if kind_ == kind]
        return list((self.deployments if kind == "Deployment" else self.progress).values())

    def _cached_one(self, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        uid, name = _run_uid(obj), obj["metadata"]["name"]
        if kind == "Node":
            return (self._nodes or {}).get(name)
        if kind == "Pod":
            return self.pods.get(uid, {}).get(name)
        if kind in TRAINER_KINDS:
            return self.trainers.get(uid, {}).get((kind, name))
        return (self.deployments if kind == "Deployment" else self.progress).get(uid)

    # ------------------------------------------------------------------ watches

    def _listed_once(self, kind: str, namespace: str) -> None:
        self._unsynced.discard((kind, namespace))
        if not self._unsynced and not self.synced.is_set():
            log.info("child caches listed; reconciling")
            self.synced.set()

    def _refuse(self, kind: str, namespace: str, exc: Exception) -> None:
        if kind not in self._refused:
            if kind == "Node":  # a namespaced install may not list nodes
                log.info("the operator may not list nodes; preflight does not check them "
                         "until it may")
            else:
                log.warning("the operator may not watch %s in %s (looking again): %s", kind,
                            namespace or "the cluster", exc)
        self._refused.add(kind)
        self._listed_once(kind, namespace)  # the operator works with what it may see

    def _permitted(self, kind: str) -> None:
        if kind in self._refused:
            self._refused.discard(kind)
            log.info("the operator may watch %s again", kind)

    async def _watch(self, kind: str, component: str | None, namespace: str) -> None:
        """A watch that was cut resumes with a new list: the events of the gap are lost for
        good, and a missed DELETED would leave a child in the cache forever (a teardown
        waiting on it would never end)."""
        labels: dict[str, str] = {}
        if kind != "Node":
            labels[LABEL_MANAGED_BY] = MANAGED_BY
        if component is not None:
            labels[LABEL_COMPONENT] = component
        absent_for = 0.0  # an uninstalled kind is looked for again after 5 s, 10 s, ... 60 s
        refused_for = 0.0  # a refused one after 1 s, 2 s, ... 60 s
        while True:
            try:
                async for event, objs in self.kube.list_and_watch(kind, labels, namespace):
                    if event == "LISTED":
                        absent_for = refused_for = 0.0
                        self._permitted(kind)
                        self.on_listed(kind, namespace, objs)
                        self._listed_once(kind, namespace)
                    else:
                        self.on_event(kind, event, objs[0])
            except asyncio.CancelledError:
                raise
            except NotPermitted as exc:
                # Not always for good: an API server that has just restarted refuses every
                # request until its authorizer has read the RBAC objects (seen here for about
                # a second after a restart). So look again, with backoff, as client-go's
                # reflector does; meanwhile the cache keeps what it had.
                self._refuse(kind, namespace, exc)
                refused_for = min(60.0, max(1.0, 2 * refused_for))
                await asyncio.sleep(refused_for)
                continue
            except NotServed:  # e.g. no PyTorchJob CRD (yet) in this cluster
                self._listed_once(kind, namespace)  # nothing of a kind not served can exist
                absent_for = min(60.0, max(5.0, 2 * absent_for))
                log.info("%s is not served here; looking again in %.0fs", kind, absent_for)
                await asyncio.sleep(absent_for)
                continue
            except Exception as exc:  # a cut stream or a version too old (410): list again
                log.warning("watch of %s ended: %r", kind, exc)
            await asyncio.sleep(1)
