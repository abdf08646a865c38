"""Tests of rnd_ppo_atari.py: the RND math against hand computations, a novelty behaviour test, a smoke run,
a 2-rank torchrun run, resume after SIGTERM and the documented bad inputs."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rnd_ppo_atari as rnd
from conftest import REPO_ROOT, subprocess_env

SCRIPT = "rnd_ppo_atari.py"
# Tiny budgets: 4 envs x 16 steps per iteration, episodes capped at 100 agent steps, one short evaluation.
TINY = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
        "--num-iterations-obs-norm-init", "1", "--max-episode-frames", "400", "--eval-episodes", "1",
        "--no-progress-bar"]


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list] = {}
    for ev in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(ev))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Unit tests of the math
# ---------------------------------------------------------------------------------------------------------------
def test_reward_filter_runs_over_time_per_env_with_steps_not_equal_envs():
    # T = 3 steps, N = 2 envs (CleanRL #360 filtered over envs and hid behind 128 = 128).
    rewards = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    state = torch.tensor([0.5, 0.0])
    filtered, new_state = rnd.discounted_reward_filter(rewards, state, gamma=0.5)
    # env 0: 0.5*0.5+1 = 1.25, 1.25*0.5+2 = 2.625, 2.625*0.5+3 = 4.3125; env 1: 10, 25, 42.5
    expected = torch.tensor([[1.25, 10.0], [2.625, 25.0], [4.3125, 42.5]])
    torch.testing.assert_close(filtered, expected)
    torch.testing.assert_close(new_state, torch.tensor([4.3125, 42.5]))
    # the state carries over to the next rollout (never reset at episode ends)
    again, _ = rnd.discounted_reward_filter(torch.zeros(1, 2), new_state, gamma=0.5)
    torch.testing.assert_close(again, torch.tensor([[2.15625, 21.25]]))


def test_intrinsic_reward_divided_by_std_of_all_filtered_values():
    rewards = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    filtered, _ = rnd.discounted_reward_filter(rewards, torch.zeros(2), gamma=0.5)
    rms = rnd.RunningMeanStd((), "cpu")
    rms.update(filtered.reshape(-1), rnd.World())
    values = np.array([1.0, 2.5, 4.25, 10.0, 25.0, 42.5])  # all T*N filtered values, count 6 (not N or T)
    assert rms.count == pytest.approx(6 + 1e-4)
    assert rms.var.item() == pytest.approx(values.var(), rel=1e-3)
    normalised = rewards / torch.sqrt(rms.var.float())  # no mean subtraction
    torch.testing.assert_close(normalised, rewards / math.sqrt(values.var()), rtol=1e-3, atol=1e-4)


def test_merge_moments_matches_numpy_on_concatenated_data():
    rng = np.random.default_rng(0)
    a, b = rng.normal(3.0, 2.0, (100, 5)), rng.normal(-1.0, 0.5, (37, 5))
    mean, var, count = rnd.merge_moments(
        torch.tensor(a.mean(0)), torch.tensor(a.var(0)), 100.0, torch.tensor(b.mean(0)), torch.tensor(b.var(0)), 37.0
    )
    both = np.concatenate([a, b])
    np.testing.assert_allclose(mean.numpy(), both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), both.var(0), rtol=1e-12)
    assert count == 137
    # the running normaliser folded batch by batch ends where one pass over all the data does
    rms = rnd.RunningMeanStd((5,), "cpu")
    for chunk in np.array_split(both, 4):
        rms.update(torch.tensor(chunk), rnd.World())
    np.testing.assert_allclose(rms.mean.numpy(), both.mean(0), rtol=1e-5)
    np.testing.assert_allclose(rms.var.numpy(), both.var(0), rtol=1e-5)


def test_gae_intrinsic_is_non_episodic_and_extrinsic_is_episodic():
    r = torch.tensor([[1.0], [0.0], [2.0]])
    v = torch.tensor([[0.5], [1.0], [0.0]])
    nv = torch.tensor([4.0])
    firsts = torch.tensor([[0.0], [0.0], [1.0]])  # obs 2 starts a new episode: step 1 was terminal
    gamma, lam = 0.5, 0.5
    # non-episodic: deltas 1+0.5-0.5=1, 0+0-1=-1, 2+2-0=4; A2=4, A1=-1+0.25*4=0, A0=1+0.25*0=1
    adv, ret = rnd.compute_gae(r, v, torch.zeros_like(firsts), nv, torch.zeros(1), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor([[1.0], [0.0], [4.0]]))
    torch.testing.assert_close(ret, adv + v)
    # episodic: step 1 does not bootstrap and A stops at the boundary: A2=4, A1=-1, A0=1+0.25*-1=0.75
    adv_e, _ = rnd.compute_gae(r, v, firsts, nv, torch.zeros(1), gamma, lam)
    torch.testing.assert_close(adv_e, torch.tensor([[0.75], [-1.0], [4.0]]))


def test_rnd_inputs_are_whitened_last_frames_clipped_to_five():
    frames = torch.tensor([[[0, 100], [200, 255]]], dtype=torch.uint8)  # (1, 2, 2)
    mean, var = torch.full((2, 2), 100.0), torch.full((2, 2), 100.0)
    x = rnd.normalize_frames(frames, mean, var, clip=5.0)
    assert x.shape == (1, 1, 2, 2)
    torch.testing.assert_close(x[0, 0], torch.tensor([[-5.0, 0.0], [5.0, 5.0]]), rtol=0, atol=1e-4)


def test_bonus_is_mean_over_features_and_subsample_is_exact_fraction():
    pred, target = torch.zeros(2, 4), torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(rnd.rnd_errors(pred, target), torch.tensor([1.0, 1.0]))
    idx = rnd.predictor_subsample(4096, 0.25, "cpu")
    assert idx.numel() == 1024 and idx.unique().numel() == 1024
    assert rnd.predictor_subsample(3, 0.01, "cpu").numel() == 1


def test_ppo_policy_loss_clips_the_ratio():
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))
    adv = torch.tensor([1.0, -1.0])
    pg, approx_kl, clipfrac = rnd.ppo_policy_loss(new, old, adv, clip_coef=0.1)
    # sample 0: max(-1.5, -1.1) = -1.1 ; sample 1: max(0.5, 0.9) = 0.9 -> mean -0.1
    assert pg.item() == pytest.approx(-0.1)
    assert clipfrac.item() == 1.0
    assert approx_kl.item() == pytest.approx(((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2)


def test_env_ids_map_to_roms_and_unknown_ids_name_close_matches():
    assert rnd.rom_name("MontezumaRevengeNoFrameskip-v4") == "montezuma_revenge"
    assert rnd.rom_name("ALE/MontezumaRevenge-v5") == "montezuma_revenge"
    assert rnd.check_env_id("ALE/MsPacman-v5") == "ms_pacman"
    with pytest.raises(rnd.UsageError, match="MontezumaRevengeNoFrameskip-v4"):
        rnd.check_env_id("MontezumasRevengeNoFrameskip-v4")


def test_policy_and_gru_shapes_and_state_reset():
    torch.manual_seed(0)
    agent = rnd.Agent(18, rnn_hidden_layers=1)
    obs = torch.randint(0, 255, (3, 2, 4, 84, 84), dtype=torch.uint8)
    state = torch.randn(1, 2, 256)
    firsts = torch.zeros(3, 2)
    logits, v_e, v_i, s1 = agent(obs, state, firsts)
    assert logits.shape == (6, 18) and v_e.shape == v_i.shape == (6,) and s1.shape == (1, 2, 256)
    # a first flag at t=0 must make the output independent of the incoming state
    a, *_ = agent(obs, state, torch.ones(3, 2))
    b, *_ = agent(obs, torch.randn(1, 2, 256), torch.ones(3, 2))
    torch.testing.assert_close(a, b)
    c, *_ = agent(obs, torch.randn(1, 2, 256), firsts)
    assert not torch.allclose(a, c)


# ---------------------------------------------------------------------------------------------------------------
# Behaviour: familiar frames earn a much lower bonus than novel frames after predictor training
# ---------------------------------------------------------------------------------------------------------------
def test_predictor_training_makes_familiar_frames_less_rewarding_than_novel_ones():
    torch.manual_seed(0)
    model = rnd.RNDModel()
    opt = torch.optim.Adam(model.predictor.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    # "rooms": smooth blobs at different positions, as uint8 frames, whitened by their own statistics
    def frames(centres):
        yy, xx = torch.meshgrid(torch.arange(84.0), torch.arange(84.0), indexing="ij")
        return torch.stack([(255 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 120.0)).to(torch.uint8) for cy, cx in centres])
    seen = frames([(20, 20), (20, 60), (40, 40), (60, 20)])
    novel = frames([(60, 60), (75, 10), (10, 75), (45, 75)])
    mean, var = seen.float().mean(0), seen.float().var(0) + 25.0
    x_seen, x_novel = (rnd.normalize_frames(f, mean, var, 5.0) for f in (seen, novel))
    with torch.no_grad():
        before_seen = model.errors(x_seen).mean().item()
    for _ in range(60):
        loss = model.errors(x_seen[torch.randint(0, 4, (4,), generator=gen)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after_seen, after_novel = model.errors(x_seen).mean().item(), model.errors(x_novel).mean().item()
    assert after_seen < 0.2 * before_seen
    assert after_novel > 5 * after_seen
    assert all(p.grad is None for p in model.target.parameters())  # the target stays fixed


# ---------------------------------------------------------------------------------------------------------------
# Subprocess runs of the real command
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_run_writes_all_artifacts(run_script, run_dir):
    rc, out, err = run_script(SCRIPT, "--env-id", "MontezumaRevengeNoFrameskip-v4", *TINY, "--total-timesteps", "192",
                              "--capture-video", "--run-dir", run_dir, timeout=240)
    assert rc == 0, err[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    for key in ("eval_mean_return", "eval_std_return", "global_step", "sps", "visited_rooms"):
        assert math.isfinite(res[key]), key
    assert res["global_step"] == 192 and res["iterations"] == 3 and res["frames"] == 768
    assert res["visited_rooms"] >= 1 and res["eval_lengths"][0] <= 100  # RAM[3] rooms; 400-frame cap = 100 steps
    assert json.loads((run_dir / "args.json").read_text())["batch_size"] == 64
    assert [p.name for p in rnd.checkpoint_paths(run_dir)] == ["ckpt_00000003.pt"]
    ckpt = torch.load(rnd.checkpoint_paths(run_dir)[0], weights_only=False)
    assert {"agent", "rnd", "optimizer", "obs_rms", "reward_rms", "filter_state", "rng", "global_step"} <= set(ckpt)
    assert ckpt["obs_rms"]["count"] > 16 * 4 * 3  # warm-up (64 frames) + 3 rollouts of next frames
    tags = scalars(run_dir)
    for tag in ("charts/SPS", "charts/learning_rate", "losses/policy_loss", "losses/value_loss", "rnd/predictor_loss",
                "rnd/intrinsic_reward", "rnd/intrinsic_return", "rnd/extrinsic_return", "charts/visited_rooms",
                "eval/episodic_return"):
        assert tag in tags and all(math.isfinite(v) for _, v in tags[tag]), tag
    assert [s for s, _ in tags["charts/SPS"]] == [128, 192]  # SPS starts after the first iteration
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert list((run_dir / "videos").glob("*.mp4"))
    # a finished run is never overwritten
    before = (run_dir / "results.json").read_bytes()
    rc, out, err = run_script(SCRIPT, "--env-id", "MontezumaRevengeNoFrameskip-v4", *TINY, "--total-timesteps", "192",
                              "--run-dir", run_dir, timeout=60)
    assert rc == 2 and "new --run-dir" in err and len(err.strip().splitlines()) == 1
    assert (run_dir / "results.json").read_bytes() == before


@pytest.mark.slow
def test_torchrun_two_ranks_end_with_identical_weights(run_dir):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", SCRIPT, "--env-id", "BreakoutNoFrameskip-v4",
           "--num-envs", "2", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "2",
           "--num-iterations-obs-norm-init", "1", "--total-timesteps", "64", "--eval-episodes", "0",
           "--rnn-hidden-layers", "1", "--no-progress-bar", "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["world_size"] == 2 and res["global_step"] == 64 and res["iterations"] == 2 and res["policy"] == "gru"
    sums = res["rank_param_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]  # gradients all-reduced: same weights on both ranks
    assert res["rank_obs_checksums"][0] != res["rank_obs_checksums"][1]  # ...from different envs/seeds
    norms = res["rank_normaliser_checksums"]
    assert len(norms) == 2 and norms[0] == norms[1]  # observation and reward statistics merged across ranks


@pytest.mark.slow
def test_resume_after_sigterm_continues_from_saved_iteration(run_dir):
    args = [sys.executable, SCRIPT, "--env-id", "BreakoutNoFrameskip-v4", *TINY, "--checkpoint-every", "1",
            "--keep-checkpoints", "2", "--run-dir", str(run_dir)]
    proc = subprocess.Popen([*args, "--total-timesteps", "64000"], cwd=REPO_ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not rnd.checkpoint_paths(run_dir) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by signal" in out and not (run_dir / "results.json").exists()
    saved = torch.load(rnd.checkpoint_paths(run_dir)[-1], weights_only=False)
    k = saved["iteration"]
    assert k >= 1 and saved["global_step"] == 64 * k
    rc = subprocess.run([*args, "--total-timesteps", str(64 * (k + 2))], cwd=REPO_ROOT, env=subprocess_env(),
                        capture_output=True, text=True, timeout=180)
    assert rc.returncode == 0, rc.stderr[-3000:]
    assert f"from iteration {k} (global step {64 * k})" in rc.stdout
    res = json.loads((run_dir / "results.json").read_text())
    assert res["iterations"] == k + 2 and res["global_step"] == 64 * (k + 2)
    assert [p.name for p in rnd.checkpoint_paths(run_dir)] == [f"ckpt_{k + 1:08d}.pt", f"ckpt_{k + 2:08d}.pt"]
    steps = [s for s, _ in scalars(run_dir)["losses/policy_loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 64 * (k + 2)  # continued, not restarted at step 64


@pytest.mark.slow
def test_target_score_stops_plain_ppo_early(run_script, run_dir):
    # --int-coef 0 is the paper's PPO baseline: no bonus, no predictor training
    rc, out, err = run_script(SCRIPT, "--env-id", "BreakoutNoFrameskip-v4", *TINY, "--max-episode-frames", "40",
                              "--target-score", "-1", "--target-score-window", "1", "--eval-episodes", "0",
                              "--int-coef", "0", "--total-timesteps", "6400", "--run-dir", run_dir, timeout=120)
    assert rc == 0, err[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["stop_reason"] == "target_score" and res["iterations"] == 1 and res["train_episodes_in_mean"] == 1
    tags = scalars(run_dir)
    assert [v for _, v in tags["rnd/predictor_loss"]] == [0.0] and [v for _, v in tags["rnd/intrinsic_reward"]] == [0.0]


# ---------------------------------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming the fix, nothing written
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--env-id", "MontezumasRevengeNoFrameskip-v4"], "MontezumaRevengeNoFrameskip-v4"),
        (["--num-envs", "6", "--num-minibatches", "4"], "multiple of num-minibatches"),
        (["--total-timesteps", "100", "--num-envs", "4", "--num-steps", "32"], "raise --total-timesteps"),
        (["--update-proportion", "0"], "--update-proportion"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_no_run_dir(run_script, run_dir, extra, needle):
    rc, out, err = run_script(SCRIPT, "--run-dir", run_dir, *extra, timeout=60)
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not run_dir.exists()


def test_corrupt_snapshot_exits_2_and_names_the_file(run_script, run_dir):
    (run_dir / "checkpoints").mkdir(parents=True)
    bad = run_dir / "checkpoints" / "ckpt_00000002.pt"
    bad.write_bytes(b"not a checkpoint")
    rc, out, err = run_script(SCRIPT, "--env-id", "BreakoutNoFrameskip-v4", *TINY, "--total-timesteps", "128",
                              "--run-dir", run_dir, timeout=60)
    assert rc == 2 and str(bad) in err and "delete it" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run_dir.rglob("*")) == ["checkpoints", "ckpt_00000002.pt"]


def test_resume_with_a_different_network_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    saved = {"env_id": "MontezumaRevengeNoFrameskip-v4", "rnn_hidden_layers": 0, "rnn_hidden_size": 256}
    torch.save({"agent": {}, "iteration": 3, "args": saved}, run_dir / "checkpoints" / "ckpt_00000003.pt")
    ok = rnd.Args(run_dir=str(run_dir))
    assert rnd.prepare_run(ok, rnd.World())[1]["iteration"] == 3
    with pytest.raises(rnd.UsageError, match="--rnn-hidden-layers 0: resume with the same values"):
        rnd.prepare_run(rnd.Args(run_dir=str(run_dir), rnn_hidden_layers=1), rnd.World())
