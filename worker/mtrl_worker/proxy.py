"""An OpenAI-compatible chat endpoint on loopback, so existing agents run unchanged.

An agent gets `base_url` and an `api_key`; the key names its episode, so the call lands in that
episode's session and every completion is recorded with its token ids and logprobs. Supported:
`POST /v1/chat/completions` (n=1, no streaming; `max_tokens`/`max_completion_tokens`,
`temperature`, `stop`, `logprobs`), `GET /v1/models`. The key may also come in the
`X-MTRL-Episode` header or as the `model` name, for clients that cannot set a key.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from mtrl_rollout.protocol import ChatMessage
from mtrl_worker.environments.base import Completion, EpisodeLimitReached
from mtrl_worker.policy import GenerationError
from mtrl_worker.session import EpisodeSession, GenerationTimeout

MODEL_NAME = "mtrl-policy"
_ROLES = {
    "developer": "system",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


class BadRequest(ValueError):
    pass


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": code}}
    return web.json_response(body, status=status)


def _messages(raw: Any) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for m in raw:
        role = _ROLES.get(m.get("role")) if isinstance(m, dict) else None
        if role is None:
            raise BadRequest(f"unsupported message {m!r}")
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append(ChatMessage(role=role, content=str(content)))
    return out


def completion_body(completion: Completion, model: str, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": completion.text},
        "finish_reason": completion.finish_reason,
        "logprobs": None,
    }
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": "", "logprob": lp, "bytes": None, "top_logprobs": []} for lp in completion.logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": 0,  # known to the trainer only; recorded in the turn record
            "completion_tokens": len(completion.token_ids),
            "total_tokens": len(completion.token_ids),
        },
    }


class PolicyProxy:
    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._sessions: dict[str, EpisodeSession] = {}
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def register(self, session: EpisodeSession) -> None:
        session.openai_base_url = self.base_url
        self._sessions[session.api_key] = session

    def unregister(self, session: EpisodeSession) -> None:
        self._sessions.pop(session.api_key, None)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _session(self, request: web.Request, body: dict[str, Any]) -> EpisodeSession | None:
        auth = request.headers.get("Authorization", "")
        for key in (
            auth.removeprefix("Bearer ").strip(),
            request.headers.get("X-MTRL-Episode", ""),
            str(body.get("model", "")),
        ):
            if key in self._sessions:
                return self._sessions[key]
        return None

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "mtrl"}]}
        )

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
        except (ValueError, BadRequest) as exc:
            return _error(400, f"invalid JSON body: {exc}", "invalid_request_error")
        session = self._session(request, body)
        if session is None:
            return _error(401, "unknown episode key", "authentication_error")
        try:
            if body.get("stream"):
                raise BadRequest("stream=true is not supported")
            if body.get("n", 1) != 1:
                raise BadRequest("only n=1 is supported: a GRPO group is made of separate samples")
            stop = body.get("stop")
            completion = await session.chat(
                _messages(body.get("messages")),
                max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
                temperature=body.get("temperature"),
                stop=[stop] if isinstance(stop, str) else stop,
            )
        except BadRequest as exc:
            return _error(400, str(exc), "invalid_request_error")
        except EpisodeLimitReached as exc:
            return _error(400, str(exc), "episode_limit", exc.reason.value)
        except GenerationError as exc:
            return _error(502, str(exc), "generation_error")
        except GenerationTimeout as exc:
            return _error(504, str(exc), "timeout")
        except TimeoutError:  # the handler runs outside the episode's own timeout scope
            return _error(504, "the episode's time limit ran out", "timeout")
        model = str(body.get("model") or MODEL_NAME)
        return web.json_response(completion_body(completion, model, bool(body.get("logprobs"))))
