"""Tests of filter_irl_mujoco.py: the math against hand-computed values, exact expert resets, the reset
probability, reward relabelling (and that env rewards never reach the learner), a behavioural FILTER run on
InvertedPendulum-v5, a smoke run of the real command, resume, and every documented bad input."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import filter_irl_mujoco as fi
from conftest import REPO_ROOT, interrupt_when_exists, write_minari_dataset

SCRIPT = "filter_irl_mujoco.py"
PENDULUM = "InvertedPendulum-v5"
CPU = torch.device("cpu")
TINY = ["--hidden-dim", "32", "--batch-size", "32", "--disc-batch-size", "64", "--eval-episodes", "1", "--p-tremble", "0"]


class HandExpert:
    """A PD controller that balances InvertedPendulum-v5 for the full 1000 steps (return 1000)."""

    gains = np.array([0.5, 5.0, 0.5, 0.5])

    def act(self, obs, device=None, deterministic=True):
        return np.clip(np.array([self.gains @ obs]), -3, 3).astype(np.float32)


class RandomActor:
    def __init__(self, env_id: str, seed: int = 0):
        self.space = gym.make(env_id).action_space
        self.space.seed(seed)

    def act(self, obs, device=None, deterministic=True):
        return self.space.sample()


def save_npz(path: Path, demos: dict) -> Path:
    np.savez_compressed(path, **demos)
    return path


@pytest.fixture(scope="module")
def pendulum_demos() -> dict:
    return fi.collect_demos(HandExpert(), PENDULUM, 2, CPU)


@pytest.fixture
def demos_file(tmp_path, pendulum_demos) -> Path:
    return save_npz(tmp_path / "demos.npz", pendulum_demos)


def small_args(**kw) -> fi.Args:
    base = dict(env_id=PENDULUM, hidden_dim=64, batch_size=128, learning_starts=500, train_every=500, disc_batch_size=1024,
                eval_frequency=10**9, eval_episodes=3, p_tremble=0.0, total_timesteps=3000, log_frequency=500)  # fmt: skip
    base.update(kw)
    return fi.Args(**base)


# ---------------------------------------------------------------------------------------------------------- math
def test_gradient_penalty_linear_function_known_gradient():
    w = torch.tensor([0.3, -0.4, 1.2])  # ||w|| = 1.3 everywhere
    xe, xl = torch.randn(5, 3), torch.randn(5, 3)
    gp = fi.gradient_penalty(lambda x: x @ w, xe, xl, torch.rand(5, 1), target_norm=0.4)
    assert gp.item() == pytest.approx((1.3 - 0.4) ** 2, rel=1e-6)


def test_gradient_penalty_quadratic_at_interpolates():
    # f(x) = 0.5 ||x||^2 has gradient x_hat; x_hat = alpha*xe + (1-alpha)*xl, computed by hand.
    xe = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    xl = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    alpha = torch.tensor([[0.5], [0.25]])  # x_hat = (1.5, 2.0) -> norm 2.5; (0, 1.5) -> norm 1.5
    gp = fi.gradient_penalty(lambda x: 0.5 * x.pow(2).sum(-1), xe, xl, alpha, target_norm=0.4)
    assert gp.item() == pytest.approx(((2.5 - 0.4) ** 2 + (1.5 - 0.4) ** 2) / 2, rel=1e-6)


def test_discriminator_loss_is_ipm_plus_weighted_penalty():
    w = torch.tensor([1.0, 0.0])
    xe, xl = torch.tensor([[1.0, 5.0], [3.0, 1.0]]), torch.tensor([[10.0, 0.0], [0.0, 0.0]])
    loss, ipm, gp = fi.discriminator_loss(lambda x: x @ w, xe, xl, torch.rand(2, 1), gp_weight=10.0, gp_target=0.4)
    assert ipm.item() == pytest.approx(2.0 - 5.0)  # E_expert f - E_learner f
    assert gp.item() == pytest.approx(0.36)
    assert loss.item() == pytest.approx(-3.0 + 3.6)


def test_discriminator_learning_rate_is_harmonic():
    assert [fi.disc_learning_rate(8e-4, k) for k in (0, 1, 2, 4, 200)] == pytest.approx([8e-4, 8e-4, 4e-4, 2e-4, 4e-6])


def test_soft_q_target_hand_values_and_absorbing_state():
    r, d = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    next_q, logp, alpha = torch.tensor([10.0, 10.0]), torch.tensor([-1.0, -1.0]), torch.tensor(0.5)
    plain = fi.soft_q_target(r, d, next_q, logp, alpha, gamma=0.9)
    assert plain.tolist() == pytest.approx([1 + 0.9 * 10.5, 2.0])
    absorbing = fi.soft_q_target(r, d, next_q, logp, alpha, gamma=0.9, absorbing_reward=torch.tensor(-3.0))
    assert absorbing.tolist() == pytest.approx([1 + 0.9 * 10.5, 2.0 + 0.9 * -3.0 / 0.1])


def test_tremble_replaces_whole_action_with_probability_p():
    rng, low, high = np.random.default_rng(0), -np.ones(3), np.ones(3)
    a = np.full(3, 5.0, np.float32)  # outside the bounds, so a replaced action is recognisable
    assert all((fi.tremble(a, rng, 0.0, low, high) == a).all() for _ in range(200))
    replaced = [not (fi.tremble(a, rng, 0.2, low, high) == a).all() for _ in range(5000)]
    assert abs(np.mean(replaced) - 0.2) < 4 * math.sqrt(0.2 * 0.8 / 5000)


# ------------------------------------------------------------------------------------------------ expert resets
def test_reset_probability_is_honoured_and_uniform():
    rng, n, p, draws = np.random.default_rng(1), 7, 0.3, 20000
    idx = np.array([fi.sample_start(rng, p, n) for _ in range(draws)])
    frac = np.mean(idx >= 0)
    assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / draws)
    counts = np.bincount(idx[idx >= 0], minlength=n)
    expected = counts.sum() / n
    assert ((counts - expected) ** 2 / expected).sum() < 22.5  # chi-square, 6 dof, p ~ 0.001
    assert fi.sample_start(rng, 1.0, 0) == -1  # no states -> never an expert reset


def test_learner_env_resets_to_expert_states_with_remaining_horizon(pendulum_demos):
    env = fi.LearnerEnv(gym.make(PENDULUM), pendulum_demos, 1.0, 0.0, np.random.default_rng(0))
    for _ in range(5):
        obs = env.reset()
        matches = np.flatnonzero((pendulum_demos["observations"] == obs.astype(np.float32)).all(1))
        assert env.from_expert and len(matches) >= 1
        t = pendulum_demos["timesteps"][matches[0]]
        assert fi.time_limit(env.env)._elapsed_steps == t


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_exact_reset_reproduces_expert_next_states_with_contacts(env_id):
    demos = fi.collect_demos(RandomActor(env_id), env_id, 2, CPU)
    env = fi.LearnerEnv(gym.make(env_id), demos, 1.0, 0.0, np.random.default_rng(0))
    for _ in range(12):
        obs = env.reset(seed=123)  # a different episode first: everything must come from the restored state
        i = int(np.flatnonzero((demos["observations"] == obs.astype(np.float32)).all(1))[0])
        _, next_obs, *_ = env.step(demos["actions"][i])
        np.testing.assert_array_equal(next_obs.astype(np.float32), demos["next_observations"][i])
    if env_id == "Hopper-v5":  # without contact-force features the observation is also recomputed exactly
        raw = gym.make(env_id)
        raw.reset(seed=1)
        obs = fi.restore_state(raw, demos["qpos"][7], demos["qvel"][7], demos["qacc_warmstart"][7], 7)
        np.testing.assert_array_equal(obs.astype(np.float32), demos["observations"][7])


def test_collect_demos_format(pendulum_demos):
    d = pendulum_demos
    n = len(d["observations"])
    assert str(d["env_id"]) == PENDULUM and d["returns"].tolist() == [1000.0, 1000.0]
    assert d["observations"].dtype == np.float32 and d["qpos"].dtype == np.float64 and d["terminals"].dtype == bool
    assert d["episode_ids"].tolist() == [0] * 1000 + [1] * 1000 and d["seeds"].tolist() == [0, 1]
    assert d["episode_starts"].sum() == 2 and d["timesteps"][[0, 999, 1000]].tolist() == [0, 999, 0]
    assert d["timeouts"][[999, 1999]].all() and d["timeouts"].sum() == 2 and n == 2000
    assert set(fi.REQUIRED_DEMO_KEYS) <= set(d) and set(fi.STATE_KEYS) <= set(d)


def test_load_demos_validation(tmp_path, pendulum_demos):
    path = save_npz(tmp_path / "ok.npz", pendulum_demos)
    loaded = fi.load_demos(path, PENDULUM, 4, 1, 0.5)
    np.testing.assert_array_equal(loaded["actions"], pendulum_demos["actions"])
    no_ts = {k: v for k, v in pendulum_demos.items() if k != "timesteps"}  # derived from episode_starts
    np.testing.assert_array_equal(fi.load_demos(save_npz(tmp_path / "a.npz", no_ts), PENDULUM, 4, 1, 0.5)["timesteps"],
                                  pendulum_demos["timesteps"])  # fmt: skip
    cases = [
        ({k: v for k, v in pendulum_demos.items() if k != "actions"}, 0.5, "lacks keys actions"),
        ({k: v for k, v in pendulum_demos.items() if k != "qacc_warmstart"}, 0.5, "--reset-prob 0"),
        ({**pendulum_demos, "env_id": np.array("Hopper-v5")}, 0.5, "holds demos of Hopper-v5"),
        ({**pendulum_demos, "observations": pendulum_demos["observations"][:, :3]}, 0.0, "observation size"),
    ]
    for i, (demos, reset_prob, message) in enumerate(cases):
        with pytest.raises(fi.UsageError, match=message):
            fi.load_demos(save_npz(tmp_path / f"bad{i}.npz", demos), PENDULUM, 4, 1, reset_prob)
    no_state = {k: v for k, v in pendulum_demos.items() if k not in fi.STATE_KEYS}
    assert "qpos" not in fi.load_demos(save_npz(tmp_path / "mm.npz", no_state), PENDULUM, 4, 1, 0.0)  # MM is fine


# ------------------------------------------------------------------------------------------------ relabelling
def test_minari_dataset_reads_as_the_same_demos(tmp_path, monkeypatch, pendulum_demos):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write_minari_dataset(pendulum_demos, "test/pendulum/hand-v0")
    got = fi.load_demos("minari:test/pendulum/hand-v0", PENDULUM, 4, 1, reset_prob=0.0)
    for k in ("observations", "next_observations", "actions", "rewards", "terminals", "timeouts", "episode_ids",
              "episode_starts", "timesteps"):  # fmt: skip
        np.testing.assert_allclose(got[k], pendulum_demos[k], rtol=1e-6, err_msg=k)
    np.testing.assert_allclose(got["returns"], pendulum_demos["returns"], rtol=1e-6)
    assert str(got["env_id"]) == PENDULUM and not any(k in got for k in fi.STATE_KEYS)
    with pytest.raises(fi.UsageError, match="--reset-prob 0"):  # no MuJoCo states in Minari: no expert resets
        fi.load_demos("minari:test/pendulum/hand-v0", PENDULUM, 4, 1, reset_prob=0.5)
    with pytest.raises(fi.UsageError, match="holds demos of InvertedPendulum-v5"):
        fi.load_demos("minari:test/pendulum/hand-v0", "Hopper-v5", 11, 3, reset_prob=0.0)
    with pytest.raises(fi.UsageError, match="minari download test/none-v0"):
        fi.load_demos("minari:test/none-v0", PENDULUM, 4, 1, reset_prob=0.0)


def test_minari_dataset_drives_an_mm_run(run_script, run_dir, tmp_path, monkeypatch, pendulum_demos):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write_minari_dataset(pendulum_demos, "test/pendulum/hand-v0")
    rc, out, err = run_script(SCRIPT, "--env-id", PENDULUM, "--expert-path", "minari:test/pendulum/hand-v0",
                              "--reset-prob", 0, "--total-timesteps", 200, "--learning-starts", 100, "--train-every",
                              100, "--eval-frequency", 200, "--run-dir", run_dir, *TINY, timeout=240)  # fmt: skip
    assert rc == 0, err[-2000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["num_demos"] == 2 and res["expert_return"] == pytest.approx(pendulum_demos["returns"].mean())


def test_relabelling_uses_current_discriminator_and_buffer_has_no_rewards():
    torch.manual_seed(0)
    args = small_args(batch_size=16, hidden_dim=16)
    agent = fi.SAC(4, 1, -3 * np.ones(1), 3 * np.ones(1), args, CPU)
    disc = fi.Discriminator(4, 1, 16)
    rb = fi.ReplayBuffer(4, 1, 100, CPU, with_rewards=False)
    assert not hasattr(rb, "rewards")
    with pytest.raises(TypeError):
        rb.add(np.zeros(4), np.zeros(1), np.zeros(4), False, 1.0, 2.0)  # there is no slot for an env reward
    for _ in range(50):
        rb.add(np.random.randn(4), np.random.randn(1), np.random.randn(4), False)
    assert len(rb.sample(8)) == 4
    last = disc.net[-1]
    for bias in (2.0, -5.0):  # f = bias everywhere -> reward -bias, read at the moment of the update
        with torch.no_grad():
            last.weight.zero_()
            last.bias.fill_(bias)
        out = fi.sac_train_step(agent, rb, 1, args, lambda o, a: fi.relabel_rewards(disc, o, a))
        assert out["rewards"].item() == pytest.approx(-bias)
    obs, act = torch.randn(6, 4), torch.randn(6, 1)
    torch.testing.assert_close(fi.relabel_rewards(disc, obs, act), torch.full((6,), 5.0))


class PoisonedReward(gym.Wrapper):
    """Returns NaN as the env reward: any use of it for learning would make a loss non-finite."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float("nan"), terminated, truncated, info


def poisoned_env(env_id: str, seed: int) -> gym.Env:
    return PoisonedReward(fi.make_env(env_id, seed))


def test_learner_never_reads_env_reward(tmp_path, pendulum_demos):
    """The same FILTER run with the true env reward and with NaN env rewards ends with bit-identical learner and
    discriminator weights (and NaN never reaches a loss); a NaN reward that DOES reach an update trips the check."""
    from torch.utils.tensorboard import SummaryWriter

    args = small_args(total_timesteps=300, learning_starts=100, train_every=100, batch_size=16, hidden_dim=16,
                      disc_batch_size=64, eval_episodes=1, checkpoint_frequency=10**9)  # fmt: skip
    states = []
    for name, env_fn in (("real", fi.make_env), ("nan", poisoned_env)):
        torch.manual_seed(3)
        writer = SummaryWriter(str(tmp_path / name))
        res = fi.train_irl(args, tmp_path / name, writer, CPU, pendulum_demos, fi.StopFlag(), env_fn=env_fn)
        writer.close()
        assert res is not None and res["policy_env_steps"] == 300 and math.isfinite(res["eval_mean"])
        states.append(torch.load(tmp_path / name / "checkpoints" / "irl.pt", weights_only=False))
    for part in ("actor", "qf"):
        for k, v in states[0]["agent"][part].items():
            torch.testing.assert_close(v, states[1]["agent"][part][k], rtol=0, atol=0)
    for k, v in states[0]["disc"].items():
        torch.testing.assert_close(v, states[1]["disc"][k], rtol=0, atol=0)
    # canary: a NaN reward that does reach the update makes the loss non-finite
    agent = fi.SAC(4, 1, -3 * np.ones(1), 3 * np.ones(1), args, CPU)
    rb = fi.ReplayBuffer(4, 1, 50, CPU, with_rewards=False)
    for _ in range(20):
        rb.add(np.random.randn(4), np.random.randn(1), np.random.randn(4), False)
    out = fi.sac_train_step(agent, rb, 1, args, lambda o, a: torch.full((len(o),), float("nan")))
    with pytest.raises(FloatingPointError):
        fi.check_finite(out, "canary", 1)


# ------------------------------------------------------------------------------------------------ behaviour
@pytest.mark.slow
def test_filter_learner_reaches_expert_on_inverted_pendulum_without_env_reward(tmp_path, pendulum_demos):
    """FILTER on a NaN-reward InvertedPendulum-v5 reaches >= 90 % of the expert's 1000 within 20k learner steps
    (it stops at the first evaluation that does). SAC uses the reference's rl-zoo settings (gamma 0.98, tau 0.02,
    lr 7.3e-4) and the discriminator fast_irl's lr0 8e-3, with 5 steps per outer iteration for the short budget."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(1)
    args = small_args(seed=1, total_timesteps=20000, learning_starts=1000, eval_frequency=2000, gamma=0.98, tau=0.02,
                      policy_lr=7.3e-4, q_lr=7.3e-4, disc_lr=8e-3, disc_steps=5, disc_trajectories=2,
                      stop_at_normalized=0.9, checkpoint_frequency=10**9)  # fmt: skip
    writer = SummaryWriter(str(tmp_path))
    res = fi.train_irl(args, tmp_path, writer, CPU, pendulum_demos, fi.StopFlag(), env_fn=poisoned_env)
    writer.close()
    assert res["expert_return"] == 1000.0
    assert res["eval_mean"] >= 0.9 * res["expert_return"], [(h["policy_steps"], h["mean"]) for h in res["history"]]
    assert res["disc_env_steps"] > 0 and res["total_env_steps"] == res["policy_env_steps"] + res["disc_env_steps"]


# ------------------------------------------------------------------------------------------ the real command
def test_smoke_full_pipeline_writes_all_artifacts(run_script, run_dir, tmp_path):
    experts = tmp_path / "experts"
    args = ["--env-id", PENDULUM, "--experts-dir", experts, "--expert-timesteps", 300, "--learning-starts", 100,
            "--num-demos", 2, "--total-timesteps", 300, "--train-every", 100, "--eval-frequency", 150,
            "--log-frequency", 50, "--run-dir", run_dir, *TINY]  # fmt: skip
    rc, out, err = run_script(SCRIPT, *args, timeout=240)
    assert rc == 0, err[-2000:]
    for f in ("demos.npz", "expert_actor.pt", "expert_meta.json"):
        assert (experts / PENDULUM / f).is_file()
    meta = json.loads((experts / PENDULUM / "expert_meta.json").read_text())
    assert meta["num_demos"] == 2 and meta["env_id"] == PENDULUM and meta["script"] == SCRIPT
    actor = torch.load(experts / PENDULUM / "expert_actor.pt", weights_only=False)
    assert {"actor", "obs_dim", "act_dim", "hidden", "env_id", "total_timesteps", "mean_return"} <= set(actor)
    assert list(run_dir.glob("events.out.tfevents.*")) and (run_dir / "args.json").is_file()
    assert (run_dir / "checkpoints" / "irl.pt").is_file() and (run_dir / "checkpoints" / "expert.pt").is_file()
    assert (run_dir / "learning_curve.png").stat().st_size > 1000 and (run_dir / "actor.pt").is_file()
    res = json.loads((run_dir / "results.json").read_text())
    for key in ("eval_mean", "eval_std", "normalized_return", "expert_return", "total_env_steps", "SPS"):
        assert math.isfinite(res[key]), key
    assert res["policy_env_steps"] == 300 and res["disc_env_steps"] > 0 and len(res["history"]) == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"charts/SPS", "eval/episodic_return", "losses/qf_loss", "irl/disc_loss", "expert/SPS"} <= tags
    # a second run reuses the cached demos (no expert phase) and evaluate-only works on the finished run
    rc, out, err = run_script(SCRIPT, "--eval-only", run_dir, "--eval-episodes", 1, timeout=120)
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["env_id"] == PENDULUM, err[-2000:]


def test_resume_continues_from_saved_step(run_dir, demos_file):
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), "--env-id", PENDULUM, "--expert-path", str(demos_file),
           "--total-timesteps", "100000", "--learning-starts", "50", "--train-every", "100", "--checkpoint-frequency",
           "100", "--eval-frequency", "100000", "--run-dir", str(run_dir), *map(str, TINY)]  # fmt: skip
    ckpt = run_dir / "checkpoints" / "irl.pt"
    rc, _, err = interrupt_when_exists(cmd, ckpt, wait_s=180)
    assert rc == 0 and "interrupted" in err, err[-2000:]
    step = torch.load(ckpt, weights_only=False)["counters"]["step"]
    assert step >= 100 and not (run_dir / "results.json").exists()
    from conftest import run_script_subprocess

    rc, out, err = run_script_subprocess(SCRIPT, "--run-dir", run_dir, "--total-timesteps", step + 50, timeout=180)
    assert rc == 0, err[-2000:]
    assert f"resuming at step {step}" in err
    res = json.loads((run_dir / "results.json").read_text())
    assert res["policy_env_steps"] == step + 50 and res["outer_iterations"] == (step + 49) // 100 + 1


# ------------------------------------------------------------------------------------------------ bad input
def _other_env_run(run_dir: Path, demos_file: Path) -> list:
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"env_id": "Hopper-v5"}))
    return ["--env-id", PENDULUM, "--expert-path", demos_file, "--run-dir", run_dir]


def _finished_run(run_dir: Path, demos_file: Path) -> list:
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"env_id": PENDULUM}))
    (run_dir / "results.json").write_text("{}")
    return ["--env-id", PENDULUM, "--expert-path", demos_file, "--run-dir", run_dir]


def _missing_keys(run_dir: Path, demos_file: Path) -> list:
    demos = dict(np.load(demos_file))
    del demos["next_observations"], demos["terminals"]
    return ["--env-id", PENDULUM, "--expert-path", save_npz(demos_file.parent / "m.npz", demos), "--run-dir", run_dir]


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda r, d: ["--env-id", "Hoper-v5", "--run-dir", r], "did you mean Hopper-v5"),
        (_missing_keys, "lacks keys next_observations, terminals"),
        (lambda r, d: ["--env-id", "Hopper-v5", "--expert-path", d, "--run-dir", r], "holds demos of InvertedPendulum-v5"),
        (lambda r, d: ["--env-id", PENDULUM, "--expert-path", r.parent / "nope.npz", "--run-dir", r], "does not exist"),
        (lambda r, d: ["--env-id", PENDULUM, "--reset-prob", "1.5", "--run-dir", r], "--reset-prob"),
        (lambda r, d: ["--env-id", PENDULUM, "--threads", "-1", "--run-dir", r], "--torch-threads must be >= 0"),
        (_other_env_run, "holds a Hopper-v5 run"),
        (_finished_run, "already holds a finished run"),
    ],
    ids=["unknown-env", "missing-keys", "env-mismatch", "no-file", "bad-prob", "bad-threads", "other-env-run-dir",
         "finished"],
)
def test_bad_input_exits_2_with_one_line(run_script, run_dir, demos_file, make_args, message):
    args = make_args(run_dir, demos_file)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} if run_dir.exists() else None
    rc, out, err = run_script(SCRIPT, *args, timeout=120)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    if before is None:
        assert not run_dir.exists()  # nothing half-written
    else:
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # nothing overwritten
