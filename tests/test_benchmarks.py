"""Tests of the throughput harness (benchmarks/throughput.py): the numbers in docs come from it."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO_ROOT, load_benchmark

throughput = load_benchmark("throughput")


@pytest.mark.parametrize(
    "env_id, rom",
    [
        ("BreakoutNoFrameskip-v4", "breakout"),
        ("ALE/Breakout-v5", "breakout"),
        ("MontezumaRevengeNoFrameskip-v4", "montezuma_revenge"),
        ("ALE/MsPacman-v5", "ms_pacman"),
        ("SpaceInvadersNoFrameskip-v4", "space_invaders"),
    ],
)
def test_rom_name_maps_gym_ids_to_ale_roms(env_id, rom):
    from ale_py.roms import get_all_rom_ids

    assert throughput.rom_name(env_id) == rom
    assert rom in get_all_rom_ids()


def test_after_warmup_median_drops_the_leading_fraction():
    # 10 values, skip 20 % -> median of [3..10] = 6.5; the slow warm-up values 1, 2 are ignored.
    assert throughput.after_warmup_median([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.2) == 6.5
    # A single value is always kept.
    assert throughput.after_warmup_median([42.0], 0.9) == 42.0
    with pytest.raises(ValueError):
        throughput.after_warmup_median([], 0.2)


def test_slope_sps_is_logged_steps_over_wall_time_after_the_leading_fraction():
    # (step, wall time, value); skipping 20 % of 5 points starts at point 1: (500 - 100) / (15 - 11) = 100.
    points = [(0, 0.0, 9.0), (100, 11.0, 9.0), (200, 12.0, 9.0), (300, 13.0, 9.0), (500, 15.0, 9.0)]
    assert throughput.slope_sps(points, 0.2) == 100.0
    assert throughput.slope_sps(points[:1], 0.2) is None  # one point: no slope


def test_alternate_keeps_only_iterations_inside_a_running_window():
    alternate = load_benchmark("alternate")
    # (step, wall time) once per iteration of 100 steps; the process ran in [0, 10] and [20, 30].
    points = [(100, 1.0), (200, 3.0), (300, 5.0), (400, 11.0), (500, 21.0), (600, 25.0)]
    windows = [(0.0, 10.0), (20.0, 30.0)]
    # kept: 1->3 and 3->5 (2 s each) and 21->25 (4 s); 5->11 and 11->21 straddle a pause
    assert alternate.in_window_seconds_per_step(points, windows) == [0.02, 0.02, 0.04]


def test_raw_env_measurements_are_positive():
    assert throughput.raw_atari_sps("BreakoutNoFrameskip-v4", num_envs=2, seconds=0.5) > 0
    assert throughput.raw_mujoco_sps("InvertedPendulum-v5", num_envs=1, seconds=0.3) > 0
    assert throughput.raw_mujoco_sps("PointMaze_UMaze-v3", num_envs=1, seconds=0.3) > 0  # gymnasium-robotics


FAKE_SCRIPT = textwrap.dedent(
    """
    import sys
    from torch.utils.tensorboard import SummaryWriter
    run_dir = sys.argv[sys.argv.index("--run-dir") + 1]
    writer = SummaryWriter(run_dir)
    for step, sps in enumerate([10.0, 100.0, 200.0, 200.0, 300.0]):
        writer.add_scalar("charts/SPS", sps, step)
    writer.close()
    """
)


def test_harness_end_to_end_reads_the_scripts_sps_and_records_it(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_script.py"
    script.write_text(FAKE_SCRIPT)
    results = tmp_path / "throughput.jsonl"
    monkeypatch.setattr(throughput, "RESULTS", results)
    harness = ["mujoco", "--env-id", "InvertedPendulum-v5", "--seconds", "0.3", "--label", "fake"]
    rc = throughput.main(
        [*harness, "--also-tag", "charts/SPS", "--also-tag", "none", "--", sys.executable, str(script)]
    )
    assert rc == 0
    record = json.loads(results.read_text().splitlines()[-1])
    assert record["also"] == {"charts/SPS": 200.0, "none": None}
    # 5 values, skip 20 % -> median of [100, 200, 200, 300] = 200.
    assert record["train_sps"] == 200.0
    assert record["ratio"] == pytest.approx(200.0 / record["raw_env_sps"], abs=1e-4)
    assert record["label"] == "fake" and record["sps_points"] == 5
    assert record["hardware"]["cores"] >= 1 and record["command"].endswith("fake_script.py")


def test_harness_runs_a_baseline_without_run_dir_inside_the_temp_dir(tmp_path, monkeypatch):
    # A CleanRL-style script: no --run-dir flag, logs under its working directory.
    script = tmp_path / "baseline.py"
    script.write_text(FAKE_SCRIPT.replace('sys.argv[sys.argv.index("--run-dir") + 1]', '"runs/baseline__1"'))
    results = tmp_path / "throughput.jsonl"
    monkeypatch.setattr(throughput, "RESULTS", results)
    harness = ["mujoco", "--env-id", "InvertedPendulum-v5", "--seconds", "0.3", "--in-run-dir"]
    rc = throughput.main([*harness, "--", sys.executable, str(script)])
    assert rc == 0
    record = json.loads(results.read_text().splitlines()[-1])
    assert record["train_sps"] == 200.0 and record["sps_points"] == 5
    assert not (REPO_ROOT / "runs" / "baseline__1").exists()


def test_harness_without_a_command_exits_2(capsys):
    assert throughput.main(["atari", "--env-id", "BreakoutNoFrameskip-v4"]) == 2


def test_gpu_runbook_parses_and_refuses_an_unknown_step(tmp_path):
    import subprocess

    script = REPO_ROOT / "benchmarks" / "gpu.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script), "nope"], capture_output=True, text=True, env={"OUT": str(tmp_path)})
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_gpu_all_dry_run_lists_every_script_within_one_device_command(tmp_path):
    """`gpu.sh all` is the first thing a lent GPU runs: one measurement per script, inside one 10-minute call."""
    env = {"PATH": os.environ["PATH"], "OUT": str(tmp_path), "DRY": "1"}
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "benchmarks" / "gpu.sh"), "all"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    budget = sum(int(re.match(r"\[(\d+) s\]", line).group(1)) for line in lines)
    assert 300 <= budget <= 540  # leaves room for installs and start-ups inside 600 s
    scripts = [
        "trex_ppo_atari.py",
        "rnd_ppo_atari.py",
        "preference_ga3c_atari.py",
        "filter_irl_mujoco.py",
        "hype_irl_mujoco.py",
        "mbirl_antmaze.sh throughput",
        "simple_worldmodel_atari.py",
    ]
    for name in scripts:
        assert any(name in line for line in lines), name
    labels = re.findall(r"--label (\S+)", proc.stdout)
    assert len(labels) == 6 and len(set(labels)) == 6 and all(x.endswith("-gpu") for x in labels)
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_gpu_all_uses_only_flags_the_scripts_know():
    """Every --flag that `gpu.sh all` passes to a script appears in that script's --help."""
    env = {"PATH": os.environ["PATH"], "OUT": "/tmp", "DRY": "1"}
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "benchmarks" / "gpu.sh"), "all"], capture_output=True, text=True, env=env
    ).stdout
    for line in out.splitlines():
        m = re.search(r"python3 (\w+\.py) (.*)$", line.split(" -- ")[-1])
        if m is None:
            continue
        script, rest = m.groups()
        help_text = subprocess.run(
            [sys.executable, str(REPO_ROOT / script), "--help"], capture_output=True, text=True, cwd=REPO_ROOT
        ).stdout
        for flag in re.findall(r"(--[a-z][\w.-]*)", rest):
            assert flag in help_text, f"{script} has no {flag}"


def test_tb_to_csv_merges_a_resumed_runs_event_files_and_keeps_the_last_value(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    first = SummaryWriter(run)
    first.add_scalar("charts/episodic_return", 1.5, 100)
    first.add_scalar("charts/episodic_return", 2.0, 200)
    first.add_scalar("losses/value", 9.0, 200)
    first.close()
    os.utime(next(run.glob("events.*")), (1, 1))  # older than the resumed run's file
    second = SummaryWriter(run, filename_suffix=".resumed")  # a resume re-logs step 200 and goes on
    second.add_scalar("charts/episodic_return", 3.0, 200)
    second.add_scalar("charts/episodic_return", 4.25, 300)
    second.close()
    out = tmp_path / "records" / "curves.csv"
    tb_to_csv = load_benchmark("tb_to_csv")
    assert tb_to_csv.main([str(run), str(out), "--prefix", "charts/"]) == 0
    assert out.read_text().splitlines() == [
        "tag,step,value",
        "charts/episodic_return,100,1.5",
        "charts/episodic_return,200,3",
        "charts/episodic_return,300,4.25",
    ]
    assert tb_to_csv.main([str(tmp_path / "missing"), str(out)]) == 2


def rnd_sh(target: str, **env) -> subprocess.CompletedProcess:
    """`bash benchmarks/rnd_ppo_atari.sh TARGET` with env overrides (RUN_ROOT, RESULTS_ROOT, ASSETS)."""
    cmd = ["bash", str(REPO_ROOT / "benchmarks/rnd_ppo_atari.sh"), target]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})


def test_montezuma_records_copies_logged_runs_and_skips_one_that_has_not_logged_yet(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    runs, results = tmp_path / "runs", tmp_path / "results"
    for name in ("rnd_montezuma_rnd_s1", "rnd_montezuma_rnd_s2"):
        (runs / name).mkdir(parents=True)
        (runs / name / "args.json").write_text("{}")
    logged = SummaryWriter(runs / "rnd_montezuma_rnd_s1")
    logged.add_scalar("charts/visited_rooms_train", 1.0, 4096)
    logged.add_scalar("losses/value", 0.5, 4096)  # not a recorded prefix
    logged.close()
    SummaryWriter(runs / "rnd_montezuma_rnd_s2").close()  # an event file without scalars: the run just started
    (runs / "rnd_montezuma_rnd_s1" / "results.json").write_text('{"eval_mean_return": 0.0}')
    done = rnd_sh("montezuma-records", RUN_ROOT=str(runs), RESULTS_ROOT=str(results))
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr and "rnd_montezuma_rnd_s2" in done.stderr
    assert sorted(p.name for p in (results / "rnd_montezuma_rnd_s1").iterdir()) == [
        "args.json",
        "curves.csv",
        "results.json",
    ]
    assert (results / "rnd_montezuma_rnd_s1" / "curves.csv").read_text().splitlines() == [
        "tag,step,value",
        "charts/visited_rooms_train,4096,1",
    ]
    assert not (results / "rnd_montezuma_rnd_s2").exists()


def test_montezuma_plot_tables_each_run_from_its_records(tmp_path):
    results, assets = tmp_path / "results", tmp_path / "assets"
    curves = {
        "rnd_montezuma_rnd_s1": [
            ("charts/episodic_return", 1000, 0),
            ("charts/episodic_return", 2000, 400),
            ("charts/episodic_return", 3000, 100),
            ("charts/episodic_length", 1000, 300),
            ("charts/episodic_length", 2000, 500),
            ("charts/episodic_length", 3000, 700),
            ("charts/visited_rooms_train", 2048, 1),
            ("charts/visited_rooms_train", 4096, 3),
            ("rnd/intrinsic_reward", 2048, 0.0431),
            ("rnd/intrinsic_reward", 4096, 0.0064),
        ],
        "rnd_montezuma_ppo_s1": [
            ("charts/episodic_return", 1000, 0),
            ("charts/episodic_length", 1000, 250),
            ("charts/visited_rooms_train", 2500, 1),
        ],
    }
    for run, rows in curves.items():
        (results / run).mkdir(parents=True)
        lines = ["tag,step,value", *(f"{t},{s},{v}" for t, s, v in rows)]
        (results / run / "curves.csv").write_text("\n".join(lines) + "\n")
    result = {"eval_mean_return": 50.0, "eval_std_return": 50.0, "eval_episodes": 2}
    (results / "rnd_montezuma_rnd_s1" / "results.json").write_text(json.dumps(result))
    done = rnd_sh("montezuma-plot", RESULTS_ROOT=str(results), ASSETS=str(assets))
    assert done.returncode == 0, done.stderr
    table = (results / "rnd_montezuma_table.md").read_text().splitlines()
    # frames = 4 x the last step of any curve; the score mean of the last (here all 3) episodes, with their max
    assert table[2:] == [
        "| PPO s1 | 0.01M | 1 | 0 | 0.0 (max 0) | 250 | 1 | none (int-coef 0) | running |",
        "| RND s1 | 0.02M | 3 | 2 | 166.7 (max 400) | 500 | 3 | 0.043 → 0.006 | 50.0 ± 50.0 (2 games) |",
    ]
    assert (assets / "montezuma_10M.png").stat().st_size > 0


@pytest.mark.slow
def test_montezuma_chain_carries_a_run_to_the_device_and_back_in_pieces_then_its_result(tmp_path):
    """gpu.sh montezuma-chain, run on the CPU at tiny sizes: a start stopped by its timer brings back the newest
    checkpoint in pieces that join into the same file; the next start resumes from it and, its budget reached,
    brings back the results instead."""
    import torch

    tiny = "--ppo.num-envs 4 --ppo.num-steps 16 --rnd.num-iterations-obs-norm-init 1 --checkpoint-every 1"
    tiny += " --eval.episodes 1 --env.max-episode-frames 400 --no-progress-bar"
    carry, run = tmp_path / "carry", "rnd_montezuma_rnd_s1"

    def chain(out, seconds, total):
        env = {**os.environ, "OUT": str(out), "CARRY": str(carry), "RUN": run, "MONTEZUMA_S": str(seconds)}
        env["MONTEZUMA_FLAGS"] = f"{tiny} --ppo.total-timesteps {total}"
        out.mkdir()
        cmd = ["bash", str(REPO_ROOT / "benchmarks" / "gpu.sh"), "montezuma-chain"]
        subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO_ROOT)
        return sorted(p.name for p in out.iterdir())

    # far more than 45 s: stopped by the timer (20 s left no checkpoint yet with five processes on the 2 cores)
    first = chain(tmp_path / "out1", 45, 10**6)
    newest = sorted((carry / run / "checkpoints").glob("ckpt_*.pt"))[-1]
    pieces = [name for name in first if name.startswith(newest.name + ".part-")]
    assert len(pieces) == 4 and f"{run}.log" in first and any(n.startswith("events.out.tfevents") for n in first)
    assert b"".join((tmp_path / "out1" / n).read_bytes() for n in pieces) == newest.read_bytes()
    step = torch.load(newest, weights_only=False)["global_step"]
    second = chain(tmp_path / "out2", 240, step + 64)  # one more iteration, then the final evaluation
    log = (tmp_path / "out2" / f"{run}.log").read_text()
    assert f"(global step {step})" in log and "done:" in log, log[-2000:]
    assert {"results.json", "policy.pt", "curves.png"} <= set(second) and not any(".part-" in n for n in second)
    assert json.loads((tmp_path / "out2" / "results.json").read_text())["global_step"] == step + 64


def test_hopper_records_add_a_mean_over_the_finished_seeds_of_a_method(tmp_path):
    """paper-records on hand-written records: two finished FILTER seeds get a row of their means (over the
    evaluations both have), one MM seed still running gets none."""
    results = tmp_path / "results"

    def record(run, evals, final=None):
        (results / run).mkdir(parents=True)
        rows = ["tag,step,value", *(f"eval/episodic_return,{step},{v}" for step, v in evals)]
        (results / run / "curves.csv").write_text("\n".join(rows) + "\n")
        if final is not None:
            res = {"eval_mean": final, "eval_std": 10.0, "eval_returns": [final] * 10}
            (results / run / "results.json").write_text(json.dumps(res))

    steps = [10_000 * k for k in range(1, 8)]
    record("filter_s1", zip(steps[:6], [100, 200, 300, 400, 500, 600]), final=650)
    record("filter_s2", zip(steps, [300, 400, 500, 600, 700, 800, 900]), final=850)
    record("mm_s1", zip(steps[:2], [50, 60]))
    env = {**os.environ, "PAPER_ROOT": str(tmp_path / "runs"), "PAPER_RESULTS": str(results)}
    cmd = ["bash", str(REPO_ROOT / "benchmarks" / "filter_irl_mujoco.sh"), "paper-records"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "3 learning curves" in done.stdout, done.stderr
    rows = (results / "hopper_table.md").read_text().splitlines()[2:]
    # at 60k, the last step both seeds have: (600 + 800) / 2; the last five: (400 + 700) / 2; the paper's FILTER at
    # its nearest point (50k) is 1,280 in paper_curves.json
    assert rows[-1] == "| FILTER, mean of 2 seeds | 60,000 | 700 | 550 | - | 1,280 | 750 (s1 650, s2 850) |"
    assert [row.split(" | ")[0] for row in rows] == ["| FILTER s1", "| FILTER s2", "| MM s1", rows[-1].split(" | ")[0]]
    assert rows[2].endswith("| running |") and (results / "hopper_paper.png").stat().st_size > 0


@pytest.mark.slow
def test_hopper_paper_pipeline_on_a_tiny_budget_refuses_a_weak_expert_and_records_every_run(tmp_path):
    """Issue 44 item 4's bash glue end to end (expert cache, the gate on its score, FILTER and HyPE runs, records and
    figure), at budgets of seconds in a tmp root: the real runs take hours, so a slip here would cost a session."""
    env = {
        **os.environ,
        "PAPER_ROOT": str(tmp_path / "runs"),
        "PAPER_RESULTS": str(tmp_path / "results"),
        "PAPER_EXPERT_STEPS": "300",
        "PAPER_IRL_STEPS": "300",
        "EXPERT_MIN_RETURN": "0",
    }
    tiny = ["--sac.learning-starts", "200", "--sac.batch-size", "32"]

    def bench(script, *args, **extra_env):
        cmd = ["bash", str(REPO_ROOT / "benchmarks" / script), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env={**env, **extra_env}, timeout=300)

    expert = bench("filter_irl_mujoco.sh", "paper-expert", *tiny, "--expert.num-demos", "2")
    assert expert.returncode == 0 and "300 SAC steps, seed 1, 2 deterministic demos" in expert.stdout, expert.stderr
    weak = bench("filter_irl_mujoco.sh", "paper-irl", "mm", "1", EXPERT_MIN_RETURN="5000")
    errors = [line for line in weak.stderr.splitlines() if line.startswith("error:")]
    assert weak.returncode == 2 and len(errors) == 1 and "re-run paper-expert" in errors[0], weak.stderr
    assert not (tmp_path / "runs" / "mm_s1").exists()
    irl = [*tiny, "--eval.frequency", "100", "--eval.episodes", "1"]
    assert bench("filter_irl_mujoco.sh", "paper-irl", "filter", "1", *irl).returncode == 0
    assert bench("hype_irl_mujoco.sh", "paper-irl", "1", *irl).returncode == 0
    finished = (tmp_path / "runs" / "hype_s1" / "results.json").read_bytes()
    rerun = bench("hype_irl_mujoco.sh", "paper-irl", "1", *irl)  # a finished run: nothing to do, nothing rewritten
    assert rerun.returncode == 0 and (tmp_path / "runs" / "hype_s1" / "results.json").read_bytes() == finished
    records = bench("hype_irl_mujoco.sh", "paper-records")
    assert records.returncode == 0 and "2 learning curves" in records.stdout, records.stderr
    results = tmp_path / "results"
    assert (results / "hopper_paper.png").stat().st_size > 0
    rows = (results / "hopper_table.md").read_text().splitlines()[2:]  # one row per run, both finished
    assert [row.split(" | ")[0] for row in rows] == ["| FILTER s1", "| HyPE s1"]
    assert all(row.endswith("(1 episodes) |") for row in rows), rows
    assert (results / "expert" / "expert_meta.json").is_file()
    for run in ("filter_s1", "hype_s1"):
        assert (results / run / "results.json").is_file()
        rows = (results / run / "curves.csv").read_text().splitlines()
        assert [row.split(",")[1] for row in rows if row.startswith("eval/episodic_return,")] == ["100", "200", "300"]
    # a new machine (an empty PAPER_ROOT): the recorded expert_actor.pt records the same demos, no SAC is trained,
    # and the records keep the trained expert's meta
    meta = (results / "expert" / "expert_meta.json").read_bytes()
    again = bench("filter_irl_mujoco.sh", "paper-expert", "--expert.num-demos", "2", PAPER_ROOT=str(tmp_path / "runs2"))
    assert again.returncode == 0 and "300 SAC steps, seed 1, 2 deterministic demos" in again.stdout, again.stderr
    assert "expert SAC" not in (tmp_path / "runs2" / "expert.log").read_text()
    demos = [np.load(tmp_path / root / "experts" / "Hopper-v5" / "demos.npz") for root in ("runs", "runs2")]
    assert all(np.array_equal(demos[0][k], demos[1][k]) for k in demos[0].files)
    assert bench("filter_irl_mujoco.sh", "paper-records", PAPER_ROOT=str(tmp_path / "runs2")).returncode == 0
    assert (results / "expert" / "expert_meta.json").read_bytes() == meta
    # ... where a finished run's records are committed, the lane goes on instead of redoing it from nothing
    skipped = bench("hype_irl_mujoco.sh", "paper-irl", "1", *irl, PAPER_ROOT=str(tmp_path / "runs2"))
    assert skipped.returncode == 0 and "hype_s1 finished: its records are committed" in skipped.stdout
    assert not (tmp_path / "runs2" / "hype_s1").exists()


@pytest.mark.parametrize(
    "script, args, run", [("filter_irl_mujoco.sh", ["mm", "1"], "mm_s1"), ("hype_irl_mujoco.sh", ["1"], "hype_s1")]
)
def test_a_run_another_lane_is_running_is_left_to_it(tmp_path, script, args, run):
    """Both lanes' queues can reach the same run: while one holds $PAPER_ROOT/RUN.lock the other goes on."""
    import fcntl

    root = tmp_path / "runs"
    root.mkdir()
    env = {**os.environ, "PAPER_ROOT": str(root), "PAPER_RESULTS": str(tmp_path / "results")}
    cmd = ["bash", str(REPO_ROOT / "benchmarks" / script), "paper-irl", *args]
    with open(root / f"{run}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other lane, running it
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"{run} is being run by another lane" in done.stdout, done.stderr
    assert not (root / run).exists()


def test_a_second_lane_s_paper_expert_waits_for_the_first(tmp_path):
    """Both lanes start with paper-expert: while one holds $PAPER_ROOT/expert.lock the other waits, then goes on."""
    import fcntl

    root = tmp_path / "runs"
    root.mkdir()
    env = {**os.environ, "PAPER_ROOT": str(root), "PAPER_RESULTS": str(tmp_path / "results")}
    cmd = ["bash", str(REPO_ROOT / "benchmarks" / "filter_irl_mujoco.sh"), "paper-expert"]
    lock = open(root / "expert.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # the first lane, training its expert
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    waiting = subprocess.Popen(cmd, env=env, **popen)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)
        assert not (root / "expert").exists() and not (root / "expert.log").exists()  # nothing started meanwhile
        (root / "experts" / "Hopper-v5").mkdir(parents=True)  # what the first lane leaves: its cache
        meta = dict(expert_timesteps=7, seed=1, num_demos=2, return_mean=3500.0, return_std=1.0)
        (root / "experts" / "Hopper-v5" / "expert_meta.json").write_text(json.dumps(meta))
        (root / "experts" / "Hopper-v5" / "demos.npz").write_bytes(b"")
        lock.close()  # the first lane is done
        out, err = waiting.communicate(timeout=60)
    finally:
        lock.close()
        if waiting.poll() is None:  # a failed check: no expert training left behind
            os.killpg(waiting.pid, signal.SIGTERM)
    assert waiting.returncode == 0 and "7 SAC steps, seed 1, 2 deterministic demos" in out, err
    assert not (root / "expert").exists() and not (root / "expert_demos").exists()  # it trained nothing


def test_reward_probe_auc_counts_pairs_and_halves_ties():
    auc = load_benchmark("simple_reward_probe").auc
    # positives 0.35 and 0.8 against negatives 0.1 and 0.4: 0.35 > 0.1, 0.35 < 0.4, 0.8 > both -> 3 of 4 pairs
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True])) == 0.75
    # one tie (0.5 = 0.5) counts half, one win: (0.5 + 1) / 2
    assert auc(np.array([0.5, 0.5, 0.9]), np.array([True, False, True])) == 0.75
    assert math.isnan(auc(np.array([0.2, 0.3]), np.array([True, True])))


def test_reward_probe_pools_open_loop_steps_into_buckets_the_last_one_running_to_the_horizon():
    bucket_aucs = load_benchmark("simple_reward_probe").bucket_aucs
    rewarded = np.zeros((2, 30), bool)
    rewarded[0, [1, 20]] = True  # step 2 (bucket 1-4) and step 21 (bucket 13-25)
    trained, fresh = np.zeros((2, 30)), np.zeros((2, 30))
    fresh[0, 1] = fresh[0, 20] = 1.0  # the fresh head ranks both rewarded steps first
    fresh[1, 20] = 2.0  # ... but in bucket 13-25 one quiet step (of 25) above the rewarded one
    out = bucket_aucs(trained, fresh, rewarded)
    assert [b["steps"] for b in out] == ["1-4", "5-12", "13-25", "26-30"]
    assert [b["steps_scored"] for b in out] == [8, 16, 26, 10] and [b["rewarded"] for b in out] == [1, 0, 1, 0]
    assert out[0]["fresh_head_auc"] == 1.0 and out[0]["trained_head_auc"] == 0.5  # all ties: half
    assert out[2]["fresh_head_auc"] == 24 / 25 and math.isnan(out[1]["fresh_head_auc"])  # no rewarded step: nan


def test_reward_refit_class_weights_are_the_count_ratio_to_the_unrewarded_class_to_the_power():
    class_weights = load_benchmark("simple_reward_refit").class_weights
    counts = [49, 4900, 100]  # -1, 0, +1
    assert class_weights(counts, 1.0).tolist() == [100.0, 1.0, 49.0]  # balanced
    assert np.allclose(class_weights(counts, 0.5), [10.0, 1.0, 7.0])
    assert class_weights(counts, 0.0).tolist() == [1.0, 1.0, 1.0]  # the paper's unweighted loss
    assert class_weights([0, 4900, 100], 1.0).tolist() == [0.0, 1.0, 49.0]  # no step of a class: nothing to weigh


def test_reward_refit_weighted_loss_finds_a_rare_class_the_unweighted_one_leaves_at_zero():
    """A rare class (2 %) that overlaps the common one: the unweighted cross-entropy's argmax almost never names it,
    the balanced one names most of it, reading the raw features (the fit's standardisation folded into the head)."""
    import torch

    refit = load_benchmark("simple_reward_refit")
    gen = torch.Generator().manual_seed(0)
    rare = torch.arange(1000) < 20
    x = torch.randn(1000, 2, generator=gen) + rare[:, None] * torch.tensor([2.0, 0.0])
    x = x * torch.tensor([100.0, 0.01]) + 50.0  # far from standard: the head must read the raw features after the fit
    y = torch.where(rare, 0, 1)  # class 0 = reward -1, class 1 = no reward
    recall, false_alarms = {}, {}
    for power in (0.0, 1.0):
        w = refit.class_weights([20, 980, 0], power)
        torch.manual_seed(0)
        head = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        first, last = refit.refit_head(head, x, y, torch.as_tensor(w[y.numpy()], dtype=torch.float32), 1500)
        assert last < first
        with torch.no_grad():
            recall[power] = (head(x[rare]).argmax(-1) == 0).float().mean().item()
            false_alarms[power] = (head(x[~rare]).argmax(-1) == 0).float().mean().item()
    assert recall[0.0] < 0.2 and recall[1.0] > 0.7, recall
    # 2 standard deviations apart, balanced: about 16 % of the common class on the wrong side (0.66 if the fit's
    # standardisation were not folded in)
    assert false_alarms[0.0] < 0.05 and false_alarms[1.0] < 0.25, false_alarms


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--power", "-1"], "--power"),
        (["--iterations", "-2"], "--iterations"),
        (["--unrewarded", "0"], "--unrewarded"),
        (["--max-windows", "-5"], "--max-windows"),
        (["--policy-out", "/nonexistent/dir/p.pt"], "--policy-out"),
    ],
)
def test_reward_refit_refuses_bad_flags_and_run_dirs_in_one_line(tmp_path, extra, says):
    import torch

    refit = [sys.executable, str(REPO_ROOT / "benchmarks" / "simple_reward_refit.py"), str(tmp_path)]
    for flags, needle in ((extra, says), ([], "world_model.pt")):  # a bad flag first; then a run dir without a model
        torch.save({"script": "other.py"}, tmp_path / "world_model.pt")
        done = subprocess.run(
            [*refit, *flags, "--out", str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert needle in done.stderr and not (tmp_path / "o.jsonl").exists()


def test_reward_probe_refuses_what_is_not_a_world_model_it_can_read_in_one_line(tmp_path):
    """Format 3 (unknown), a format-1 file without the model in it, and --open-loop without the fresh head it
    scores: exit 2, one line, no record."""
    import torch

    tag = {"script": "simple_worldmodel_atari.py", "kind": "world_model"}
    probe = [sys.executable, str(REPO_ROOT / "benchmarks" / "simple_reward_probe.py"), str(tmp_path)]
    for saved, extra, says in (
        (tag | {"version": 3}, [], "world_model.pt"),
        (tag | {"version": 1}, [], "world_model.pt"),
        (tag | {"version": 1}, ["--open-loop", "50"], "--fresh-head"),
        (tag | {"version": 1}, ["--open-loop", "-3", "--fresh-head", "10"], "--open-loop"),
    ):
        torch.save(saved, tmp_path / "world_model.pt")
        done = subprocess.run([*probe, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert says in done.stderr and not list(tmp_path.glob("*.jsonl*"))


def test_lanes_run_their_queue_in_order_and_stop_at_the_first_failing_step(tmp_path):
    lanes = str(REPO_ROOT / "benchmarks" / "lanes.sh")
    out = tmp_path / "out"

    def lane(steps):
        env = {**os.environ, "LANE_STEPS": steps}
        return subprocess.run(["bash", lanes, "a"], capture_output=True, text=True, env=env, timeout=60)

    # `cat` would swallow the rest of the queue if a step read the lane's stdin
    done = lane(f"cat\necho one >> {out}\necho two >> {out}")
    assert done.returncode == 0 and "lane a: every step done" in done.stdout, done.stderr
    assert out.read_text() == "one\ntwo\n"
    out.unlink()
    stopped = lane(f"echo one >> {out}\nexit 3\necho never >> {out}")
    assert stopped.returncode == 3 and out.read_text() == "one\n"
    assert "lane a stopped: 'exit 3' exited 3; re-run 'bash benchmarks/lanes.sh a'" in stopped.stdout
    bad = subprocess.run(["bash", lanes, "c"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "usage:" in bad.stderr


@pytest.mark.parametrize("name", ["a", "b"])
def test_every_lane_step_names_a_target_its_script_has(name):
    cmd = ["bash", str(REPO_ROOT / "benchmarks" / "lanes.sh"), name, "--list"]
    queue = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert queue
    for step in queue:
        _, script, target, *_ = step.split()
        text = (REPO_ROOT / script).read_text()
        assert re.search(rf"^\s+{re.escape(target)}\)", text, re.M), f"{script} has no target {target}"


def test_digitizer_reads_known_curves_back_off_a_rendered_plot(tmp_path):
    """A plot drawn the reference's way (inward ticks, no top/right spines, its colours) from known values: the
    digitizer's numbers match them to about a pixel (3,500 return over 206 px here: ~17 per pixel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    digitizer = load_benchmark("digitize_paper_curves")
    x = np.arange(0, 1_000_000, 50_000)
    truth = {"filter": 1000 + 2.2e-3 * x, "hype": 3000 - 1.5e-3 * x, "mm": 500 + 1e-3 * x, "expert": 3500 + 0 * x}
    fig, ax = plt.subplots(figsize=(4.77, 3.21), dpi=100)
    for name, y in truth.items():
        ax.plot(x, y, color=digitizer.COLOURS[name], ls="--" if name == "expert" else "-", lw=1.5)
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(direction="in", length=5, width=1, colors="black")
    ax.set_xticks([0, 2e5, 4e5, 6e5, 8e5])
    ax.set_yticks([0, 1000, 2000, 3000])
    ax.set_ylim(-200, 3700)
    fig.tight_layout()
    fig.savefig(tmp_path / "plot.png")
    rgb = (mpimg.imread(tmp_path / "plot.png")[..., :3] * 255).round().astype(np.uint8)
    got = digitizer.digitize(rgb, [0, 2e5, 4e5, 6e5, 8e5], [3000, 2000, 1000, 0], list(x[1:]), (0, 0, 0, 0))
    for name, y in truth.items():
        read = np.array([np.nan if v is None else v for v in got[name]], dtype=float)
        assert np.nanmax(np.abs(read - y[1:])) < 40, (name, read, y[1:])
        assert np.isnan(read).sum() <= 3  # only where lines cross


def test_digitizer_refuses_ticks_it_cannot_match():
    digitizer = load_benchmark("digitize_paper_curves")
    assert digitizer.axis_map([10, 20, 30], [0, 1, 2]) == pytest.approx((0.1, -1.0))
    with pytest.raises(SystemExit, match="found 3 tick marks"):
        digitizer.axis_map([10, 20, 30], [0, 1])
    with pytest.raises(SystemExit, match="not evenly spaced"):
        digitizer.axis_map([10, 20, 40], [0, 1, 2])


def test_coverage_reads_the_players_cell_from_montezumas_ram():
    coverage = load_benchmark("rnd_coverage")
    ram = np.zeros(128, dtype=np.uint8)
    ram[[3, 42, 43]] = 1, 77, 235  # the first room's start: x 77, y 235
    assert coverage.cell(ram) == (1, 9, 29)
    games = coverage.play(None, coverage.rnd.EnvArgs(), games=1, seed=3)  # random actions, one whole game
    assert games["lengths"][0] > 0 and games["returns"] == [0.0]
    assert (1, 9, 29) in games["cells"][0] and len(games["cells"][0]) > 1  # it starts there, then moves
