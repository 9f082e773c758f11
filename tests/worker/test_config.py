import pytest

from mtrl_worker.config import ConfigError, WorkerConfig

BASE = {
    "MTRL_RUN_ID": "0f3c2a9e-uid",
    "MTRL_ROLLOUT_QUEUE_URL": "http://q/rollout",
    "MTRL_RESULT_QUEUE_URL": "http://q/result",
    "MTRL_GENERATE_QUEUE_URL": "http://q/generate",
    "MTRL_DLQ_URL": "http://q/dlq",
    "MTRL_ENVIRONMENT": "wordle",
}


def test_reads_every_field_from_mtrl_variables() -> None:
    config = WorkerConfig.from_env(
        BASE
        | {
            "MTRL_ENVIRONMENT_ARGS": '{"max_guesses": 5}',
            "MTRL_REWARD_WEIGHTS": '{"speed": 2}',
            "MTRL_CONCURRENCY": "128",
            "MTRL_WORKER_ID": "w-1",
            "MTRL_PAYLOAD_BUCKET": "",
            "UNRELATED": "x",
        }
    )
    assert config.environment_args == {"max_guesses": 5}
    assert config.reward_weights == {"speed": 2.0}
    assert config.concurrency == 128 and config.worker_id == "w-1"
    assert config.payload_bucket is None
    assert config.reply_queue_prefix == "mtrl-0f3c2a9e"


def test_reports_every_problem_at_once() -> None:
    env = {k: v for k, v in BASE.items() if k != "MTRL_DLQ_URL"}
    env |= {"MTRL_REWARD_WEIGHTS": "{not json", "MTRL_CONCURRENCY": "0"}
    with pytest.raises(ConfigError) as info:
        WorkerConfig.from_env(env)
    message = str(info.value)
    for name in ("MTRL_DLQ_URL", "MTRL_REWARD_WEIGHTS", "MTRL_CONCURRENCY"):
        assert name in message
