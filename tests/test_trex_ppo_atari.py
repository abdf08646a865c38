"""Tests of trex_ppo_atari.py: the math, a behavioural reward-learning check, the whole pipeline, resume, bad input."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trex_ppo_atari as trex
from conftest import REPO_ROOT, interrupt_when_exists, subprocess_env

SCRIPT = "trex_ppo_atari.py"
# Tiny PPO settings shared by the subprocess runs: 2 envs x 32 steps per iteration, short games.
TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1",
        "--max-episode-frames", "1200", "--eval-num-envs", "2"]


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
    # env 0: the episode ends after t = 2 (next_done)
    d2 = 1.0 - 0.1
    d1 = 0.0 + g * 0.1 - 0.2
    d0 = 1.0 + g * 0.2 - 0.5
    a2, a1 = d2, d1 + g * lam * d2
    a0 = d0 + g * lam * a1
    # env 1: bootstraps from next_value at t = 2; no bootstrap across the done at t = 2
    e2 = 1.0 + g * 0.9 - 0.3
    e1 = 2.0 - 0.4
    e0 = 0.0 + g * 0.4 - 1.0
    b2, b1 = e2, e1
    b0 = e0 + g * lam * b1
    expected = torch.tensor([[a0, b0], [a1, b1], [a2, b2]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, expected + values, atol=1e-6)


def test_policy_rewards_come_from_the_next_frame_and_close_games():
    # A fake reward net that reads a frame's constant pixel value: frame value 10*t + n for s_t of env n.
    T, N = 3, 2
    frames = torch.zeros(T, N, 84, 84, 4, dtype=torch.uint8)
    for t in range(T):
        for n in range(N):
            frames[t, n] = 10 * t + n
    next_obs = torch.stack([torch.full((4, 84, 84), 30 + n, dtype=torch.uint8) for n in range(N)])
    final = torch.stack([torch.full((4, 84, 84), v, dtype=torch.uint8) for v in (99, 11)])  # env 0 ended at t = 0
    net = lambda obs: obs.float().mean(dim=(1, 2, 3))  # noqa: E731
    r_hat = trex.next_frame_reward_hat(net, frames, next_obs, {0: final}, chunk=4)
    assert r_hat.tolist() == [[99.0, 11.0], [20.0, 21.0], [30.0, 31.0]]
    # game sums: env 1's game ends after t = 1, env 0's after t = 2; env 0 carries 5 in from the last rollout
    running = torch.tensor([5.0, 0.0])
    over = np.array([[False, False], [False, True], [True, False]])
    sums = trex.finished_game_sums(r_hat, over, running)
    assert [s.tolist() for s in sums] == [[11.0 + 21.0], [5.0 + 99.0 + 20.0 + 30.0]]
    assert running.tolist() == [0.0, 31.0]


def test_ppo_loss_ignores_forced_fire_steps():
    args = trex.Args()
    n = 6
    g = torch.Generator().manual_seed(0)
    old_logp, new_logp = torch.randn(n, generator=g) - 1, torch.randn(n, generator=g) - 1
    ent, new_v, old_v, adv, ret = (torch.randn(n, generator=g) for _ in range(5))
    valid = torch.tensor([1.0, 1, 1, 1, 0, 0])
    full = trex.ppo_loss(new_logp, old_logp, ent, new_v, old_v, adv, ret, valid, args)
    changed = [t.clone() for t in (new_logp, adv, ret)]
    for t in changed:
        t[4:] += 100.0  # garbage on the invalid samples
    other = trex.ppo_loss(changed[0], old_logp, ent, new_v, old_v, changed[1], changed[2], valid, args)
    subset = trex.ppo_loss(new_logp[:4], old_logp[:4], ent[:4], new_v[:4], old_v[:4], adv[:4], ret[:4],
                           torch.ones(4), args)
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
    # the worse start is drawn within the shorter of the two demos
    assert (s_worse + L <= np.minimum(lengths[a], lengths[b])).all()
    assert 0.4 < label.mean() < 0.6  # random order inside a pair
    # the shortest demo caps the snippet length
    _, _, _, _, L2, _ = trex.sample_snippet_pairs(np.array([60, 70]), np.array([0.0, 1.0]), 200, 50, 100, 2, rng)
    assert L2.max() <= 60 and L2.min() >= 50


def test_snippet_index_and_frame_store_rebuild_stacks():
    offsets = np.array([0, 13])
    idx, seg = trex.snippet_obs_index(offsets, np.array([1, 0]), np.array([2, 4]), np.array([5, 2]), 2)
    assert idx.tolist() == [15, 17, 19, 4] and seg.tolist() == [0, 0, 0, 1]
    frames = torch.arange(20, dtype=torch.uint8).view(20, 1, 1).expand(20, 84, 84).contiguous()
    stacks = trex.gather_stacks(frames, np.array([0, 15]))
    assert stacks[:, :, 0, 0].tolist() == [[0, 1, 2, 3], [15, 16, 17, 18]]


def test_demo_frames_stored_once_rebuild_the_env_stacks():
    """Demos keep 1 frame per step; frames[t:t+4] must equal the env's stacked observation t."""
    args = trex.Args(max_episode_frames=400)
    env = trex.make_envs("breakout", 1, 0.0, args, life_loss=False)
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
    keep = trex.score_mask(10, 0)
    assert keep[:10].sum() == 0 and keep[10:].sum() == 74
    assert trex.SCORE_MASKS["breakout"] == (10, 0)


def test_env_id_mapping_and_close_matches():
    assert trex.resolve_env_id("BreakoutNoFrameskip-v4") == ("breakout", 0.0)
    assert trex.resolve_env_id("ALE/Breakout-v5") == ("breakout", 0.25)
    assert trex.resolve_env_id("MsPacmanNoFrameskip-v4")[0] == "ms_pacman"
    assert trex.resolve_env_id("ALE/SpaceInvaders-v5")[0] == "space_invaders"
    with pytest.raises(trex.InputError, match="BreakoutNoFrameskip-v4"):
        trex.resolve_env_id("BreakotNoFrameskip-v4")
    assert trex.fire_action("breakout") == 1 and trex.fire_action("pong") == 1


# ----------------------------------------------------------------------------------------------- behaviour
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
    return {"frames": np.concatenate(frames), "lengths": np.full(len(qualities), length),
            "returns": np.array(returns)}


class _NullWriter:
    def add_scalar(self, *a, **k):
        pass


def test_reward_learning_ranks_held_out_trajectories(tmp_path):
    """Known-quality policies: a reward net trained on ranked trajectories must rank unseen ones (Spearman >= 0.8)."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    train_demos = synthetic_demos(np.linspace(0.05, 0.95, 10), 60, rng)
    path = tmp_path / "demos.npz"
    np.savez_compressed(path, **train_demos)
    demos = trex.load_demos(str(path))
    args = trex.Args(reward_num_pairs=400, reward_epochs=1, reward_batch_size=8, reward_lr=1e-3,
                     reward_min_len=20, reward_max_len=40, reward_eval_every=25, reward_patience=100, seed=0)
    ctx = {"device": torch.device("cpu"), "mask": (10, 0), "run_dir": tmp_path}
    info = trex.train_reward(args, ctx, demos, _NullWriter())
    assert info["val_accuracy"] >= 0.8
    assert (tmp_path / "reward_model.pt").exists() and (tmp_path / "reward_pred_vs_true.png").exists()
    net = trex.load_reward_model(str(tmp_path / "reward_model.pt"), "cpu")
    held_out = synthetic_demos([0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.6, 0.3], 60, np.random.default_rng(1))
    frames = torch.as_tensor(held_out["frames"])
    offsets = np.arange(8) * 63
    predicted = trex.demo_returns(net, frames, offsets, held_out["lengths"])
    assert trex.correlations(predicted, held_out["returns"])["spearman"] >= 0.8


# ----------------------------------------------------------------------------------------------- smoke
def read_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_whole_pipeline_smoke(run_dir, run_script):
    rc, out, err = run_script(
        SCRIPT, "--run-dir", run_dir, *TINY, "--demo-total-timesteps", "512", "--policy-total-timesteps", "256",
        "--reward-num-pairs", "40", "--reward-batch-size", "4", "--reward-eval-every", "5", "--reward-epochs", "2",
        "--eval-episodes", "2", "--eval-seeds", "1", "2", "3", "--capture-video", timeout=400)
    assert rc == 0, err[-3000:]
    snapshots = sorted((run_dir / "demonstrator").glob("ckpt_*.pt"))
    assert len(snapshots) >= 9  # the untrained policy + one per iteration (8 iterations)
    with np.load(run_dir / "demos.npz") as z:
        assert len(z["lengths"]) >= 12  # >= 12 demos even with fewer snapshots
        assert z["frames"].shape == ((z["lengths"] + 3).sum(), 84, 84)  # each frame once
        assert len(np.unique(z["checkpoint"])) == len(snapshots)
    assert "best" in (run_dir / "demos_table.md").read_text()
    for name in ("reward_model.pt", "reward_pred_vs_true.png", "learning_curve.png", "args.json",
                 "checkpoints/policy.pt", "checkpoints/demonstrator.pt"):
        assert (run_dir / name).stat().st_size > 0, name
    assert list((run_dir / "videos").glob("*.mp4"))
    res = json.loads((run_dir / "results.json").read_text())
    assert len(res["eval"]["per_seed"]) == 3 and all(len(p["returns"]) == 2 for p in res["eval"]["per_seed"])
    for v in (res["trex_score"], res["demos"]["best"], res["demos"]["average"], res["reward"]["val_accuracy"],
              res["reward"]["spearman"], res["reward"]["pearson"], res["reward"]["spearman_sigmoid"],
              res["policy"]["sps"]):
        assert math.isfinite(v)
    assert res["trex_score"] == max(p["mean"] for p in res["eval"]["per_seed"])
    assert res["policy"]["global_step"] == 256
    tags = read_tags(run_dir)
    assert {"charts/SPS", "charts/learning_rate", "losses/value_loss", "reward/val_accuracy",
            "eval/episodic_return"} <= tags
    assert "charts/episodic_return" in read_tags(run_dir / "demonstrator")
    # a finished run dir is never overwritten
    before = (run_dir / "results.json").read_bytes()
    rc, out, err = run_script(SCRIPT, "--run-dir", run_dir, timeout=60)
    assert rc == 2 and "finished result" in err and len(err.strip().splitlines()) == 1
    assert (run_dir / "results.json").read_bytes() == before
    # --reward-model alone skips phases 1-3 (the benchmark's policy-phase command)
    other = run_dir.parent / "policy_only"
    rc, out, err = run_script(SCRIPT, "--run-dir", other, *TINY, "--reward-model", run_dir / "reward_model.pt",
                              "--policy-total-timesteps", "128", "--stop-after", "policy", timeout=120)
    assert rc == 0, err[-3000:]
    assert not (other / "demonstrator").exists() and not (other / "demos.npz").exists()
    assert torch.load(other / "checkpoints" / "policy.pt", weights_only=False)["state"]["global_step"] == 128


def write_random_demos(path: Path, returns, length=40, seed=0):
    rng = np.random.default_rng(seed)
    n = len(returns)
    np.savez_compressed(path, frames=rng.integers(0, 255, (n * (length + 3), 84, 84), dtype=np.uint8),
                        lengths=np.full(n, length), returns=np.asarray(returns, dtype=float))


@pytest.mark.slow
def test_resume_between_phases_and_inside_ppo(run_dir, tmp_path):
    """SIGTERM in the middle of PPO: the re-run skips the finished reward phase and continues PPO from the saved
    iteration to the end of the budget."""
    demos = tmp_path / "demos.npz"
    write_random_demos(demos, [0, 1, 2, 3])
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), "--run-dir", str(run_dir), "--demos", str(demos), *TINY,
           "--reward-num-pairs", "20", "--reward-batch-size", "4", "--reward-min-len", "10", "--reward-max-len", "20",
           "--policy-total-timesteps", "1920", "--checkpoint-every", "1", "--stop-after", "policy"]
    ckpt = run_dir / "checkpoints" / "policy.pt"
    rc, out, err = interrupt_when_exists(cmd, ckpt, wait_s=240)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert "resume" in err
    state = torch.load(ckpt, weights_only=False)["state"]
    k = state["iteration"]
    assert 1 <= k < 30 and not state["done"] and state["global_step"] == k * 64
    reward_mtime = (run_dir / "reward_model.pt").stat().st_mtime_ns

    rc = subprocess.run(cmd, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr[-2000:]
    assert f"resuming at iteration {k} / 30" in rc.stdout
    assert (run_dir / "reward_model.pt").stat().st_mtime_ns == reward_mtime  # phase 3 was not redone
    final = torch.load(ckpt, weights_only=False)["state"]
    assert final["done"] and final["iteration"] == 30 and final["global_step"] == 1920
    assert not (run_dir / "results.json").exists()  # --stop-after policy

    # a larger budget extends the finished policy phase (no results.json yet); the same budget leaves it alone
    longer = [*cmd, "--policy-total-timesteps", "2048"]  # the last occurrence of a flag wins
    rc = subprocess.run(longer, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0 and "extending the finished phase at iteration 30 / 32" in rc.stdout, rc.stderr[-2000:]
    final = torch.load(ckpt, weights_only=False)["state"]
    assert final["done"] and final["iteration"] == 32 and final["global_step"] == 2048
    rc = subprocess.run(longer, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0 and "extending" not in rc.stdout and "resuming" not in rc.stdout


# ----------------------------------------------------------------------------------------------- bad input
def test_unknown_env_id_exits_2_with_close_matches(run_dir, run_script):
    rc, out, err = run_script(SCRIPT, "--env-id", "BreakotNoFrameskip-v4", "--run-dir", run_dir, timeout=60)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "BreakoutNoFrameskip-v4" in err
    assert not run_dir.exists()


def _bad_demos(kind: str, path: Path):
    if kind == "not_npz":
        path.write_text("hello")
    elif kind == "missing_key":
        np.savez(path, frames=np.zeros((50, 84, 84), np.uint8), lengths=np.array([47]))
    elif kind == "too_small":
        write_random_demos(path, [1.0], length=40)
    elif kind == "frame_count":
        np.savez(path, frames=np.zeros((50, 84, 84), np.uint8), lengths=np.array([20, 20]), returns=np.array([1, 2.0]))
    elif kind == "all_equal":
        write_random_demos(path, [3.0, 3.0, 3.0])


@pytest.mark.parametrize(("kind", "fix"), [
    ("not_npz", "pass an .npz"), ("missing_key", "lacks"), ("too_small", "too small"),
    ("frame_count", "n + 3 frames"), ("all_equal", "same return"),
])
def test_bad_demos_exit_2_before_any_work(kind, fix, run_dir, tmp_path, capsys):
    path = tmp_path / "bad.npz"
    _bad_demos(kind, path)
    with pytest.raises(SystemExit) as e:
        trex.main(trex.Args(demos=str(path), run_dir=str(run_dir)))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fix in err
    assert not run_dir.exists()


def test_unwritable_run_dir_and_bad_reward_model_exit_2(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as e:
        trex.main(trex.Args(run_dir=str(blocker / "run")))
    assert e.value.code == 2 and "writable --run-dir" in capsys.readouterr().err
    bad = tmp_path / "model.pt"
    bad.write_text("not a model")
    with pytest.raises(SystemExit) as e:
        trex.main(trex.Args(reward_model=str(bad), run_dir=str(tmp_path / "run")))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "reward_model.pt" in err
    assert not (tmp_path / "run").exists()
