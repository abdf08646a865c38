"""Throughput harness: how close does a script's learner run to its environment's own speed limit?

It measures, in one process on one machine:
  (a) raw environment steps/s with random actions, at the script's num_envs
      (Atari: ale-py's C++ ``AtariVectorEnv``; MuJoCo: one gymnasium ``*-v5`` env, as SAC steps one env), then
  (b) the script's own training SPS, read from the TensorBoard tag it logs (``charts/SPS`` by default,
      measured by the script after warm-up), as the median of the values after the first 20 %.
It prints (b)/(a) and appends one JSON line to ``benchmarks/results/throughput.jsonl`` with the command,
hardware, load average, peak memory, date and git commit, so every number in the docs can be traced.

Units: a "step" is one agent step of one env (Atari: 4 emulator frames with frame-skip 4), summed over envs,
as CleanRL's ``global_step`` counts them.

Usage (everything after ``--`` is the script's command; the harness appends ``--run-dir <tmp>``):
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label trex-policy \
        -- python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 ...
    python benchmarks/throughput.py mujoco --env-id Hopper-v5 --label filter-irl -- python filter_irl_mujoco.py ...
The training command is stopped with SIGTERM after ``--train-seconds`` (scripts checkpoint and exit with code 130
on SIGTERM), so a default-budget command can be measured for a fixed time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "throughput.jsonl"


def rom_name(env_id: str) -> str:
    """'BreakoutNoFrameskip-v4' / 'ALE/Breakout-v5' -> 'breakout' (ale-py's snake_case ROM id)."""
    name = env_id.split("/")[-1]
    name = re.sub(r"(NoFrameskip|Deterministic)?-v\d+$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def raw_atari_sps(env_id: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    from ale_py.vector_env import AtariVectorEnv

    sticky = 0.25 if env_id.startswith("ALE/") else 0.0
    envs = AtariVectorEnv(
        game=rom_name(env_id),
        num_envs=num_envs,
        repeat_action_probability=sticky,
        reward_clipping=False,
        episodic_life=False,
        noop_max=30,
    )
    rng = np.random.default_rng(seed)
    n_actions = envs.single_action_space.n
    envs.reset(seed=seed)
    for _ in range(20):  # warm-up: threads started, caches filled
        envs.step(rng.integers(0, n_actions, size=num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(rng.integers(0, n_actions, size=num_envs))
        steps += num_envs
    elapsed = time.perf_counter() - start
    envs.close()
    return steps / elapsed


def raw_mujoco_sps(env_id: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    import gymnasium as gym

    if "Maze" in env_id:  # PointMaze / AntMaze live in gymnasium-robotics
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)

    envs = [gym.make(env_id) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
        env.action_space.seed(seed + i)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += num_envs
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return steps / elapsed


def counter_rate(points: list[tuple[int, float, float]], skip_fraction: float) -> dict | None:
    """Growth per step of a cumulative scalar between the first point after warm-up and the last."""
    if len(points) < 2:
        return None
    first, last = points[min(int(len(points) * skip_fraction), len(points) - 2)], points[-1]
    per_step = (last[2] - first[2]) / max(1, last[0] - first[0])
    print(f"counter growth per step after warm-up: {per_step:.5g} (last value {last[2]:g})")
    return {"last": last[2], "per_step": per_step, "from_step": first[0], "to_step": last[0]}


def read_scalars(run_dir: Path, tag: str) -> list[tuple[int, float, float]]:
    """All (step, wall time, value) of one scalar tag from every TensorBoard event file under ``run_dir``, in step
    order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    dirs = sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")})
    for d in dirs:
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            points += [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    points.sort()
    return points


def slope_sps(points: list[tuple[int, float, float]], skip_fraction: float) -> float | None:
    """Steps per second from the logged steps and their wall times, after the first ``skip_fraction`` of the points:
    the same measure for every script, whatever its own SPS formula (e.g. cumulative from the start, warm-up
    included, as CleanRL's)."""
    start = min(int(len(points) * skip_fraction), len(points) - 2)
    if start < 0:
        return None
    (s0, t0, _), (s1, t1, _) = points[start], points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def after_warmup_median(values: list[float], skip_fraction: float) -> float:
    """Median of the values after dropping the first ``skip_fraction`` of them (at least one value is kept)."""
    if not values:
        raise ValueError("no values")
    start = min(int(len(values) * skip_fraction), len(values) - 1)
    return float(statistics.median(values[start:]))


def hardware() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # torch missing or broken: the harness still measures the env
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "python": platform.python_version()}


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run_training(cmd: list[str], run_dir: Path, train_seconds: float, in_run_dir: bool = False) -> tuple[int, float]:
    """Run the script with ``--run-dir`` (or, ``in_run_dir``, inside that directory, for a script without the flag
    that logs under its working directory); SIGTERM it after ``train_seconds``. Returns (returncode, wall seconds)."""
    full = cmd if in_run_dir else [*cmd, "--run-dir", str(run_dir)]
    if in_run_dir:
        run_dir.mkdir(parents=True)
    print("running:", " ".join(full), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(full, cwd=run_dir if in_run_dir else REPO_ROOT, stdin=subprocess.DEVNULL)
    try:
        rc = proc.wait(timeout=train_seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    return rc, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: throughput.py {atari,mujoco} [options] -- python SCRIPT.py [script args]", file=sys.stderr)
        return 2
    split = argv.index("--")
    own, cmd = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=["atari", "mujoco"])
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--num-envs", type=int, default=None, help="default: 8 for atari, 1 for mujoco")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of the raw-env measurement")
    parser.add_argument("--train-seconds", type=float, default=300.0, help="SIGTERM the training command after this")
    parser.add_argument("--tag", default="charts/SPS", help="TensorBoard scalar tag holding the script's SPS")
    parser.add_argument("--skip-fraction", type=float, default=0.2, help="leading fraction of SPS values ignored")
    parser.add_argument("--label", default=None, help="short name for this measurement in the results file")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to throughput.jsonl")
    parser.add_argument(
        "--counter-tag",
        action="append",
        default=[],
        help="a cumulative scalar (e.g. reward/updates) whose growth per step after warm-up is recorded; repeatable",
    )
    parser.add_argument(
        "--also-tag",
        action="append",
        default=[],
        help="another rate-like scalar (e.g. hyper/rollout_sps) whose median after warm-up is recorded; repeatable",
    )
    parser.add_argument(
        "--in-run-dir",
        action="store_true",
        help="run the command inside the temporary run dir instead of passing --run-dir (baselines "
        "such as CleanRL's scripts, which log under their working directory; give absolute paths)",
    )
    args = parser.parse_args(own)
    if not cmd:
        parser.error("missing the training command after --")
    num_envs = args.num_envs or (8 if args.family == "atari" else 1)

    load_before = os.getloadavg()
    raw_fn = raw_atari_sps if args.family == "atari" else raw_mujoco_sps
    raw = raw_fn(args.env_id, num_envs, args.seconds)
    print(f"raw {args.family} env SPS ({args.env_id}, {num_envs} envs, random actions): {raw:,.0f}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="throughput_"))
    try:
        rc, wall = run_training(cmd, tmp / "run", args.train_seconds, args.in_run_dir)
        points = read_scalars(tmp / "run", args.tag)
        values = [v for _, _, v in points]
        counters = {tag: counter_rate(read_scalars(tmp / "run", tag), args.skip_fraction) for tag in args.counter_tag}
        also = {}
        for tag in args.also_tag:
            vals = [v for _, _, v in read_scalars(tmp / "run", tag)]
            also[tag] = round(after_warmup_median(vals, args.skip_fraction), 2) if vals else None
            print(f"{tag}: median after warm-up {also[tag]} ({len(vals)} values)")
    finally:
        peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        shutil.rmtree(tmp, ignore_errors=True)
    if not values:
        fix = "run the command longer or check the tag"
        print(f"no '{args.tag}' values were logged (exit code {rc}): {fix}", file=sys.stderr)
        return 1
    train = after_warmup_median(values, args.skip_fraction)
    ratio = train / raw
    skipped = f"{args.skip_fraction:.0%}"
    print(f"training SPS ({args.tag}, median of {len(values)} values after the first {skipped}): {train:,.0f}")
    slope = slope_sps(points, args.skip_fraction)
    if slope is not None:
        print(f"training SPS from logged steps / wall time after the first {args.skip_fraction:.0%}: {slope:,.0f}")
    print(f"ratio training/raw: {ratio:.3f}   peak RSS of the training process: {peak_rss_mb:,.0f} MB")

    record = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "label": args.label,
        "family": args.family,
        "env_id": args.env_id,
        "num_envs": num_envs,
        "raw_env_sps": round(raw, 1),
        "train_sps": round(train, 1),
        "train_sps_slope": None if slope is None else round(slope, 1),
        "ratio": round(ratio, 4),
        "sps_tag": args.tag,
        "sps_points": len(values),
        "train_returncode": rc,
        "train_wall_s": round(wall, 1),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "hardware": hardware(),
        "git_commit": git_commit(),
        "command": " ".join(cmd),
    }
    if counters:
        record["counters"] = counters
    if also:
        record["also"] = also
    if not args.no_record:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"recorded in {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
