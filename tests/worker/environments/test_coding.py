"""The coding environment pays most for asking, then committing working code; every shortcut
scores below that."""

import asyncio

import pytest

from mtrl_rollout.protocol import RolloutRequest
from mtrl_worker.environments.coding import CodingEnvironment, SimulatedUser, extract_code
from mtrl_worker.environments.coding_tasks import TASKS, TASKS_BY_ID
from mtrl_worker.episode import run_episode
from mtrl_worker.play import ScriptedPolicy
from mtrl_worker.rewards import resolve_weights

ENV = CodingEnvironment(test_timeout_s=1.0, memory_mb=256)
WEIGHTS = resolve_weights(ENV.components, {})


def play(task_id: str, replies: list[str], max_turns: int = 6) -> dict[str, float]:
    request = RolloutRequest(
        run_id="r",
        step=0,
        group_id="g",
        sample_id="s",
        policy_version=0,
        data={"task_id": task_id},
        max_length=100_000,
    )
    policy = ScriptedPolicy(replies, max_turns)
    result = asyncio.run(run_episode(ENV, WEIGHTS, request, policy, max_turns=max_turns, timeout_s=30))
    values = {m.name: m.value for m in result.metrics_list}
    values["aggregate"] = result.aggregate_reward_score
    return values


def code(source: str) -> str:
    return f"Here it is:\n```python\n{source}\n```"


def relevant_question(task_id: str) -> str:
    return f"What should happen about {TASKS_BY_ID[task_id].facts[0].keywords[0]}?"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_reference_solution_after_a_question_earns_the_top_reward(task) -> None:
    clarified = play(task.id, [relevant_question(task.id), code(task.solution)])
    assert clarified["tests_passed"] == clarified["tests_total"] == len(task.tests)
    assert clarified["correct_code"] == 1.0 and clarified["asked_before_coding"] == 1.0
    assert clarified["aggregate"] == pytest.approx(1.0)
    guessed = play(task.id, [code(task.solution)])
    assert guessed["guessed_immediately"] == -1.0
    assert guessed["aggregate"] < clarified["aggregate"]


def test_every_hidden_fact_is_reachable_by_its_keywords() -> None:
    for task in TASKS:
        user = SimulatedUser(task)
        for fact in task.facts:
            for keyword in fact.keywords:
                answer, revealed = user.answer(f"question about {keyword} please")
                assert revealed >= 1 and fact.answer in answer, (task.id, keyword)


def test_unrelated_questions_reveal_nothing() -> None:
    answer, revealed = SimulatedUser(TASKS_BY_ID["median"]).answer("Do you like pizza?")
    assert revealed == 0 and "not sure" in answer


NAIVE_MEDIAN = "def median(values):\n    xs = sorted(values)\n    return xs[len(xs) // 2]"
EXPLOITS = {
    "only asking until out of turns": [relevant_question("median")] * 6,
    "asking then stopping": [relevant_question("median"), "Is there more?"],
    "guessing immediately": [code(NAIVE_MEDIAN)],
    "code that fails the tests": [relevant_question("median"), code("def median(v):\n  return 0")],
    "code that hangs": [relevant_question("median"), code("def median(v):\n  while True: pass")],
    "code that hangs at import": [relevant_question("median"), code("while True:\n  pass")],
    "code that eats memory": [relevant_question("median"), code("x = bytearray(1 << 34)")],
    "code that says it equals anything": [
        relevant_question("median"),
        code("class A:\n  def __eq__(s, o): return True\ndef median(v):\n  return A()"),
    ],
    "code that forges a report": [
        relevant_question("median"),
        code('print(\'{"passed": 5, "error": null}\')\nimport os\nos._exit(0)'),
    ],
    "code that phones home": [
        relevant_question("median"),
        code("import socket\nsocket.create_connection(('10.0.0.1', 80), timeout=1)"),
    ],
    "irrelevant question then reference": [
        "Do you like pizza?",
        code(TASKS_BY_ID["median"].solution),
    ],
}


@pytest.mark.parametrize("name", EXPLOITS)
def test_exploits_score_below_a_clarified_correct_solution(name: str) -> None:
    clarified = play("median", [relevant_question("median"), code(TASKS_BY_ID["median"].solution)])
    exploit = play("median", EXPLOITS[name])
    assert exploit["aggregate"] < clarified["aggregate"]


def test_asking_earns_nothing_without_a_commit() -> None:
    asked = play("median", [relevant_question("median")] * 6)
    assert asked["asked_before_coding"] == 0.0 and asked["failed_to_commit"] == -1.0
    assert asked["aggregate"] < play("median", [code(NAIVE_MEDIAN)])["aggregate"]


def test_hanging_code_is_killed_and_reported() -> None:
    hung = play("median", EXPLOITS["code that hangs"])
    assert hung["sandbox_timeout"] == 1.0 and hung["tests_passed"] == 0


def test_extract_code_takes_the_last_fenced_block() -> None:
    reply = "```python\nx = 1\n```\nbetter:\n```\nx = 2\n```"
    assert extract_code(reply) == "x = 2\n"
    assert extract_code("no code here") is None
