import json

import pytest

from mtrl_rollout.protocol import (
    PROTOCOL_VERSION,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    MetricEntry,
    ProtocolError,
    RolloutRequest,
    RolloutResult,
    StopReason,
    TokenLogprob,
    TurnRecord,
    encode,
    parse_as,
    parse_message,
)

IDS = {"run_id": "uid-1", "step": 3, "group_id": "g0", "sample_id": "s0", "policy_version": 7}


def _request() -> RolloutRequest:
    return RolloutRequest(**IDS, data={"secret": "crane"}, max_length=2048)


def _response() -> GenerateResponse:
    return GenerateResponse(
        **IDS,
        request_id="r1",
        turn=0,
        prompt_token_ids=[1, 2, 3],
        choices=[
            Choice(
                message=ChatMessage(role="assistant", content="<guess>slate</guess>"),
                finish_reason="stop",
                logprobs=ChoiceLogprobs(content=[TokenLogprob(token="sl", logprob=-0.5)]),
                token_ids=[42],
            )
        ],
    )


def _result() -> RolloutResult:
    return RolloutResult(
        **IDS,
        aggregate_reward_score=0.5,
        metrics_list=[MetricEntry(name="solved", value=1.0, type="Reward")],
        stop_reason=StopReason.DONE,
        trajectory=[
            TurnRecord(
                turn=0,
                policy_version=7,
                prompt_token_ids=[1, 2],
                completion_token_ids=[3],
                completion_logprobs=[-0.1],
                finish_reason="stop",
            )
        ],
    )


@pytest.mark.parametrize(
    "message",
    [
        _request(),
        GenerateRequest(
            **IDS,
            request_id="r1",
            turn=2,
            messages=[ChatMessage(role="user", content="hi")],
            reply_queue_url="http://q/reply",
        ),
        _response(),
        _result(),
    ],
    ids=lambda m: type(m).__name__,
)
def test_every_message_round_trips_and_carries_ids(message: object) -> None:
    body = encode(message)  # type: ignore[arg-type]
    obj = json.loads(body)
    assert obj["protocol_version"] == PROTOCOL_VERSION
    assert {k: obj[k] for k in IDS} == IDS
    assert parse_message(body) == message


def test_byoo_field_names_are_spoken() -> None:
    request = json.loads(encode(_request()))
    assert {"sample_id", "max_length", "data", "rewards"} <= request.keys()
    assert request["rewards"] == {"range": [0.0, 1.0]}
    choice = json.loads(encode(_response()))["choices"][0]
    assert {"message", "finish_reason", "logprobs"} <= choice.keys()
    result = json.loads(encode(_result()))
    assert result["id"] == result["sample_id"] == "s0"
    assert result["metrics_list"] == [{"name": "solved", "value": 1.0, "type": "Reward"}]


def test_generate_request_accepts_byoo_step_id_for_turn() -> None:
    raw = {
        **IDS,
        "protocol_version": PROTOCOL_VERSION,
        "kind": "generate_request",
        "request_id": "r",
        "step_id": 4,
        "messages": [{"role": "user", "content": "x"}],
        "reply_queue_url": "q",
    }
    assert parse_as(json.dumps(raw), GenerateRequest).turn == 4


def test_result_id_must_agree_with_sample_id() -> None:
    raw = json.loads(encode(_result()))
    raw["id"] = "other"
    with pytest.raises(ProtocolError, match="id 'other' != sample_id"):
        parse_message(json.dumps(raw))


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda o: "not json", "not JSON"),
        (lambda o: [1, 2], "expected a JSON object"),
        (lambda o: {**o, "protocol_version": "mtrl.rollout/v0"}, "unsupported protocol_version"),
        (lambda o: {**o, "kind": "nonsense"}, "kind"),
        (lambda o: {**o, "surprise": 1}, "surprise: Extra inputs are not permitted"),
        (lambda o: {**o, "step": -1}, "step"),
        (lambda o: {k: v for k, v in o.items() if k != "sample_id"}, "sample_id: Field required"),
        (lambda o: {**o, "rewards": {"range": [1, 0]}}, "min < max"),
        (lambda o: {**o, "max_length": 0}, "max_length"),
    ],
)
def test_malformed_messages_raise_protocol_error(mutate, error: str) -> None:
    obj = json.loads(encode(_request()))
    mutated = mutate(obj)
    raw = mutated if isinstance(mutated, str) else json.dumps(mutated)
    with pytest.raises(ProtocolError, match=error):
        parse_message(raw)


def test_token_ids_and_logprobs_must_align() -> None:
    raw = json.loads(encode(_response()))
    raw["choices"][0]["token_ids"] = [1, 2]
    with pytest.raises(ProtocolError, match="same length"):
        parse_message(json.dumps(raw))


def test_generate_response_is_choices_or_error() -> None:
    raw = json.loads(encode(_response()))
    raw["error"] = "boom"
    with pytest.raises(ProtocolError, match="either choices or an error"):
        parse_message(json.dumps(raw))


def test_non_finite_numbers_are_rejected() -> None:
    raw = encode(_result()).replace('"aggregate_reward_score":0.5', '"aggregate_reward_score":NaN')
    with pytest.raises(ProtocolError):
        parse_message(raw)


def test_parse_as_rejects_the_wrong_kind() -> None:
    with pytest.raises(ProtocolError, match="expected RolloutResult, got RolloutRequest"):
        parse_as(encode(_request()), RolloutResult)
