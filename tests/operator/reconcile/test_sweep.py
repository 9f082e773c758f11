"""What the orphan sweepers may delete (`reconcile.sweep.plan_sweep`), from tags alone."""

from __future__ import annotations

from collections.abc import Callable

from mtrl_operator.reconcile.sweep import Owner, SweepPlan, Tagged, plan_sweep
from mtrl_rollout.queues import TAG_RUN_UID, resource_tags

OWNER = Owner("default", "cluster-a")


def _tags(uid: str, namespace: str = "ns", operator_id: str = "default",
          cluster_id: str = "cluster-a") -> dict[str, str]:
    return resource_tags(uid, namespace, "run", "queue", operator_id, cluster_id)


def _plan(tagged: list[Tagged], known: set[str] | None = None,
          first_seen: dict[str, float] | None = None, now: float = 1000.0,
          min_age: float = 600.0, watches: Callable[[str], bool] = lambda ns: True) -> SweepPlan:
    return plan_sweep(tagged, owner=OWNER, uid_tag=TAG_RUN_UID, known=known or set(),
                      watches=watches, first_seen=first_seen or {}, now=now, min_age=min_age)


def test_only_what_this_operator_made_in_this_cluster_is_an_orphan() -> None:
    tagged: list[Tagged] = [("a", _tags("u1")), ("b", _tags("u2", cluster_id="cluster-b")),
              ("c", _tags("u3", operator_id="prod")), ("d", _tags("u4", cluster_id="")),
              ("e", {TAG_RUN_UID: "u5"})]
    plan = _plan(tagged, min_age=0)
    assert [arn for arn, _ in plan.delete] == ["a"]
    assert set(plan.first_seen) == {"a"}


def test_a_run_that_exists_or_a_namespace_not_watched_keeps_its_resources() -> None:
    tagged: list[Tagged] = [("a", _tags("u1")), ("b", _tags("u2", namespace="team-b"))]
    plan = _plan(tagged, known={"u1"}, min_age=0, watches=lambda ns: ns != "team-b")
    assert plan.delete == [] and plan.first_seen == {}


def test_an_orphan_waits_the_minimum_age_from_its_first_sighting() -> None:
    first = _plan([("a", _tags("u1"))], now=1000.0)
    assert first.delete == [] and first.first_seen == {"a": 1000.0}
    early = _plan([("a", _tags("u1"))], first_seen=first.first_seen, now=1599.0)
    assert early.delete == [] and early.first_seen == {"a": 1000.0}
    due = _plan([("a", _tags("u1"))], first_seen=early.first_seen, now=1600.0)
    assert [arn for arn, _ in due.delete] == ["a"]


def test_a_sighting_is_forgotten_once_its_run_reappears_or_it_is_gone() -> None:
    plan = _plan([("a", _tags("u1"))], known={"u1"}, first_seen={"a": 0.0, "gone": 0.0})
    assert plan.first_seen == {}


def test_an_owner_without_a_cluster_identity_owns_nothing() -> None:
    assert not Owner("default", "").made(_tags("u1", cluster_id=""))
