"""The runs' children, cached from label-selected watches: trainer workloads, worker
Deployments and progress ConfigMaps, by the UID of the run that owns them.

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
from mtrl_operator.errors import NotServed
from mtrl_operator.naming import LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_RUN_UID, MANAGED_BY

log = logging.getLogger("mtrl.children")

TRAINER_KINDS = ("Job", "PyTorchJob", "HyperPodPyTorchJob")
WATCHED = (*((kind, "trainer") for kind in TRAINER_KINDS), ("Deployment", "worker"),
           ("ConfigMap", "progress"))


def _version(obj: dict[str, Any]) -> str | None:
    return obj["metadata"].get("resourceVersion")


def _run_uid(obj: dict[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN_UID, "")


class Children:
    def __init__(self, kube: Kube, scopes: list[str], changed: Callable[[str], None]) -> None:
        """`changed(run_uid)` is called whenever one of that run's children changes."""
        self.kube = kube
        self.scopes = scopes
        self.changed = changed
        self.trainers: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # (kind, name)
        self.deployments: dict[str, dict[str, Any]] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._unsynced = {(kind, ns) for kind, _ in WATCHED for ns in scopes}

    def watches(self) -> list[asyncio.Task[None]]:
        # Namespaced RBAC allows only per-namespace watches; globs need a cluster-wide one.
        return [asyncio.create_task(self._watch(kind, component, ns))
                for kind, component in WATCHED for ns in self.scopes]

    def forget(self, uid: str) -> None:
        """The run is gone: so is everything cached for it."""
        for cache in (self.trainers, self.deployments, self.progress):
            cache.pop(uid, None)

    # ------------------------------------------------------------------ events in

    def on_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        uid = _run_uid(obj)
        if not uid:
            return
        name = obj["metadata"]["name"]
        gone = event_type == "DELETED"
        if kind in TRAINER_KINDS:
            if gone:  # never a new entry: a late DELETED after the run's own would leak one
                trainers = self.trainers.get(uid, {})
                trainers.pop((kind, name), None)
                if not trainers:
                    self.trainers.pop(uid, None)
            else:
                self.trainers.setdefault(uid, {})[(kind, name)] = obj
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
        present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs}
        for obj in self._cached(kind):
            meta = obj["metadata"]
            if namespace in ("*", meta["namespace"]) and \
                    (meta["namespace"], meta["name"]) not in present:
                self.on_event(kind, "DELETED", obj)
        for obj in objs:  # a relist every few minutes must not wake every run
            cached = self._cached_one(kind, obj)
            if cached is None or _version(cached) != _version(obj):
                self.on_event(kind, "ADDED", obj)

    def _cached(self, kind: str) -> list[dict[str, Any]]:
        if kind in TRAINER_KINDS:
            return [obj for objs in self.trainers.values()
                    for (kind_, _), obj in objs.items() if kind_ == kind]
        return list((self.deployments if kind == "Deployment" else self.progress).values())

    def _cached_one(self, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        uid = _run_uid(obj)
        if kind in TRAINER_KINDS:
            return self.trainers.get(uid, {}).get((kind, obj["metadata"]["name"]))
        return (self.deployments if kind == "Deployment" else self.progress).get(uid)

    # ------------------------------------------------------------------ watches

    def _listed_once(self, kind: str, namespace: str) -> None:
        self._unsynced.discard((kind, namespace))
        if not self._unsynced and not self.synced.is_set():
            log.info("child caches listed; reconciling")
            self.synced.set()

    async def _watch(self, kind: str, component: str, namespace: str) -> None:
        """A watch that was cut resumes with a new list: the events of the gap are lost for
        good, and a missed DELETED would leave a child in the cache forever (a teardown
        waiting on it would never end)."""
        labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: component}
        absent_for = 0.0  # an uninstalled kind is looked for again after 5 s, 10 s, ... 60 s
        while True:
            try:
                async for event, objs in self.kube.list_and_watch(kind, labels, namespace):
                    if event == "LISTED":
                        absent_for = 0.0
                        self.on_listed(kind, namespace, objs)
                        self._listed_once(kind, namespace)
                    else:
                        self.on_event(kind, event, objs[0])
            except asyncio.CancelledError:
                raise
            except NotServed:  # e.g. no PyTorchJob CRD (yet) in this cluster
                self._listed_once(kind, namespace)  # nothing of a kind not served can exist
                absent_for = min(60.0, max(5.0, 2 * absent_for))
                log.info("%s is not served here; looking again in %.0fs", kind, absent_for)
                await asyncio.sleep(absent_for)
                continue
            except Exception as exc:  # a cut stream or a version too old (410): list again
                log.warning("watch of %s ended: %r", kind, exc)
            await asyncio.sleep(1)
