"""Tests of trex_ppo_atari.py: the math, reward learning and the learned reward's path into PPO, the whole pipeline,
the user contract (policy.pt snippet, --eval-only, video, exit codes, reproducibility), resume, generated bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from atari_contract import *  # noqa: F403  the bad-input tests shared with rnd_ppo_atari.py, run on this script
from conftest import (
    REPO_ROOT,
    check_eval_only_signal_writes_nothing,
    check_foreign_run_dirs_refused,
    check_help_groups,
    check_numeric_flag_cases,
    corrupted,
    each_file_corrupted,
    eval_only_twice,
    exit_2_naming_the_file,
    interrupt_when_exists,
    interrupt_when_found,
    keep_signals,
    mutated_arrays,
    numeric_flag_cases,
    one_line_exit_2,
    printed_resume_command,
    quiet_main,
    run_contract_snippet,
)

import trex_ppo_atari as trex

SCRIPT = "trex_ppo_atari.py"
# Tiny PPO settings shared by the runs: 2 envs x 32 steps per iteration, short games.
TINY = ["--ppo.num-envs", "2", "--ppo.num-steps", "32", "--ppo.num-minibatches", "2", "--ppo.update-epochs", "1"]
TINY += ["--env.max-episode-frames", "1200", "--eval.num-envs", "2", "--torch-threads", "1"]
TINY_REWARD = [
    "--reward.num-pairs",
    "20",
    "--reward.batch-size",
    "4",
    "--reward.min-len",
    "10",
    "--reward.max-len",
    "20",
]


# ----------------------------------------------------------------------------------------------- unit: math
def test_trex_loss_matches_hand_computed_values():
    ra, rb = torch.tensor([1.0, 0.0, 3.0]), torch.tensor([2.0, 0.0, 1.0])
    label = torch.tensor([1, 0, 0])  # b better, tie, a better
    # -log(e^2/(e^1+e^2)) = log(1+e^-1); -log(1/2); -log(e^3/(e^3+e^1)) = log(1+e^-2)
    expected = (math.log1p(math.exp(-1)) + math.log(2) + math.log1p(math.exp(-2))) / 3
    assert trex.trex_loss(ra, rb, label).item() == pytest.approx(expected, rel=1e-6)


def test_trex_loss_is_stable_for_large_returns():
    ra = torch.tensor([1e4, -3e4], requires_grad=True)
    rb = torch.tensor([0.0, 3e4], requires_grad=True)
    loss = trex.trex_loss(ra, rb, torch.tensor([1, 0]))  # both wrong by a huge margin
    assert loss.item() == pytest.approx((1e4 + 6e4) / 2, rel=1e-6)
    loss.backward()
    assert torch.isfinite(ra.grad).all() and torch.isfinite(rb.grad).all()
    right = trex.trex_loss(torch.tensor([1e4]), torch.tensor([0.0]), torch.tensor([0]))
    assert right.item() == pytest.approx(0.0, abs=1e-6)


def test_compute_gae_with_more_steps_than_envs():
    # T = 3 steps, N = 2 envs; env 1 gets a done with its obs at t = 2 (so t = 1 does not bootstrap).
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    values = torch.tensor([[0.5, 1.0], [0.2, 0.4], [0.1, 0.3]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    next_value, next_done = torch.tensor([0.7, 0.9]), torch.tensor([1.0, 0.0])
    g, lam = 0.9, 0.5
    adv, ret = trex.compute_gae(rewards, values, dones, next_value, next_done, g, lam)
    # by hand, delta_t = r_t + 0.9 * V_t+1 * nonterminal - V_t and A_t = delta_t + 0.45 * nonterminal * A_t+1:
    # env 0 ends after t = 2 (next_done): deltas 0.68, -0.11, 0.9 -> A = 0.81275, 0.295, 0.9
    # env 1 does not bootstrap across its done at t = 2: deltas -0.64, 1.6, 1.51 -> A = 0.08, 1.6, 1.51
    expected = torch.tensor([[0.81275, 0.08], [0.295, 1.6], [0.9, 1.51]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[1.31275, 1.08], [0.495, 2.0], [1.0, 1.81]]), atol=1e-6)


def test_policy_rewards_come_from_the_next_frame_and_close_games():
    # A fake reward net that reads a frame's constant pixel value: frame value 10*t + n for s_t of env n.
    T, N = 3, 2
    frames = torch.zeros(T, N, 84, 84, 4, dtype=torch.uint8)
    for t in range(T):
        for n in range(N):
            frames[t, n] = 10 * t + n
    next_obs = torch.stack([torch.full((4, 84, 84), 30 + n, dtype=torch.uint8) for n in range(N)])
    final = torch.full((1, 4, 84, 84), 99, dtype=torch.uint8)  # only env 0's game ended at t = 0

    def net(obs):
        return obs.float().mean(dim=(1, 2, 3))

    r_hat = trex.next_frame_reward_hat(net, frames, next_obs, {0: (np.array([0]), final)}, chunk=4)
    assert r_hat.tolist() == [[99.0, 11.0], [20.0, 21.0], [30.0, 31.0]]  # env 1 keeps its own next frame at t = 0
    # game sums: env 1's game ends after t = 1, env 0's after t = 2; env 0 carries 5 in from the last rollout
    running = torch.tensor([5.0, 0.0])
    over = np.array([[False, False], [False, True], [True, False]])
    sums = trex.finished_game_sums(r_hat, over, running)
    assert [s.tolist() for s in sums] == [[11.0 + 21.0], [5.0 + 99.0 + 20.0 + 30.0]]
    assert running.tolist() == [0.0, 31.0]


def test_policy_reward_kinds():
    r_hat = torch.tensor([[0.0, 2.0], [-2.0, 4.0]])
    rms = trex.RunningMeanStd("cpu")
    torch.testing.assert_close(trex.policy_rewards(r_hat, "sigmoid", rms), torch.sigmoid(r_hat))
    assert torch.equal(trex.policy_rewards(r_hat, "raw", rms), r_hat)
    normalized = trex.policy_rewards(r_hat, "normalized", rms)
    # the statistics of the 4 values (mean 1, population variance 5) dominate the 1e-4 prior count:
    # (r - 1) / sqrt(5)
    expected = torch.tensor([[-0.44721, 0.44721], [-1.34164, 1.34164]])
    torch.testing.assert_close(normalized, expected, rtol=1e-3, atol=1e-3)


def test_ppo_loss_ignores_forced_fire_steps():
    ppo = trex.PPOArgs()
    g = torch.Generator().manual_seed(0)
    old_logp, new_logp = torch.randn(6, generator=g) - 1, torch.randn(6, generator=g) - 1
    ent, new_v, old_v, adv, ret = (torch.randn(6, generator=g) for _ in range(5))
    valid = torch.tensor([1.0, 1, 1, 1, 0, 0])
    full = trex.ppo_loss(new_logp, old_logp, ent, new_v, old_v, adv, ret, valid, ppo)
    changed = [t.clone() for t in (new_logp, adv, ret)]
    for t in changed:
        t[4:] += 100.0  # garbage on the invalid samples
    other = trex.ppo_loss(changed[0], old_logp, ent, new_v, old_v, changed[1], changed[2], valid, ppo)
    subset = trex.ppo_loss(*(t[:4] for t in (new_logp, old_logp, ent, new_v, old_v, adv, ret)), torch.ones(4), ppo)
    for a, b, c in zip(full, other, subset):
        assert a.item() == pytest.approx(b.item(), rel=1e-5) and a.item() == pytest.approx(c.item(), rel=1e-5)


def test_pair_sampler_follows_the_paper_rules():
    lengths = np.array([130, 400, 250, 180])
    scores = np.array([1.0, 5.0, 5.0, 9.0])  # demos 1 and 2 tie: never paired
    rng = np.random.default_rng(0)
    a, sa, b, sb, L, label = trex.sample_snippet_pairs(lengths, scores, 3000, 50, 100, 2, rng)
    assert L.min() == 50 and L.max() == 100  # inclusive upper bound (the reference's randint stops at 99)
    assert (scores[a] != scores[b]).all()
    assert (sa >= 0).all() and (sb >= 0).all()
    assert (sa + L <= lengths[a]).all() and (sb + L <= lengths[b]).all()
    better_is_b = scores[b] > scores[a]
    assert (label == better_is_b).all()
    s_better, s_worse = np.where(better_is_b, sb, sa), np.where(better_is_b, sa, sb)
    assert (s_better >= s_worse).all()  # the better snippet never starts earlier
    assert (s_worse + L <= np.minimum(lengths[a], lengths[b])).all()  # the worse start fits the shorter demo
    assert 0.4 < label.mean() < 0.6  # random order inside a pair
    _, _, _, _, L2, _ = trex.sample_snippet_pairs(np.array([60, 70]), np.array([0.0, 1.0]), 200, 50, 100, 2, rng)
    assert L2.max() <= 60 and L2.min() >= 50  # the shortest demo caps the snippet length


def test_snippet_index_and_frame_store_rebuild_stacks():
    offsets = np.array([0, 13])
    idx, seg = trex.snippet_obs_index(offsets, np.array([1, 0]), np.array([2, 4]), np.array([5, 2]), 2)
    assert idx.tolist() == [15, 17, 19, 4] and seg.tolist() == [0, 0, 0, 1]
    frames = torch.arange(20, dtype=torch.uint8).view(20, 1, 1).expand(20, 84, 84).contiguous()
    stacks = trex.gather_stacks(frames, np.array([0, 15]))
    assert stacks[:, :, 0, 0].tolist() == [[0, 1, 2, 3], [15, 16, 17, 18]]


def breakout(max_episode_frames: int) -> dict:
    """The game settings make_envs takes (saved in policy.pt as env_config): Breakout without sticky actions."""
    return {"rom": "breakout", "sticky": 0.0, "noop_max": 30, "max_episode_frames": max_episode_frames}


def test_demo_frames_stored_once_rebuild_the_env_stacks():
    """Demos keep 1 frame per step; frames[t:t+4] must equal the env's stacked observation t."""
    env = trex.make_envs(breakout(max_episode_frames=400), 1, life_loss=False)
    obs, _ = env.reset(seed=3)
    stacks, frames = [obs[0].copy()], [obs[0].copy()]
    for t in range(40):
        obs, *_ = env.step(np.array([t % 4]))
        stacks.append(obs[0].copy())
        frames.append(obs[0, -1:].copy())
    env.close()
    store = torch.as_tensor(np.concatenate(frames))
    rebuilt = trex.gather_stacks(store, np.arange(len(stacks))).numpy()
    assert np.array_equal(rebuilt, np.stack(stacks))
    assert len(store) == len(stacks) + 3


def test_reward_net_never_sees_masked_rows():
    top, bottom = trex.SCORE_MASKS["seaquest"]
    net = trex.RewardNet(top, bottom)
    x = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    y = x.clone()
    y[:, :, :top] = 255 - y[:, :, :top]  # change the score rows ...
    y[:, :, 84 - bottom :] = 0  # ... and the oxygen/divers rows
    assert torch.equal(net(x), net(y))
    z = x.clone()
    z[:, :, top + 5] = 255 - z[:, :, top + 5]  # a visible row
    assert not torch.allclose(net(x), net(z))


def test_env_id_mapping():
    assert trex.resolve_env_id("BreakoutNoFrameskip-v4") == ("breakout", 0.0)
    assert trex.resolve_env_id("ALE/Breakout-v5") == ("breakout", 0.25)
    assert trex.resolve_env_id("MsPacmanNoFrameskip-v4")[0] == "ms_pacman"
    assert trex.resolve_env_id("ALE/SpaceInvaders-v5")[0] == "space_invaders"
    assert trex.fire_action("breakout") == 1 and trex.fire_action("pong") == 1


def test_emulator_seeds_wrap_below_2_31_and_a_maximal_seed_plays():
    """ale-py's emulators take 32-bit seeds: seed + i is passed unchanged below 2**31 and wrapped above, so the
    largest --seed (and a long run's seed + 7919 x iteration, or an evaluation seed up to 2**32) does not crash the
    first reset, as it did with the raw sum."""
    assert trex.emulator_seeds(5, 3).tolist() == [5, 6, 7]
    assert trex.emulator_seeds(2**31 - 2, 3).tolist() == [2**31 - 2, 2**31 - 1, 0]
    envs = trex.make_envs(breakout(max_episode_frames=400), 2, life_loss=False)
    player = trex.Player(envs, None, seed=4294967295 + 7919 * 10**6 + 104729, device="cpu")
    again, _ = envs.reset(seed=trex.emulator_seeds(4294967295 + 7919 * 10**6 + 104729, 2))
    envs.close()
    assert torch.equal(player.next_obs, torch.from_numpy(again))  # the wrapped seeds are the seeds used


# ----------------------------------------------------------------------------------------------- behaviour
def test_only_real_game_ends_use_the_final_frame():
    """Issue 16's cause: at a lost life (life_loss_info) ale-py's info["final_obs"] holds stale memory. The rollout
    keeps final frames only of envs whose game really ended, and those equal the last observation shifted by one."""
    envs = trex.make_envs(breakout(max_episode_frames=600), 3, life_loss=True)
    player = trex.Player(envs, trex.fire_action("breakout"), seed=5, device="cpu")
    agent = trex.Agent(int(envs.single_action_space.n))
    buf = trex.Rollout(160, 3, "cpu")
    player.rollout(agent, buf, keep_final_frames=True)
    envs.close()
    lives_lost = (buf.dones.sum() - sum(len(e) for e, _ in buf.final_frames.values())).item()
    assert buf.final_frames and lives_lost > 0  # both kinds of termination happened
    for step, (env_ids, stacks) in buf.final_frames.items():
        assert buf.over[step, env_ids].all() and buf.over[step].sum() == len(env_ids)
        previous = buf.obs[step, env_ids].permute(0, 3, 1, 2)  # the observation the last action was taken on
        assert torch.equal(stacks[:, :3], previous[:, 1:])


class RecordingWriter:
    def __init__(self):
        self.scalars: dict[str, list[float]] = {}

    def add_scalar(self, tag, value, step=None):
        self.scalars.setdefault(tag, []).append(float(value))


class ConstantReward(torch.nn.Module):
    def forward(self, obs):
        return torch.full((obs.shape[0],), 0.7)


def test_the_env_reward_never_reaches_the_policy(tmp_path):
    """With a constant learned reward every PPO reward is sigmoid(0.7), whatever the game scores."""
    args = trex.parse_args([*TINY, "--policy.total-timesteps", "128", "--env.max-episode-frames", "400"])
    writer, game = RecordingWriter(), breakout(max_episode_frames=400)
    trex.train_ppo(args, game, "policy", writer, "cpu", tmp_path, lambda history: None, reward_net=ConstantReward())
    assert writer.scalars["trex/mean_step_reward"] == pytest.approx([1 / (1 + math.exp(-0.7))] * 2, abs=1e-6)
    assert sum(writer.scalars.get("charts/episodic_return", [])) >= 0  # games were played and logged


def synthetic_demos(qualities, length, rng):
    """Trajectories of policies of known quality q: each frame shows a bright block (the goal) with probability
    q. The true return counts the blocks; a score bar in the top 10 rows leaks it (the mask must hide it)."""
    frames, returns = [], []
    for q in qualities:
        good = rng.random(length + 3) < q
        f = rng.integers(0, 40, (length + 3, 84, 84), dtype=np.uint8)
        for t in np.flatnonzero(good):
            r, c = rng.integers(20, 70, 2)
            f[t, r : r + 8, c : c + 8] = 255
        score = np.cumsum(good)
        for t in range(length + 3):
            f[t, 2:8, : min(84, int(score[t]))] = 255  # score display
        frames.append(f)
        returns.append(float(good[3:].sum()))
    return {"frames": np.concatenate(frames), "lengths": np.full(len(qualities), length), "returns": np.array(returns)}


def test_reward_learning_ranks_held_out_trajectories(tmp_path):
    """Known-quality policies: a reward net trained on ranked trajectories must rank unseen ones (Spearman >= 0.8)."""
    demos = trex.check_demos(synthetic_demos(np.linspace(0.05, 0.95, 10), 60, np.random.default_rng(0)), "demos")
    args = trex.parse_args(
        ["--reward.num-pairs", "400", "--reward.epochs", "1", "--reward.batch-size", "8", "--reward.lr", "1e-3"]
        + ["--reward.min-len", "20", "--reward.max-len", "40", "--reward.eval-every", "25", "--reward.patience", "100"]
        + ["--seed", "0"]
    )
    info = trex.train_reward(args, demos, (10, 0), "cpu", tmp_path, RecordingWriter())
    assert info["val_accuracy"] >= 0.8
    assert (tmp_path / "reward_pred_vs_true.png").exists()
    saved = trex.load(tmp_path / "reward_model.pt", "reward_model")
    net = saved["net"]
    assert saved["info"] == info
    held_out = synthetic_demos([0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.6, 0.3], 60, np.random.default_rng(1))
    predicted = trex.demo_returns(net, torch.as_tensor(held_out["frames"]), np.arange(8) * 63, held_out["lengths"])
    assert trex.correlations(predicted, held_out["returns"])["spearman"] >= 0.8


# ----------------------------------------------------------------------------------------------- the real command
def write_random_demos(path: Path, returns, length=40, seed=0):
    rng = np.random.default_rng(seed)
    n = len(returns)
    frames = rng.integers(0, 255, (n * (length + 3), 84, 84), dtype=np.uint8)
    np.savez_compressed(path, frames=frames, lengths=np.full(n, length), returns=np.asarray(returns, dtype=float))


def read_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return set(acc.Tags()["scalars"])


FINISHED_RUN_FLAGS = [*TINY, "--demonstrator.total-timesteps", "512", "--demonstrator.snapshot-every", "4"]
FINISHED_RUN_FLAGS += ["--policy.total-timesteps", "256", "--reward.num-pairs", "40", "--reward.batch-size", "4"]
FINISHED_RUN_FLAGS += ["--reward.eval-every", "5", "--reward.epochs", "2", "--eval.episodes", "2"]
FINISHED_RUN_FLAGS += ["--eval.seeds", "1", "2", "--capture-video"]


def build_finished_run(tmp_path_factory):
    """All five phases at tiny budgets, with a video (shared by the smoke, contract and corruption tests)."""
    from conftest import run_script_subprocess

    run_dir = tmp_path_factory.mktemp("trex") / "run"
    rc, out, err = run_script_subprocess(SCRIPT, "--run-dir", run_dir, *FINISHED_RUN_FLAGS, timeout=400)
    assert rc == 0, err[-3000:]
    assert out.splitlines()[0] == out.splitlines()[-1] == f"run directory: {run_dir}", out[-2000:]
    return run_dir


def check_whole_pipeline_smoke(finished_run, run_script):
    run_dir = finished_run
    snapshots = sorted((run_dir / "demonstrator").glob("ckpt_*.pt"))
    assert [p.name for p in snapshots] == ["ckpt_00000.pt", "ckpt_00004.pt", "ckpt_00008.pt"]  # untrained, every 4th
    with np.load(run_dir / "demos.npz") as z:
        assert len(z["lengths"]) >= 12  # >= 12 demos even with fewer snapshots
        assert z["frames"].shape == ((z["lengths"] + 3).sum(), 84, 84)  # each frame once
        assert len(np.unique(z["checkpoint"])) == len(snapshots)
    for name in ("reward_model.pt", "reward_pred_vs_true.png", "learning_curve.png", "policy.pt"):
        assert (run_dir / name).stat().st_size > 0, name
    assert json.loads((run_dir / "args.json").read_text())["script"] == SCRIPT
    res = json.loads((run_dir / "results.json").read_text())
    assert len(res["eval"]["per_seed"]) == 2 and all(len(p["returns"]) == 2 for p in res["eval"]["per_seed"])
    for v in (res["trex_score"], res["demos"]["best"], res["reward"]["val_accuracy"], res["reward"]["spearman"]):
        assert math.isfinite(v)
    assert res["trex_score"] == max(p["mean"] for p in res["eval"]["per_seed"])
    assert res["policy"]["global_step"] == 256
    assert {"charts/SPS", "losses/value_loss", "reward/val_accuracy", "eval/episodic_return"} <= read_tags(run_dir)
    assert "charts/episodic_return" in read_tags(run_dir / "demonstrator")
    # a finished run dir is never overwritten: its own command exits 0, other flags exit 2; nothing changed
    before = {p: p.read_bytes() for p in run_dir.glob("*.json")}
    rc, out, err = run_script(SCRIPT, "--run-dir", run_dir, *FINISHED_RUN_FLAGS, timeout=60)
    assert rc == 0 and "nothing to do" in out, err[-2000:]
    rc, out, err = run_script(SCRIPT, "--run-dir", run_dir, timeout=60)
    assert rc == 2 and "--ppo.num-envs 8 (was 2)" in err and len(err.strip().splitlines()) == 1, err
    assert {p: p.read_bytes() for p in run_dir.glob("*.json")} == before


def check_contract_snippet_video_and_eval_only(finished_run, run_script, monkeypatch):
    import cv2

    videos = sorted((finished_run / "videos").glob("*.webm"))
    assert len(videos) == 2  # one per evaluation seed
    capture = cv2.VideoCapture(str(videos[0]))
    assert int(capture.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little") == b"VP90"
    assert capture.read()[0]
    monkeypatch.chdir(finished_run.parent)  # the five lines of docs/CONTRACT.md, from where a user stands
    policy, envs, actions = run_contract_snippet(trex, "run/policy.pt")
    assert actions.shape == (1,) and envs.single_action_space.contains(int(actions[0]))
    assert not policy.training and policy.env_id == "BreakoutNoFrameskip-v4"
    envs.close()
    # --eval-only: a new numbered file each time, results.json untouched
    eval_only = [SCRIPT, "--eval-only", finished_run, "--eval.episodes", "1", "--eval.seeds", "7"]
    for ev in eval_only_twice(lambda: run_script(*eval_only), finished_run):
        assert ev["env_id"] == "BreakoutNoFrameskip-v4" and len(ev["eval"]["per_seed"][0]["returns"]) == 1
    assert {"eval_001/episodic_return", "eval_002/episodic_return"} <= read_tags(finished_run)  # each game's score


def check_corrupt_artifacts_give_exit_2_or_a_clean_redo(finished_run, tmp_path):
    """Every file of a finished run dir, truncated or replaced by random bytes, then the resume command (results.json
    removed, --stop-after policy so nothing is evaluated): exit 2 naming the file, or 0 -- never a traceback."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, ignore=shutil.ignore_patterns("evaluations"))
    (run_dir / "results.json").unlink()
    command = ["--run-dir", str(run_dir), *TINY, "--demonstrator.total-timesteps", "512"]
    command += ["--policy.total-timesteps", "256", "--stop-after", "policy"]
    names = {"exit 2": [], "redo": []}
    # both damages for the files a resume reads, one of the two for the rest
    read_on_resume = ("args.json", "demos.npz", "reward_model.pt", "demonstrator.pt", "policy.pt")
    for path, how in each_file_corrupted(run_dir, read_on_resume):
        exited = exit_2_naming_the_file(lambda: trex.main(trex.parse_args(command)), path)
        names["exit 2" if exited else "redo"].append(path.name)
    assert set(read_on_resume) <= set(names["exit 2"])
    assert not (run_dir / "results.json").exists()
    # --eval-only reads args.json and policy.pt
    for name in ("args.json", "policy.pt"):
        with corrupted(run_dir / name):
            assert name in one_line_exit_2(lambda: trex.main(trex.parse_args(["--eval-only", str(run_dir)])))
    (run_dir / "results.json").write_text("{not json")  # the finished marker itself
    assert "results.json" in one_line_exit_2(lambda: trex.main(trex.parse_args(command)))


@pytest.mark.slow
def test_finished_run_artifacts_contract_and_corrupt_files(tmp_path_factory, monkeypatch, run_script, tmp_path):
    """One tiny run of the whole command (it takes most of this file's time), then every check that needs it."""
    finished_run = build_finished_run(tmp_path_factory)
    check_whole_pipeline_smoke(finished_run, run_script)
    check_contract_snippet_video_and_eval_only(finished_run, run_script, monkeypatch)
    check_corrupt_artifacts_give_exit_2_or_a_clean_redo(finished_run, tmp_path)
    for signum in (signal.SIGINT, signal.SIGTERM):  # issue 48: --eval-only stops within 10 s and writes nothing
        (tmp_path / signum.name).mkdir()
        check_eval_only_signal_writes_nothing(SCRIPT, finished_run, tmp_path / signum.name, signum)


@pytest.mark.slow
def test_same_seed_and_threads_give_identical_weights(tmp_path, run_script):
    """Issue 16: two runs of the same command give the same reward model and the same policy weights."""
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2, 3])
    weights = []
    for name in ("a", "b"):
        flags = ["--run-dir", tmp_path / name, "--demos", demos, *TINY, *TINY_REWARD]
        rc, _, err = run_script(
            SCRIPT, *flags, "--policy.total-timesteps", "256", "--stop-after", "policy", "--seed", "3"
        )
        assert rc == 0, err[-2000:]
        reward = torch.load(tmp_path / name / "reward_model.pt", weights_only=False)["state_dict"]
        policy = torch.load(tmp_path / name / "policy.pt", weights_only=True)["state_dict"]
        weights.append((reward, policy))
    for first, second in zip(*weights):
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_resume_between_phases_and_inside_ppo(run_dir, tmp_path, run_script):
    """SIGTERM in the middle of PPO: exit 130; the re-run skips the finished reward phase and continues PPO from the
    saved iteration to the end of the budget."""
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2, 3])
    flags = ["--run-dir", str(run_dir), "--demos", str(demos), *TINY, *TINY_REWARD, "--policy.total-timesteps", "1920"]
    flags += ["--checkpoint-every", "1", "--stop-after", "policy"]
    ckpt = run_dir / "checkpoints" / "policy.pt"
    rc, out, err = interrupt_when_exists([sys.executable, str(REPO_ROOT / SCRIPT), *flags], ckpt, wait_s=240)
    assert rc == 130, err[-2000:]
    resume = printed_resume_command(err)  # the exact command, --run-dir included
    assert resume[2:] == [*map(str, flags[2:]), "--run-dir", str(run_dir)], resume
    assert (run_dir / "learning_curve.png").exists()  # plotted during training
    state = torch.load(ckpt, weights_only=False)["state"]
    k = state["iteration"]
    assert 1 <= k < 30 and not state["done"] and state["global_step"] == k * 64
    reward_mtime = (run_dir / "reward_model.pt").stat().st_mtime_ns

    rc, out, err = run_script(SCRIPT, *flags)
    assert rc == 0, err[-2000:]
    assert f"resuming at iteration {k} / 30" in out
    assert (run_dir / "reward_model.pt").stat().st_mtime_ns == reward_mtime  # phase 3 was not redone
    final = torch.load(ckpt, weights_only=False)["state"]
    assert final["done"] and final["iteration"] == 30 and final["global_step"] == 1920
    assert not (run_dir / "results.json").exists()  # --stop-after policy

    # a larger budget extends the finished policy phase (no results.json yet); the same budget leaves it alone
    longer = [*flags, "--policy.total-timesteps", "2048"]  # the last occurrence of a flag wins
    rc, out, err = run_script(SCRIPT, *longer)
    assert rc == 0 and "extending the finished phase at iteration 30 / 32" in out, err
    final = torch.load(ckpt, weights_only=False)["state"]
    assert final["done"] and final["iteration"] == 32 and final["global_step"] == 2048
    rc, out, err = run_script(SCRIPT, *longer)
    assert rc == 0 and "extending" not in out and "resuming" not in out


def test_non_finite_reward_loss_exits_3(tmp_path, monkeypatch):
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2])
    monkeypatch.setattr(trex, "trex_loss", lambda ra, rb, label: (ra.sum() + rb.sum()) * float("nan"))
    args = trex.parse_args(["--run-dir", str(tmp_path / "run"), "--demos", str(demos), *TINY_REWARD])
    args.reward.eval_every = 1
    code, err = quiet_main(lambda: trex.main(args))
    assert code == 3 and "non-finite loss at step 1" in err


# ----------------------------------------------------------------------------------------------- bad input
# Values of the generated cases that are valid, with their documented meaning (the test checks they validate).
DOCUMENTED_VALID = {
    ("--seed", "0"),
    ("--torch-threads", "0"),
    ("--env.sticky-actions", "0"),
    ("--env.sticky-actions", "-1"),
    ("--env.noop-max", "0"),
    ("--ppo.gamma", "0"),
    ("--ppo.gae-lambda", "0"),
    ("--ppo.ent-coef", "0"),
    ("--ppo.vf-coef", "0"),
    ("--ppo.max-grad-norm", "0"),
    ("--demonstrator.return-ceiling", "0"),
    ("--demonstrator.return-ceiling", "-1"),
    ("--demonstrator.snapshot-every", "0"),
    ("--reward.mask-top", "0"),
    ("--reward.mask-top", "-1"),
    ("--reward.mask-bottom", "0"),
    ("--reward.mask-bottom", "-1"),
    ("--reward.weight-decay", "0"),
}


def test_every_numeric_flag_rejects_zero_negative_nan_and_absurd_values(tmp_path):
    run_dir = tmp_path / "run"
    defaults = trex.parse_args(["--run-dir", str(run_dir)])
    cases = numeric_flag_cases(trex.Args)
    assert len(cases) >= 4 * 40 and ("--reward.min-len", "0") in cases
    check_numeric_flag_cases(
        defaults,
        cases,
        DOCUMENTED_VALID,
        main=trex.main,
        validate=trex.validate,
        unparsed=lambda flag, value: trex.parse_args([flag, value]),  # NaN for an int: the parser's one-line error
        created=run_dir,
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--reward.min-len", "60", "--reward.max-len", "50"], "--reward.min-len must not exceed"),
        (["--ppo.num-envs", "3", "--ppo.num-steps", "3", "--ppo.num-minibatches", "2"], "multiple of"),
        (["--policy.total-timesteps", "100"], "below one rollout"),
        (["--reward.mask-top", "50", "--reward.mask-bottom", "40"], "hide the whole frame"),
        (["--eval.seeds"], "--eval.seeds"),
        (["--ppo.num-envs", "2.5"], "--ppo.num-envs"),
        (["--policy.reward", "learned"], "'learned' is not one of sigmoid"),
        (["--num-envs", "8"], "unrecognized arguments: --num-envs 8"),
        (["--seed", "-1"], "--seed must be in [0, 4294967295] (got -1)"),  # the bound exact, not 4.29497e+09
        (["--seed", "nan"], "--seed: invalid literal"),
        (["--torch-threads", "100000"], "--torch-threads must be in [0, 1024] (got 100000)"),
    ],
)
def test_rules_between_flags_and_parse_errors_are_one_line(argv, needle, tmp_path):
    line = one_line_exit_2(lambda: trex.main(trex.parse_args([*argv, "--run-dir", str(tmp_path / "run")])))
    assert needle in line and not (tmp_path / "run").exists()


ENV_IDS = {
    "HalfCheetah-v5": "not an Atari game",
    "CartPole-v1": "not an Atari game",
    "BreakoutNoFrameskip-v0": "ALE/Breakout-v5",
    "Breakout-v4": "BreakoutNoFrameskip-v4",
    "BreakoutDeterministic-v4": "BreakoutNoFrameskip-v4",
    "ALE/Breakout-v4": "ALE/Breakout-v5",
    "Breakout-v5": "ALE/Breakout-v5",
    "breakout": "BreakoutNoFrameskip-v4",
    "BreakotNoFrameskip-v4": "BreakoutNoFrameskip-v4",
    "ALE/Breakot-v5": "did you mean BreakoutNoFrameskip-v4",
}


def valid_demo_arrays() -> dict:
    rng, lengths = np.random.default_rng(0), np.array([12, 15, 11])
    frames = rng.integers(0, 255, ((lengths + 3).sum(), 84, 84), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths + 3)[:-1]])
    return {"frames": frames, "lengths": lengths, "returns": np.array([1.0, 3.0, 2.0]), "offsets": offsets}


def test_demos_file_mutated_key_by_key(tmp_path):
    valid = valid_demo_arrays() | {"actions": np.zeros(38, dtype=np.int64), "checkpoint": np.array([0, 5, 9])}
    np.savez(tmp_path / "valid.npz", **valid)
    trex.load(tmp_path / "valid.npz", "demos")
    optional = {"offsets", "actions", "checkpoint"}
    for key, how, arrays in mutated_arrays(valid):
        path = tmp_path / f"{key}_{how.replace(' ', '_')}.npz"
        np.savez(path, **arrays)
        argv = ["--demos", str(path), "--run-dir", str(tmp_path / "run")]
        if how == "dropped" and key in optional:
            trex.validate(trex.parse_args(argv))
            continue
        line = one_line_exit_2(lambda: trex.main(trex.parse_args(argv)))
        assert f"'{key}'" in line, (key, how, line)
        assert not (tmp_path / "run").exists()
    (tmp_path / "text.npz").write_text("hello")
    assert "cannot read" in one_line_exit_2(lambda: trex.main(trex.parse_args(["--demos", str(tmp_path / "text.npz")])))


@pytest.fixture
def atari():
    """(this script, its game, ENV_IDS) for the tests shared with rnd_ppo_atari.py (atari_contract.py)."""
    return trex, "BreakoutNoFrameskip-v4", ENV_IDS


def test_run_dirs_of_other_scripts_envs_and_unwritable_places_are_refused(tmp_path):
    other = tmp_path / "other"
    saved_args = [
        ({"script": "rnd_ppo_atari.py", "env_id": "BreakoutNoFrameskip-v4"}, "not made by trex_ppo_atari.py"),
        ({"script": SCRIPT, "env_id": "PongNoFrameskip-v4"}, "holds a run on PongNoFrameskip-v4"),
        ({"env_id": "BreakoutNoFrameskip-v4", "num_envs": 8}, "not made by"),
    ]
    check_foreign_run_dirs_refused(
        lambda folder: trex.main(trex.parse_args(["--run-dir", str(folder)])), other, saved_args
    )
    assert "cannot write" in one_line_exit_2(lambda: trex.main(trex.parse_args(["--run-dir", "/proc/trex_run"])))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert "a_file" in one_line_exit_2(lambda: trex.main(trex.parse_args(["--run-dir", str(blocker / "run")])))
    bad_model = tmp_path / "model.pt"
    bad_model.write_bytes(b"not a model")
    line = one_line_exit_2(lambda: trex.main(trex.parse_args(["--reward-model", str(bad_model)])))
    assert "model.pt" in line and "reward model" in line
    assert "no policy.pt" in one_line_exit_2(lambda: trex.main(trex.parse_args(["--eval-only", str(other)])))


def test_help_is_grouped_by_phase():
    check_help_groups(
        lambda: trex.parse_args(["--help"]),
        groups=("env", "ppo", "demonstrator", "collect", "reward", "policy", "eval"),
        absent=("--batch-size", "--minibatch-size"),  # derived values are not flags
    )


def test_stale_tmp_files_are_removed_and_writes_are_atomic(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"script": SCRIPT, "env_id": "BreakoutNoFrameskip-v4"}))
    stale = [run_dir / "checkpoints" / "policy.pt.tmp", run_dir / "videos.webm.tmp.webm"]
    for p in stale:
        p.write_bytes(b"half a write")
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2])
    argv = ["--run-dir", str(run_dir), "--demos", str(demos), *TINY_REWARD, "--stop-after", "demos"]
    trex.main(trex.parse_args(argv))
    assert not any(p.exists() for p in stale)
    assert (run_dir / "demos.npz").exists() and not list(run_dir.rglob("*.tmp*"))


def test_finished_run_rerun_is_nothing_to_do_with_its_flags_and_exit_2_naming_changed_ones(tmp_path):
    """Issue 48 item 6: the same flags -> exit 0, "nothing to do", nothing written; other flags
    (budget, seed, envs) -> exit 2 naming each flag with its saved and its new value."""
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), *TINY, "--policy.total-timesteps", "256"]
    args = trex.parse_args(argv)
    run_dir.mkdir()
    saved = {"script": SCRIPT, "env_id": args.env_id, "args": dataclasses.asdict(args)}
    (run_dir / "args.json").write_text(json.dumps(saved))
    (run_dir / "results.json").write_text("{}")
    before = {p: p.read_bytes() for p in run_dir.rglob("*")}
    same = argv + ["--torch-threads", "2", "--checkpoint-every", "3"]  # where and how it runs: no matter
    code, _ = quiet_main(lambda: trex.main(trex.parse_args(same)))
    assert code == 0
    for extra, named in (
        (["--policy.total-timesteps", "512"], "--policy.total-timesteps 512 (was 256)"),
        (["--seed", "2"], "--seed 2 (was 1)"),
        (["--ppo.num-envs", "4", "--eval.seeds", "7"], "--ppo.num-envs 4 (was 2), --eval.seeds [7] (was [1234"),
    ):
        line = one_line_exit_2(lambda: trex.main(trex.parse_args(argv + extra)))
        assert named in line and "finished" in line, line
    assert {p: p.read_bytes() for p in run_dir.rglob("*")} == before


def test_off_a_terminal_progress_is_a_plain_line_every_interval(tmp_path, monkeypatch):
    """Issue 48 item 11: with stderr not a TTY, each phase prints `[phase] step/total unit, rate,
    latest values` every PROGRESS_EVERY_S seconds (30; 0 here: every step); the run directory is
    the first and the last line on stdout, in those words."""
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2])
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), "--demos", str(demos), *TINY_REWARD, "--reward.epochs", "1"]
    monkeypatch.setattr(trex, "PROGRESS_EVERY_S", 0.0)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        keep_signals(lambda: trex.main(trex.parse_args([*argv, "--stop-after", "reward"])))
    err = err.getvalue()
    lines = [line for line in err.splitlines() if line.startswith("[reward]")]
    assert [line.split(",")[0] for line in lines] == [f"[reward] {k}/5 step" for k in range(1, 6)]
    assert "step/s" in lines[0] and "val_acc" in lines[-1], lines
    printed = out.getvalue().splitlines()
    assert printed[0] == printed[-1] == f"run directory: {run_dir}", printed


def test_sigterm_inside_a_long_reward_phase_exits_130_within_10_s(tmp_path):
    """Issue 48 item 9: a signal is answered within one update, not one phase: SIGTERM a few
    seconds into reward learning of 10^6 steps (validation every 50) -> exit 130, the command that
    resumes printed."""
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2])
    flags = ["--demos", str(demos), *TINY_REWARD, "--reward.epochs", "200000"]
    flags += ["--reward.eval-every", "50", "--reward.patience", "1000000", "--torch-threads", "1"]
    cmd = [sys.executable, str(Path(trex.__file__)), *flags, "--run-dir", "run"]
    started = "run/events.out.tfevents*"  # the writer is made just before the first phase
    rc, out, err, seconds = interrupt_when_found(cmd, tmp_path, started, after_s=3)
    assert rc == 130 and seconds < 10, (rc, seconds, err[-2000:])
    assert "reward learning interrupted" in err and "resume" in err, err[-2000:]
    assert not (tmp_path / "run" / "reward_model.pt").exists()
    assert out.splitlines()[-1] == "run directory: run", out[-2000:]
