"""The contract tests that filter_irl_mujoco.py and hype_irl_mujoco.py share word for word (the same flags, files,
exit codes and messages), written once. Each of tests/test_filter_irl_mujoco.py and tests/test_hype_irl_mujoco.py
imports them and defines the fixtures they use: `irl` (the script's module) and `finished_run` (a finished tiny run
on InvertedPendulum-v5: run dir, demos file, its command's arguments), so pytest runs each test once per script."""

from __future__ import annotations

import math
import shutil
import signal

import pytest
import torch
from conftest import (
    MUJOCO_ENV_ID_CASES,
    assert_long_paths_refused,
    assert_same_weights_and_eval_returns,
    assert_vp9_video,
    check_eval_only_signal_writes_nothing,
    check_help_groups,
    check_irl_run_files_corrupted,
    check_video_signal_leaves_no_file,
    eval_only_twice,
    file_bytes,
    mujoco_rendering_available,
    one_line_exit_2,
    quiet_main,
    run_script_subprocess,
)

PENDULUM = "InvertedPendulum-v5"
__all__ = [  # what each test file imports and pytest then runs there
    "test_same_seed_and_threads_give_identical_weights_and_scores",
    "test_eval_only_writes_numbered_evaluations_and_a_video",
    "test_env_ids_of_other_families_retired_versions_and_near_misses",
    "test_bad_input_from_the_command_line_has_no_traceback",
    "test_finished_run_is_never_overwritten_and_exits_0",
    "test_each_corrupt_file_of_a_finished_run_gives_exit_2_or_a_clean_redo",
    "test_help_is_grouped_by_phase",
    "test_non_finite_loss_exits_3_with_one_line_naming_the_phase_and_step",
    "test_a_finished_run_rerun_with_other_flags_exits_2_naming_them",
    "test_a_signal_during_eval_only_exits_130_within_10_s_and_writes_nothing",
    "test_a_signal_while_a_video_is_encoded_leaves_no_file",
    "test_paths_the_file_system_cannot_hold_are_refused_before_anything_is_made",
]


def script_of(irl) -> str:
    return f"{irl.__name__}.py"


def run_quietly(irl, args: list, timeout: float = 300):
    return run_script_subprocess(script_of(irl), *args, timeout=timeout)


def test_same_seed_and_threads_give_identical_weights_and_scores(irl, finished_run, tmp_path):
    run_dir, _, args = finished_run
    rc, _, err = run_quietly(irl, args + ["--run-dir", tmp_path / "again"])
    assert rc == 0, err[-2000:]
    assert_same_weights_and_eval_returns(irl.load_policy, run_dir, tmp_path / "again")


def test_eval_only_writes_numbered_evaluations_and_a_video(irl, finished_run, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run[0], run_dir)
    video = ["--capture-video"] if mujoco_rendering_available(irl, PENDULUM) else []
    for record in eval_only_twice(
        lambda: run_quietly(irl, ["--eval-only", run_dir, "--eval.episodes", 2, *video]), run_dir
    ):
        assert record["env_id"] == PENDULUM and len(record["returns"]) == 2 and math.isfinite(record["mean"])
    if not video:
        pytest.skip("MuJoCo cannot render off-screen here (install libegl1 or OSMesa): video not checked")
    assert_vp9_video(run_dir / "videos" / "eval_002.webm", irl.VIDEO_SIZE)


@pytest.mark.parametrize("env_id, message", MUJOCO_ENV_ID_CASES)
def test_env_ids_of_other_families_retired_versions_and_near_misses(irl, tmp_path, env_id, message):
    line = one_line_exit_2(lambda: irl.main(["--env-id", env_id, "--run-dir", str(tmp_path / "r")]))
    assert message in line and "--env-id" in line, line


def test_bad_input_from_the_command_line_has_no_traceback(irl, run_script, run_dir):
    rc, out, err = run_script(script_of(irl), "--env-id", "Hoper-v5", "--run-dir", run_dir, timeout=120)
    assert rc == 2 and err.strip().splitlines() == [err.strip()] and "did you mean Hopper-v5" in err, err
    assert not run_dir.exists()


def test_finished_run_is_never_overwritten_and_exits_0(irl, finished_run):
    run_dir = finished_run[0]
    before = file_bytes(run_dir)
    rc, out, err = run_quietly(irl, ["--run-dir", run_dir])
    assert rc == 0 and "already holds a finished run" in out, err
    assert file_bytes(run_dir) == before


def test_each_corrupt_file_of_a_finished_run_gives_exit_2_or_a_clean_redo(irl, finished_run, tmp_path):
    """Generated: every file of a finished run dir, truncated or replaced by random bytes, then the command re-run
    (results.json removed so that the resume path reads the artifacts): exit 2 with one line naming the file, or a
    clean redo that finishes (exit 0); never a traceback."""
    source, demos, _ = finished_run
    check_irl_run_files_corrupted(irl.main, source, demos, tmp_path)


def test_help_is_grouped_by_phase(irl):
    check_help_groups(
        lambda: irl.main(["--help"]),
        groups=("expert", "sac", "disc", "irl", "eval"),
        flags=("--irl.total-timesteps", "--sac.learning-starts", "--eval.episodes"),
    )


def test_non_finite_loss_exits_3_with_one_line_naming_the_phase_and_step(irl, finished_run, tmp_path, monkeypatch):
    _, _, args = finished_run
    monkeypatch.setattr(irl, "relabel_rewards", lambda disc, obs, act: torch.full((len(obs),), float("nan")))
    argv = [*map(str, args), "--run-dir", str(tmp_path / "nan"), "--log-frequency", "10"]
    code, err = quiet_main(lambda: irl.main(argv))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 3 and len(errors) == 1, err[-2000:]
    assert "IRL learner: non-finite qf_loss" in errors[0] and "at step 70" in errors[0], errors
    assert not (tmp_path / "nan" / "results.json").exists()


def test_a_finished_run_rerun_with_other_flags_exits_2_naming_them(irl, finished_run):
    """Issue 48 item 6: the same flags -> exit 0 "nothing to do" (the test above); a flag that differs from args.json
    -> exit 2, one line naming each such flag with both values; nothing written."""
    run_dir = finished_run[0]
    before = file_bytes(run_dir)
    argv = ["--run-dir", str(run_dir), "--seed", "4", "--irl.total-timesteps", "240"]
    line = one_line_exit_2(lambda: irl.main(argv))
    assert "--seed 4 (was 3)" in line and "--irl.total-timesteps 240 (was 120)" in line, line
    assert file_bytes(run_dir) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_eval_only_exits_130_within_10_s_and_writes_nothing(irl, finished_run, tmp_path, signum):
    check_eval_only_signal_writes_nothing(script_of(irl), finished_run[0], tmp_path, signum)


def test_a_signal_while_a_video_is_encoded_leaves_no_file(irl, tmp_path):
    check_video_signal_leaves_no_file(irl, tmp_path)


def test_paths_the_file_system_cannot_hold_are_refused_before_anything_is_made(irl, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_long_paths_refused(irl.main, tmp_path, ("--run-dir", "--eval-only", "--expert.experts-dir", "--expert.path"))
