"""A scripted stand-in for the trainer's sampler, shared by the worker tests."""

from mtrl_rollout.protocol import (
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    TokenLogprob,
)


def scripted_response(request: GenerateRequest, text: str, policy_version: int = 1) -> GenerateResponse:
    """Prompt ids: one token per message so far; completion ids: one per character."""
    completion = [ord(c) for c in text]
    return GenerateResponse.replying_to(
        request,
        policy_version=policy_version,
        prompt_token_ids=list(range(len(request.messages))),
        choices=[
            Choice(
                message=ChatMessage(role="assistant", content=text),
                finish_reason="stop",
                logprobs=ChoiceLogprobs(content=[TokenLogprob(token=c, logprob=-0.25) for c in text]),
                token_ids=completion,
            )
        ],
    )


class ScriptedGenerator:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest, timeout_s: float) -> GenerateResponse:
        self.requests.append(request)
        return scripted_response(request, self.replies[len(self.requests) - 1])
