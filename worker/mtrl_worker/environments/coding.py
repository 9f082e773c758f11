"""Collaborative coding with a simulated user who knows a hidden spec.

Each turn the policy either asks a question (plain text) or commits a solution (a fenced code
block), which ends the episode. The rule-based user answers questions by keyword against the
hidden facts. The reward is built so that the only way to the top is to ask a relevant question
and then commit working code:
- `correct_code`: fraction of hidden unit tests passed in the sandbox;
- `asked_before_coding`: 1 only if code was committed after a question that hit a hidden fact,
  so asking without committing earns nothing (no endless-questions exploit);
- `guessed_immediately` (penalty): committing on the first turn without asking;
- `failed_to_commit` (penalty): never committing.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from mtrl_api.environments import Parameter, TaskField
from mtrl_rollout.protocol import ChatMessage
from mtrl_worker.environments.base import Environment, Episode, EpisodeLimits, Policy
from mtrl_worker.environments.coding_tasks import TASKS_BY_ID, CodingTask
from mtrl_worker.environments.sandbox import SandboxResult, run_tests
from mtrl_worker.rewards import RewardComponent, Score

SYSTEM_PROMPT = (
    "You are pairing with a user on a small Python function. The description is incomplete: "
    "ask the user clarifying questions in plain text, one turn at a time. When you are ready, "
    "reply with the complete solution in one ```python fenced block; that commits it and ends "
    "the session. You have {turns} turns."
)
UNKNOWN_ANSWER = "I'm not sure what you mean. Could you ask about a specific detail?"

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(reply: str) -> str | None:
    blocks = _CODE_BLOCK.findall(reply)
    return blocks[-1] if blocks else None


def _mentions(question: str, keyword: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(keyword)}(?![a-z0-9])", question) is not None


class SimulatedUser:
    def __init__(self, task: CodingTask) -> None:
        self.task = task

    def answer(self, question: str) -> tuple[str, int]:
        """The reply and how many hidden facts it revealed."""
        text = question.lower()
        hits = [f.answer for f in self.task.facts if any(_mentions(text, k) for k in f.keywords)]
        return (" ".join(hits), len(hits)) if hits else (UNKNOWN_ANSWER, 0)


class CodingEpisode(Episode):
    def __init__(self, task: CodingTask, max_turns: int, timeout_s: float, memory_mb: int) -> None:
        self.task = task
        self.user = SimulatedUser(task)
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.questions = 0
        self.relevant_questions = 0
        self.committed_on_turn: int | None = None
        self.result: SandboxResult | None = None

    async def play(self, policy: Policy) -> None:
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT.format(turns=self.max_turns)),
            ChatMessage(role="user", content=self.task.description),
        ]
        for turn in range(self.max_turns):
            reply = (await policy.chat(messages)).text
            code = extract_code(reply)
            if code is not None:
                self.committed_on_turn = turn
                self.result = await run_tests(
                    code, list(self.task.tests), timeout_s=self.timeout_s, memory_mb=self.memory_mb
                )
                return
            answer, revealed = self.user.answer(reply)
            self.questions += 1
            self.relevant_questions += revealed > 0
            messages += [
                ChatMessage(role="assistant", content=reply),
                ChatMessage(role="user", content=answer),
            ]

    def score(self) -> Score:
        committed = self.committed_on_turn is not None
        result = self.result or SandboxResult(0, len(self.task.tests))
        return Score(
            components={
                "correct_code": result.fraction,
                "asked_before_coding": float(committed and self.relevant_questions > 0),
                "guessed_immediately": -1.0 if committed and self.questions == 0 else 0.0,
                "failed_to_commit": 0.0 if committed else -1.0,
            },
            metrics={
                "questions": float(self.questions),
                "relevant_questions": float(self.relevant_questions),
                "tests_passed": float(result.passed),
                "tests_total": float(result.total),
                "sandbox_timeout": float(result.timed_out),
            },
        )


class CodingEnvironment(Environment):
    name = "coding"
    components = (
        RewardComponent("correct_code", 1.0, 0.0, 1.0, "outcome", "Fraction of hidden unit tests passed."),
        RewardComponent(
            "asked_before_coding",
            0.3,
            0.0,
            1.0,
            "behaviour",
            "1 if code was committed after a question that hit a hidden fact.",
        ),
        RewardComponent(
            "guessed_immediately",
            0.3,
            -1.0,
            0.0,
            "penalty",
            "-1 if code was committed on the first turn without any question.",
        ),
        RewardComponent("failed_to_commit", 0.5, -1.0, 0.0, "penalty", "-1 if no code was ever committed."),
    )

    parameters = (
        Parameter(name="test_timeout_s", type="float", default=5.0, minimum=0.1, maximum=300,
                  doc="Seconds the hidden tests of a committed solution may run."),
        Parameter(name="memory_mb", type="int", default=256, minimum=32, maximum=16384,
                  doc="Memory limit of the sandbox that runs them, in MiB."),
    )
    task_fields = (
        TaskField(name="task_id", required=True, choices=sorted(TASKS_BY_ID),
                  doc="One of the built-in coding tasks."),
    )

    def __init__(self, test_timeout_s: float | str = 5.0, memory_mb: int | str = 256) -> None:
        args = self.arguments(test_timeout_s=test_timeout_s, memory_mb=memory_mb)
        self.test_timeout_s = float(args["test_timeout_s"])
        self.memory_mb = int(args["memory_mb"])

    def episode(self, task: Mapping[str, Any], limits: EpisodeLimits) -> CodingEpisode:
        task_id = str(task["task_id"])
        if task_id not in TASKS_BY_ID:
            raise ValueError(f"unknown coding task {task_id!r}; known: {sorted(TASKS_BY_ID)}")
        return CodingEpisode(TASKS_BY_ID[task_id], limits.max_turns, self.test_timeout_s, self.memory_mb)

    @classmethod
    def add_play_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--task", required=True, choices=sorted(TASKS_BY_ID))
        parser.add_argument("--ask", action="append", default=[], help="a question, in order")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--code-file", help="commit this file's code after the questions")
        group.add_argument("--reference", action="store_true", help="commit the task's reference solution")

    @classmethod
    def play_script(cls, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        replies = list(args.ask)
        code = None
        if args.reference:
            code = TASKS_BY_ID[args.task].solution
        elif args.code_file:
            with open(args.code_file) as f:
                code = f.read()
        if code is not None:
            replies.append(f"```python\n{code}```")
        return {"task_id": args.task}, replies
