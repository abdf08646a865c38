"""Budgets are exact (issue 48, docs/CONTRACT.md): a run stops at its budget flag, or at the first whole batch
that reaches it, never short of it and never a batch past it. One tiny run per script, each with a budget that is
NOT a multiple of its batch, checked against the count worked out by hand in the test (not the script's own
arithmetic) in results.json or the checkpoint. preference_ga3c_atari.py is tested in its own file.

A script that does not keep the rule yet is marked xfail(strict=True) with the count it gives, so the test flips
(and fails as an unexpected pass) the day it is fixed."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import MUJOCO_IRL_TINY
from test_mbirl_antmaze import ENV as MAZE
from test_mbirl_antmaze import TINY as MBIRL_TINY
from test_rnd_ppo_atari import TINY as RND_TINY
from test_simple_worldmodel_atari import TINY as SIMPLE_TINY
from test_trex_ppo_atari import TINY as TREX_TINY

PENDULUM = "InvertedPendulum-v5"


def flag_value(flags: list, name: str) -> str:
    """The value a tiny flag list gives `name` (so a change to the shared tiny flags shows up here as a failure)."""
    return str(flags[flags.index(name) + 1])


def checkpoint(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.slow
def test_trex_ppo_phase_stops_at_the_first_whole_batch_reaching_its_budget(run_script, tmp_path):
    # 2 envs x 32 steps = batches of 64 agent steps; 100 is reached by the 2nd batch: 128 steps, 2 iterations
    assert (flag_value(TREX_TINY, "--ppo.num-envs"), flag_value(TREX_TINY, "--ppo.num-steps")) == ("2", "32")
    run_dir = tmp_path / "run"
    flags = ["--run-dir", run_dir, *TREX_TINY, "--demonstrator.total-timesteps", 100, "--stop-after", "demonstrator"]
    rc, _, err = run_script("trex_ppo_atari.py", *flags, "--demonstrator.snapshot-every", 1, timeout=300)
    assert rc == 0, err[-2000:]
    state = checkpoint(run_dir / "checkpoints" / "demonstrator.pt")["state"]
    assert state["done"] and (state["iteration"], state["global_step"]) == (2, 128), state


@pytest.mark.slow
def test_rnd_stops_at_the_first_whole_batch_reaching_its_budget(run_script, tmp_path):
    # 4 envs x 16 steps = batches of 64 agent steps; 100 is reached by the 2nd batch: 128 steps, 2 iterations
    assert (flag_value(RND_TINY, "--ppo.num-envs"), flag_value(RND_TINY, "--ppo.num-steps")) == ("4", "16")
    run_dir = tmp_path / "run"
    flags = ["--env-id", "MontezumaRevengeNoFrameskip-v4", *RND_TINY, "--torch-threads", 1]
    rc, _, err = run_script("rnd_ppo_atari.py", *flags, "--ppo.total-timesteps", 100, "--run-dir", run_dir)
    assert rc == 0, err[-2000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert (res["iterations"], res["global_step"]) == (2, 128), res


@pytest.mark.slow
def test_simple_collects_its_documented_real_steps(run_script, tmp_path):
    """--loop.real-steps counts the policy's collections; one more equal collection of random play comes first
    (--help). 130 over 2 epochs = 65 per epoch, a whole step of 2 envs: 66 (33 steps each); 3 collections of 66."""
    assert (flag_value(SIMPLE_TINY, "--loop.epochs"), flag_value(SIMPLE_TINY, "--env.num-envs")) == ("2", "2")
    run_dir = tmp_path / "run"
    rc, _, err = run_script("simple_worldmodel_atari.py", *SIMPLE_TINY, "--loop.real-steps", 130, "--run-dir", run_dir)
    assert rc == 0, err[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["real_steps"] == 198, res["real_steps"]


@pytest.mark.slow
def test_simple_model_free_stops_at_the_first_whole_rollout_reaching_its_budget(run_script, tmp_path):
    # the budget of the SimPLe run it is compared with: --loop.real-steps 128 over 2 epochs of 2 envs -> 64 per
    # collection, 3 collections (1 random) = 192 real steps; rollouts of 2 envs x 10 steps = 20 -> 10 rollouts, 200
    assert (flag_value(SIMPLE_TINY, "--loop.real-steps"), flag_value(SIMPLE_TINY, "--ppo.num-steps")) == ("128", "10")
    run_dir = tmp_path / "run"
    rc, _, err = run_script("simple_worldmodel_atari.py", *SIMPLE_TINY, "--mode", "model-free", "--run-dir", run_dir)
    assert rc == 0, err[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["real_steps"] == 200


# FILTER and HyPE step one env at a time: both phases stop exactly at their budgets. From nothing: a 130-step SAC
# expert, 2 demos, then 130 policy steps with an outer iteration (fresh trajectories, a discriminator update) every
# 60 steps: at steps 0, 60 and 120 -> 3; one evaluation at the end (--eval.frequency above the budget).
MUJOCO_BUDGET = ["--env-id", PENDULUM, "--expert.timesteps", 130, "--expert.num-demos", 2, "--sac.learning-starts", 50]
MUJOCO_BUDGET += ["--irl.total-timesteps", 130, "--irl.train-every", 60, "--eval.frequency", 1000, *MUJOCO_IRL_TINY]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, history_key", [("filter_irl_mujoco.py", "policy_steps"), ("hype_irl_mujoco.py", "step")]
)
def test_mujoco_irl_phases_stop_exactly_at_their_budgets(run_script, tmp_path, script, history_key):
    run_dir, experts = tmp_path / "run", tmp_path / "experts"
    flags = [*MUJOCO_BUDGET, "--expert.experts-dir", experts, "--torch-threads", 1, "--run-dir", run_dir]
    if script == "hype_irl_mujoco.py":
        flags += ["--max-episode-steps", 200]  # (its tests' tiny horizon)
    rc, _, err = run_script(script, *flags, timeout=600)
    assert rc == 0, err[-3000:]
    assert checkpoint(run_dir / "checkpoints" / "expert.pt")["progress"]["step"] == 130
    assert checkpoint(run_dir / "checkpoints" / "irl.pt")["progress"]["step"] == 130
    res = json.loads((run_dir / "results.json").read_text())
    assert (res["policy_env_steps"], res["outer_iterations"]) == (130, 3), res
    assert [h[history_key] for h in res["history"]] == [130]


@pytest.mark.slow
def test_mbirl_stops_exactly_at_its_budget(run_script, tmp_path):
    """One real env step at a time: 650 real steps. Exploration ends at step 100; the model is retrained when the
    loop's learner buffer is first empty (step 101) and every 250 steps before the end (250, 500) -> 3; the
    discriminator every 200 steps (200, 400, 600) -> 3; evaluations at 0, every 300 steps and at the end."""
    assert flag_value(MBIRL_TINY, "--disc.every") == "200" and flag_value(MBIRL_TINY, "--eval.frequency") == "300"
    assert flag_value(MBIRL_TINY, "--hyper.freq-train-model") == "250"
    run_dir = tmp_path / "run"
    flags = ["--env-id", MAZE, *MBIRL_TINY, "--hyper.total-timesteps", 650, "--torch-threads", 1]
    rc, _, err = run_script("mbirl_antmaze.py", *flags, "--expert.experts-dir", tmp_path / "x", "--run-dir", run_dir)
    assert rc == 0, err[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert (res["real_steps"], res["model_trainings"], res["disc_updates"]) == (650, 3, 3), res
    assert [h["step"] for h in res["history"]] == [0, 300, 600, 650]
