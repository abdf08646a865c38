"""Tests of filter_irl_mujoco.py: the math against hand-computed values, exact expert resets, the reset
probability, reward relabelling (and that env rewards never reach the learner), a behavioural FILTER run on
InvertedPendulum-v5, a smoke run of the real command, resume, the user contract (policy.pt and the five-line
snippet, --eval-only, VP9 video, exit codes, reproducibility) and generated bad input (flags, env ids, mutated
demos, corrupt run-dir files)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    MUJOCO_IRL_DOCUMENTED_VALID,
    MUJOCO_IRL_FINISHED_RUN,
    MUJOCO_IRL_TINY,
    REPO_ROOT,
    assert_actor_is,
    assert_counters_of_1000_steps,
    assert_mujoco_irl_artifacts,
    assert_run_directory_printed_at_start_and_end,
    assert_same_expert_phase,
    assert_same_weights_and_eval_returns,
    assert_vp9_video,
    check_expert_stops_at_target,
    check_numeric_flag_cases,
    check_printed_command_resumes,
    file_bytes,
    interrupt_when_exists,
    interrupt_when_found,
    irl_resume_flags,
    mujoco_irl_smoke_flags,
    mujoco_rendering_available,
    mutated_arrays,
    numeric_flag_cases,
    one_line_exit_2,
    run_contract_snippet,
    run_script_subprocess,
    save_npz,
    scripted_expert_evaluations,
    whole_and_killed_in_the_expert_phase,
    whole_and_killed_then_resumed,
    write_minari_dataset,
)
from mujoco_irl_contract import *  # noqa: F403  the contract tests shared with hype_irl_mujoco.py, run on this script

import filter_irl_mujoco as fi

SCRIPT = "filter_irl_mujoco.py"
PENDULUM = "InvertedPendulum-v5"
CPU = torch.device("cpu")
PENDULUM_SIZES = {"obs": 4, "act": 1, "nq": 2, "nv": 2, "env": PENDULUM}
TINY = MUJOCO_IRL_TINY


@pytest.fixture
def irl():
    """The script under test, for the contract tests shared with hype_irl_mujoco.py (mujoco_irl_contract.py)."""
    return fi


class HandExpert:
    """A PD controller that balances InvertedPendulum-v5 for the full 1000 steps (return 1000)."""

    gains = np.array([0.5, 5.0, 0.5, 0.5])

    def act(self, obs, deterministic=True):
        return np.clip(np.array([self.gains @ obs]), -3, 3).astype(np.float32)


class RandomActor:
    def __init__(self, env_id: str, seed: int = 0):
        self.space = gym.make(env_id).action_space
        self.space.seed(seed)

    def act(self, obs, deterministic=True):
        return self.space.sample()


@pytest.fixture(scope="module")
def pendulum_demos() -> dict:
    return fi.collect_demos(HandExpert(), PENDULUM, 2)


@pytest.fixture
def demos_file(tmp_path, pendulum_demos) -> Path:
    return save_npz(tmp_path / "demos.npz", pendulum_demos)


def small_args(**groups) -> fi.Args:
    """Args for in-process phase runs on InvertedPendulum-v5; `groups` maps a group name to its overrides."""
    args = fi.Args(env_id=PENDULUM, log_frequency=500)
    defaults = {
        "sac": dict(hidden_dim=64, batch_size=128, learning_starts=500),
        "disc": dict(batch_size=1024),
        "irl": dict(train_every=500, p_tremble=0.0, total_timesteps=3000),
        "eval": dict(frequency=10**9, episodes=3),
    }
    for group, values in defaults.items():
        for k, v in {**values, **groups.get(group, {})}.items():
            setattr(getattr(args, group), k, v)
    for k, v in groups.get("top", {}).items():
        setattr(args, k, v)
    return args


def train_irl_in(run_dir: Path, args: fi.Args, demos: dict, env_fn) -> tuple[fi.SAC, dict]:
    """The IRL phase in-process, on InvertedPendulum-v5, logging into ``run_dir``."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    try:
        return fi.train_irl(args, pendulum_info(), demos, None, run_dir, writer, env_fn=env_fn)
    finally:
        writer.close()


def pendulum_info() -> fi.EnvInfo:
    return fi.EnvInfo(4, 1, -3 * np.ones(1, np.float32), 3 * np.ones(1, np.float32))


# ---------------------------------------------------------------------------------------------------------- math
def test_gradient_penalty_linear_function_known_gradient():
    w = torch.tensor([0.3, -0.4, 1.2])  # ||w|| = 1.3 everywhere
    xe, xl = torch.randn(5, 3), torch.randn(5, 3)
    gp = fi.gradient_penalty(lambda x: x @ w, xe, xl, torch.rand(5, 1), target_norm=0.4)
    assert gp.item() == pytest.approx(0.81, rel=1e-6)  # (1.3 - 0.4)^2


def test_gradient_penalty_quadratic_at_interpolates():
    # f(x) = 0.5 ||x||^2 has gradient x_hat; x_hat = alpha*xe + (1-alpha)*xl, computed by hand.
    xe = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    xl = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    alpha = torch.tensor([[0.5], [0.25]])  # x_hat = (1.5, 2.0) -> norm 2.5; (0, 1.5) -> norm 1.5
    gp = fi.gradient_penalty(lambda x: 0.5 * x.pow(2).sum(-1), xe, xl, alpha, target_norm=0.4)
    assert gp.item() == pytest.approx(2.81, rel=1e-6)  # ((2.5 - 0.4)^2 + (1.5 - 0.4)^2) / 2


def test_discriminator_loss_is_ipm_plus_weighted_penalty():
    w = torch.tensor([1.0, 0.0])
    xe, xl = torch.tensor([[1.0, 5.0], [3.0, 1.0]]), torch.tensor([[10.0, 0.0], [0.0, 0.0]])
    loss, ipm, gp = fi.discriminator_loss(lambda x: x @ w, xe, xl, torch.rand(2, 1), gp_weight=10.0, gp_target=0.4)
    assert ipm.item() == pytest.approx(-3.0)  # E_expert f - E_learner f = 2 - 5
    assert gp.item() == pytest.approx(0.36)  # (||w|| - 0.4)^2 = 0.6^2
    assert loss.item() == pytest.approx(0.6)  # -3 + 10 * 0.36


def test_discriminator_learning_rate_is_harmonic():
    assert [fi.disc_learning_rate(8e-4, k) for k in (0, 1, 2, 4, 200)] == pytest.approx([8e-4, 8e-4, 4e-4, 2e-4, 4e-6])


def test_soft_q_target_hand_values_and_absorbing_state():
    r, d = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    next_q, logp, alpha = torch.tensor([10.0, 10.0]), torch.tensor([-1.0, -1.0]), torch.tensor(0.5)
    plain = fi.soft_q_target(r, d, next_q, logp, alpha, gamma=0.9)
    assert plain.tolist() == pytest.approx([10.45, 2.0])  # 1 + 0.9 * (10 + 0.5), and r at a terminal
    absorbing = fi.soft_q_target(r, d, next_q, logp, alpha, gamma=0.9, absorbing_reward=torch.tensor(-3.0))
    assert absorbing.tolist() == pytest.approx([10.45, -25.0])  # 2 + 0.9 * -3 / (1 - 0.9)


def test_twin_q_members_are_two_independent_mlps():
    q = fi.TwinQ(3, 2, hidden=8)
    obs, act = torch.randn(5, 3), torch.randn(5, 2)
    out = q(obs, act)
    assert out.shape == (2, 5)
    for i in range(2):  # member i equals a plain MLP with its slice of the stacked weights
        h = torch.cat([obs, act], -1)
        for layer in range(3):
            h = h @ q.weights[layer][i] + q.biases[layer][i]
            h = torch.relu(h) if layer < 2 else h
        torch.testing.assert_close(out[i], h.squeeze(-1))


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
        assert env.env.get_wrapper_attr("_elapsed_steps") == t


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_exact_reset_reproduces_expert_next_states_with_contacts(env_id):
    demos = fi.collect_demos(RandomActor(env_id), env_id, 2)
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
    assert set(d) == set(fi.DEMO_FORMAT) | {"env_id"}


def test_load_demos_accepts_valid_files_and_derives_timesteps(tmp_path, pendulum_demos):
    loaded = fi.load_demos(save_npz(tmp_path / "ok.npz", pendulum_demos), PENDULUM, PENDULUM_SIZES, 0.5)
    np.testing.assert_array_equal(loaded["actions"], pendulum_demos["actions"])
    no_ts = {k: v for k, v in pendulum_demos.items() if k != "timesteps"}  # derived from episode_starts
    got = fi.load_demos(save_npz(tmp_path / "a.npz", no_ts), PENDULUM, PENDULUM_SIZES, 0.5)["timesteps"]
    np.testing.assert_array_equal(got, pendulum_demos["timesteps"])
    no_state = {k: v for k, v in pendulum_demos.items() if k not in fi.STATE_KEYS}
    assert "qpos" not in fi.load_demos(save_npz(tmp_path / "mm.npz", no_state), PENDULUM, PENDULUM_SIZES, 0.0)
    with pytest.raises(fi.UsageError, match="--irl.reset-prob 0"):  # resets need the MuJoCo state
        fi.load_demos(tmp_path / "mm.npz", PENDULUM, PENDULUM_SIZES, 0.5)
    shuffled = {**pendulum_demos, "next_observations": pendulum_demos["next_observations"][::-1].copy()}
    with pytest.raises(fi.UsageError, match="key next_observations"):  # consistent shapes, inconsistent content
        fi.load_demos(save_npz(tmp_path / "s.npz", shuffled), PENDULUM, PENDULUM_SIZES, 0.5)


def test_every_mutated_demos_key_exits_2_naming_the_key(tmp_path, pendulum_demos):
    """Generated: each key dropped, as strings, with a NaN, one row short, one axis too many -> exit 2 naming the key
    (or a documented valid file: optional keys may be dropped)."""
    small = {k: v[:300] if v.ndim and len(v) == 2000 else v for k, v in pendulum_demos.items()}
    small.update(episode_ids=np.zeros(300, np.int64), returns=np.array([300.0]), seeds=np.array([0]))
    small["timeouts"] = np.zeros(300, bool)
    fi.load_demos(save_npz(tmp_path / "valid.npz", small), PENDULUM, PENDULUM_SIZES, 0.5)  # the valid base
    failures = []
    numeric = {k: v for k, v in small.items() if k != "env_id"}
    cases = [(k, how, {**arrays, "env_id": small["env_id"]}) for k, how, arrays in mutated_arrays(numeric)]
    others = ({}, {"env_id": np.array("Hopper-v5")}, {"env_id": np.array([PENDULUM])}, {"env_id": np.array(3)})
    cases += [("env_id", "mutated", {**numeric, **other}) for other in others]
    for i, (key, how, arrays) in enumerate(cases):
        path = save_npz(tmp_path / f"m{i}.npz", arrays)
        try:
            fi.load_demos(path, PENDULUM, PENDULUM_SIZES, 0.5)
            if not (how == "dropped" and key in ("timesteps", "seeds")):
                failures.append((key, how, "accepted"))
        except fi.UsageError as e:
            if key not in str(e) and "cannot read" not in str(e):
                failures.append((key, how, str(e)))
    assert not failures, "\n".join(map(str, failures))


def test_minari_dataset_reads_as_the_same_demos(tmp_path, monkeypatch, pendulum_demos):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write_minari_dataset(pendulum_demos, "test/pendulum/hand-v0")
    got = fi.load_demos("minari:test/pendulum/hand-v0", PENDULUM, PENDULUM_SIZES, reset_prob=0.0)
    for k in (
        "observations",
        "next_observations",
        "actions",
        "rewards",
        "terminals",
        "timeouts",
        "episode_ids",
        "episode_starts",
        "timesteps",
    ):
        np.testing.assert_allclose(got[k], pendulum_demos[k], rtol=1e-6, err_msg=k)
    np.testing.assert_allclose(got["returns"], pendulum_demos["returns"], rtol=1e-6)
    assert str(got["env_id"]) == PENDULUM and not any(k in got for k in fi.STATE_KEYS)
    with pytest.raises(fi.UsageError, match="--irl.reset-prob 0"):  # no MuJoCo states in Minari: no expert resets
        fi.load_demos("minari:test/pendulum/hand-v0", PENDULUM, PENDULUM_SIZES, reset_prob=0.5)
    with pytest.raises(fi.UsageError, match="holds demos of InvertedPendulum-v5"):
        fi.load_demos("minari:test/pendulum/hand-v0", "Hopper-v5", PENDULUM_SIZES, reset_prob=0.0)
    with pytest.raises(fi.UsageError, match="minari download test/none-v0"):
        fi.load_demos("minari:test/none-v0", PENDULUM, PENDULUM_SIZES, reset_prob=0.0)


# ------------------------------------------------------------------------------------------------ relabelling
def test_relabelling_uses_current_discriminator_and_buffer_has_no_rewards():
    torch.manual_seed(0)
    args = small_args(sac=dict(batch_size=16, hidden_dim=16))
    agent = fi.SAC(pendulum_info(), args.sac, CPU)
    disc = fi.Discriminator(4, 1, 16)
    rb = fi.ReplayBuffer(4, 1, 100, CPU, with_rewards=False)
    assert rb.rewards is None and "rewards" not in rb.state_dict()
    for _ in range(50):
        rb.add(np.random.randn(4), np.random.randn(1), np.random.randn(4), False)
    assert len(rb.sample(8)) == 4
    last = disc.net[-1]
    for bias in (2.0, -5.0):  # f = bias everywhere -> reward -bias, read at the moment of the update
        with torch.no_grad():
            last.weight.zero_()
            last.bias.fill_(bias)
        out = fi.sac_train_step(agent, rb, 1, lambda o, a: fi.relabel_rewards(disc, o, a))
        assert out["rewards"].item() == pytest.approx(-bias)


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
    args = small_args(
        sac=dict(learning_starts=100, batch_size=16, hidden_dim=16),
        disc=dict(batch_size=64),
        irl=dict(total_timesteps=300, train_every=100),
        eval=dict(episodes=1),
        top=dict(checkpoint_every=10**9),
    )
    agents = []
    for name, env_fn in (("real", fi.make_env), ("nan", poisoned_env)):
        torch.manual_seed(3)
        agent, progress = train_irl_in(tmp_path / name, args, pendulum_demos, env_fn)
        assert progress["step"] == 300 and math.isfinite(progress["history"][-1]["mean"])
        agents.append(torch.load(tmp_path / name / "checkpoints" / "irl.pt", weights_only=False))
    for part in ("actor", "qf"):
        for k, v in agents[0]["agent"][part].items():
            torch.testing.assert_close(v, agents[1]["agent"][part][k], rtol=0, atol=0)
    for k, v in agents[0]["disc"].items():
        torch.testing.assert_close(v, agents[1]["disc"][k], rtol=0, atol=0)
    # canary: a NaN reward that does reach the update makes the loss non-finite and stops the run
    agent = fi.SAC(pendulum_info(), args.sac, CPU)
    rb = fi.ReplayBuffer(4, 1, 50, CPU, with_rewards=False)
    for _ in range(20):
        rb.add(np.random.randn(4), np.random.randn(1), np.random.randn(4), False)
    out = fi.sac_train_step(agent, rb, 1, lambda o, a: torch.full((len(o),), float("nan")))
    with pytest.raises(fi.NonFiniteLoss, match="canary: non-finite qf_loss"):
        fi.check_finite(out, "canary", 1)


# ------------------------------------------------------------------------------------------------ behaviour
@pytest.mark.slow
def test_filter_learner_reaches_expert_on_inverted_pendulum_without_env_reward(tmp_path, pendulum_demos):
    """FILTER on a NaN-reward InvertedPendulum-v5 reaches >= 90 % of the expert's 1000 within 20k learner steps
    (it stops at the first evaluation that does). SAC uses the reference's rl-zoo settings (gamma 0.98, tau 0.02,
    lr 7.3e-4) and the discriminator fast_irl's lr0 8e-3, with 5 steps per outer iteration for the short budget."""
    torch.manual_seed(1)
    args = small_args(
        sac=dict(learning_starts=1000, gamma=0.98, tau=0.02, policy_lr=7.3e-4, q_lr=7.3e-4),
        disc=dict(lr=8e-3, steps=5, trajectories=2),
        irl=dict(total_timesteps=20000, stop_at_normalized=0.9),
        eval=dict(frequency=2000),
        top=dict(seed=1, checkpoint_every=10**9),
    )
    _, progress = train_irl_in(tmp_path / "run", args, pendulum_demos, poisoned_env)
    res = fi.irl_results(args, pendulum_demos, progress)
    assert res["expert_return"] == 1000.0
    assert res["eval_mean"] >= 0.9 * res["expert_return"], [(h["policy_steps"], h["mean"]) for h in res["history"]]
    assert res["disc_env_steps"] > 0 and res["total_env_steps"] == res["policy_env_steps"] + res["disc_env_steps"]


# ------------------------------------------------------------------------------------------ the real command
def test_smoke_full_pipeline_writes_all_artifacts_and_a_vp9_video(run_script, run_dir, tmp_path):
    experts = tmp_path / "experts"
    video = ["--capture-video"] if mujoco_rendering_available(fi, PENDULUM) else []
    rc, out, err = run_script(SCRIPT, *mujoco_irl_smoke_flags(PENDULUM, experts, run_dir), *video, *TINY, timeout=300)
    assert rc == 0, err[-2000:]
    assert_run_directory_printed_at_start_and_end(out, run_dir)
    # stderr is not a terminal: plain progress lines (one every 30 s and one at the end of a phase), no tqdm bars
    assert "\r" not in err and "expert SAC: 300/300 (100 %" in err and "): 300/300 (100 %" in err, err[-2000:]
    assert_mujoco_irl_artifacts(run_dir, experts, SCRIPT, PENDULUM)
    res = json.loads((run_dir / "results.json").read_text())
    for key in ("eval_mean", "eval_std", "normalized_return", "expert_return", "total_env_steps", "SPS"):
        assert math.isfinite(res[key]), key
    assert res["policy_env_steps"] == 300 and res["disc_env_steps"] > 0 and len(res["history"]) == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"charts/SPS", "eval/episodic_return", "losses/qf_loss", "irl/disc_loss", "expert/SPS"} <= tags
    if video:
        assert_vp9_video(run_dir / "videos" / "final.webm", fi.VIDEO_SIZE)


def test_a_saved_expert_actor_records_the_demos_of_the_cache_it_came_from(run_script, tmp_path):
    """--expert.actor: the expert_actor.pt of a cache records the same demos into a new cache (deterministic
    episodes, reset seeds 0, 1), with no SAC training; the meta names the file and keeps its SAC steps."""
    first, second = tmp_path / "experts", tmp_path / "experts2"
    tiny = ["--env-id", PENDULUM, "--expert.only", "--expert.num-demos", 2, "--sac.learning-starts", 100]
    rc, _, err = run_script(
        SCRIPT, *tiny, "--expert.timesteps", 300, "--expert.experts-dir", first, "--run-dir", tmp_path / "run"
    )
    assert rc == 0, err[-2000:]
    actor = first / PENDULUM / "expert_actor.pt"
    run2 = tmp_path / "run2"
    rc, out, err = run_script(SCRIPT, *tiny, "--expert.actor", actor, "--expert.experts-dir", second, "--run-dir", run2)
    assert rc == 0 and "recording the demos with" in out and "expert SAC" not in err, err[-2000:]
    assert not (run2 / "checkpoints" / "expert.pt").exists()
    with np.load(first / PENDULUM / "demos.npz") as a, np.load(second / PENDULUM / "demos.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    meta = json.loads((second / PENDULUM / "expert_meta.json").read_text())
    assert meta["recorded_by_actor"] == str(actor) and meta["expert_timesteps"] == 300 and meta["eval_every"] is None
    saved = torch.load(second / PENDULUM / "expert_actor.pt", weights_only=True)
    assert saved["total_timesteps"] == 300 and saved["chosen_by_evaluation"] is None  # 300 steps: no evaluation


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, pendulum_demos) -> tuple[Path, Path, list]:
    """A finished tiny run on cached demos (no expert phase): (run dir, demos file, its command's arguments)."""
    root = tmp_path_factory.mktemp("finished")
    demos = save_npz(root / "demos.npz", pendulum_demos)
    args = ["--env-id", PENDULUM, "--expert.path", demos, *MUJOCO_IRL_FINISHED_RUN, "--torch-threads", 1, *TINY]
    rc, _, err = run_script_quietly(args + ["--run-dir", root / "run"])
    assert rc == 0, err[-2000:]
    return root / "run", demos, args


def run_script_quietly(args: list, timeout: float = 300):
    return run_script_subprocess(SCRIPT, *args, timeout=timeout)


def test_policy_snippet_from_the_contract_loads_and_acts(finished_run):
    policy, envs, actions = run_contract_snippet(fi, finished_run[0] / "policy.pt")
    assert not policy.training and policy.env_id == PENDULUM
    assert actions.shape == (1, 1) and envs.action_space.contains(actions.astype(np.float32))
    envs.step(actions)


def test_resume_continues_from_saved_step(run_dir, demos_file):
    flags = ["--irl.total-timesteps", 100000, "--sac.learning-starts", 50, "--irl.train-every", 100]
    flags += ["--checkpoint-every", 100, "--eval.frequency", 100000]
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), *map(str, on_demos(*flags)(run_dir, demos_file)), *TINY]
    ckpt = run_dir / "checkpoints" / "irl.pt"
    rc, out, err = interrupt_when_exists(cmd, ckpt, wait_s=180)
    assert rc == 130 and "interrupted" in err and out.splitlines()[-1] == f"run directory: {run_dir}", err[-2000:]
    step = torch.load(ckpt, weights_only=False)["progress"]["step"]
    assert step >= 100 and not (run_dir / "results.json").exists()
    (run_dir / "checkpoints" / "irl.pt.tmp").write_bytes(b"left by a killed write")
    rc, out, err = run_script_quietly(["--run-dir", run_dir, "--irl.total-timesteps", step + 50], timeout=180)
    assert rc == 0, err[-2000:]
    assert f"resuming at step {step}" in err and not (run_dir / "checkpoints" / "irl.pt.tmp").exists()
    res = json.loads((run_dir / "results.json").read_text())
    assert res["policy_env_steps"] == step + 50 and res["outer_iterations"] == (step + 49) // 100 + 1


# ------------------------------------------------------------------------------------------------ bad input
VALID_VALUES = MUJOCO_IRL_DOCUMENTED_VALID


def test_every_numeric_flag_with_0_minus_1_nan_and_absurd_values(tmp_path, demos_file):
    """Generated from the Args dataclass: each case exits 2 with one line naming the flag, or is documented valid
    (then validation accepts it); nothing is created."""
    base = ["--env-id", PENDULUM, "--expert.path", str(demos_file), "--run-dir", str(tmp_path / "run")]
    cases = numeric_flag_cases(fi.Args)
    ranged = [name for name, _, spec in fi.flat_fields(fi.Args()) if "range" in spec.metadata]
    assert len(cases) == 4 * len(ranged) and "sac.gamma" in ranged  # every numeric field carries its range
    check_numeric_flag_cases(
        fi.parse_args(base),
        cases,
        VALID_VALUES,
        main=fi.main,
        validate=fi.validate,
        unparsed=lambda flag, value: fi.main([*base, flag, value]),  # e.g. NaN for an int: the command line's turn
        created=tmp_path / "run",
    )


def on_demos(*flags, env_id: str = PENDULUM):
    """A command on the pendulum demos: (run dir, demos file) -> its arguments, with `flags`."""
    return lambda run_dir, demos: ["--env-id", env_id, "--expert.path", demos, *flags, "--run-dir", run_dir]


def in_run_dir_holding(name: str, content: str):
    """A command on the pendulum demos whose run dir already holds the file `name`."""

    def make(run_dir: Path, demos_file: Path) -> list:
        run_dir.mkdir(parents=True)
        (run_dir / name).write_text(content)
        return on_demos()(run_dir, demos_file)

    return make


def expert_actor_command(run_dir: Path, demos_file: Path, content) -> list:
    """--expert.only --expert.actor DIR/a.pt into an empty cache: no file (None), these bytes, or a saved
    expert_actor file of the pendulum with the fields in `content` changed."""
    path = demos_file.parent / "a.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        actor = fi.Actor(4, 1, np.array([-3.0]), np.array([3.0]), 8).state_dict()
        saved = dict(actor=actor, env_id=PENDULUM, obs_dim=4, act_dim=1, hidden=8, total_timesteps=300)
        fi.save(path, "expert_actor", **{**saved, **content})
    experts = ["--expert.experts-dir", demos_file.parent / "empty", "--expert.only", "--expert.actor", path]
    return ["--env-id", PENDULUM, *experts, "--run-dir", run_dir]


def _missing_keys(run_dir: Path, demos_file: Path) -> list:
    demos = dict(np.load(demos_file))
    del demos["next_observations"], demos["terminals"]
    return on_demos()(run_dir, save_npz(demos_file.parent / "m.npz", demos))


@pytest.mark.parametrize(
    "make_args, message",
    [
        (_missing_keys, "lacks keys next_observations, terminals"),
        (on_demos(env_id="Hopper-v5"), "holds demos of InvertedPendulum"),
        (lambda r, d: on_demos()(r, r.parent / "nope.npz"), "does not exist"),
        (on_demos("--expert.num-demos", 999), "expert episodes, not --expert.num-demos 999"),
        (lambda r, d: on_demos()("/proc/x/run", d), "not writable"),
        (on_demos("--sac.learning-starts", 5000, "--irl.total-timesteps", 100), "must be below --irl.total-timesteps"),
        (on_demos("--expert.target-return", 3000, "--expert.eval-every", 0), "set --expert.eval-every above 0"),
        (
            on_demos("--sac.buffer-size", 10**9, "--irl.total-timesteps", 10**9, env_id="Humanoid-v5"),
            "lower --sac.buffer-size",
        ),
        (lambda r, d: ["--env-id", PENDULUM, "--seed", "1.5", "--run-dir", r], "--seed"),
        (lambda r, d: ["--env-id", PENDULUM, "--bogus", "1", "--run-dir", r], "Unrecognized options: --bogus"),
        (lambda r, d: ["--env-id", PENDULUM, "--eval-only", r], "policy.pt does not exist"),
        (
            in_run_dir_holding("args.json", json.dumps({"script": SCRIPT, "env_id": "Hopper-v5", "args": {}})),
            "holds a Hopper-v5 run",
        ),
        (
            in_run_dir_holding(
                "args.json", json.dumps({"script": "hype_irl_mujoco.py", "env_id": PENDULUM, "args": {}})
            ),
            "is a run dir of hype_irl_mujoco.py",
        ),
        (in_run_dir_holding("notes.txt", "mine"), "is not a run dir of filter_irl_mujoco.py"),
        (on_demos("--expert.actor", "expert_actor.pt"), "--expert.path gives them: drop one"),
        (lambda r, d: expert_actor_command(r, d, None), "--expert.actor " + "{d}/a.pt does not exist"),
        (lambda r, d: expert_actor_command(r, d, b"not torch"), "a.pt is unreadable"),
        (lambda r, d: expert_actor_command(r, d, dict(env_id="Hopper-v5")), "holds an expert of Hopper-v5"),
        (lambda r, d: expert_actor_command(r, d, dict(obs_dim=5)), "the sizes of another version"),
        (lambda r, d: expert_actor_command(r, d, dict(actor={})), "holds no actor of its stated sizes"),
    ],
    ids=[
        "missing-keys",
        "env-mismatch",
        "no-file",
        "other-number-of-demos",
        "unwritable",
        "learning-starts",
        "target-without-evaluations",
        "memory",
        "float-seed",
        "unknown-flag",
        "eval-only-nothing",
        "other-env-run-dir",
        "other-script-run-dir",
        "foreign-dir",
        "actor-and-demos",
        "actor-missing",
        "actor-unreadable",
        "actor-other-env",
        "actor-other-sizes",
        "actor-no-weights",
    ],
)
def test_bad_input_exits_2_with_one_line(run_dir, demos_file, make_args, message):
    args = [str(a) for a in make_args(run_dir, demos_file)]
    before = file_bytes(run_dir) if run_dir.exists() else None
    line = one_line_exit_2(lambda: fi.main(args))
    assert message.format(d=demos_file.parent) in line, line
    if before is None:
        assert not run_dir.exists()  # nothing half-written
    else:
        assert file_bytes(run_dir) == before  # nothing overwritten


def test_the_printed_command_resumes_a_run_in_its_default_run_dir(tmp_path, demos_file):
    """Issue 48 item 10: without --run-dir the run dir ends in a timestamp; the interrupt message gives the command
    with --run-dir, and running it exactly as printed resumes (the step counter continues)."""
    flags = ["--env-id", PENDULUM, "--expert.path", demos_file, "--irl.total-timesteps", 100000, *TINY]
    flags += ["--sac.learning-starts", 50, "--irl.train-every", 100, "--checkpoint-every", 100]
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), *map(str, flags), "--eval.frequency", "100000"]
    check_printed_command_resumes(cmd, tmp_path, lambda step, text: f"IRL phase: resuming at step {step} " in text)


@pytest.mark.parametrize(
    "phase, flags",
    [
        ("discriminator rollouts", ["--disc.trajectories", "1000"]),
        ("discriminator update", ["--disc.steps", "10000", "--disc.batch-size", "20000"]),
    ],
)
def test_a_signal_inside_a_long_phase_exits_130_within_10_s(tmp_path, demos_file, phase, flags):
    """Issue 48 item 9: the stop flag is checked inside each env step batch and update, not once per policy step: a
    SIGTERM while an outer iteration's PHASE runs (seconds to minutes with these flags) ends the run with exit 130
    within 10 s, the checkpoint holding the state before that outer iteration."""
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), "--env-id", PENDULUM, "--expert.path", str(demos_file), *TINY]
    cmd += ["--sac.learning-starts", "50", "--irl.train-every", "100", "--run-dir", str(tmp_path / "run"), *flags]
    rc, _, err, seconds = interrupt_when_found(cmd, tmp_path, "run/events.out.tfevents*", after_s=3)
    assert rc == 130 and seconds < 10 and "interrupted in the IRL phase at step " in err, (seconds, err[-2000:])
    saved = torch.load(tmp_path / "run" / "checkpoints" / "irl.pt", weights_only=False)["progress"]
    assert saved["step"] == 100 * saved["k"], saved  # the outer iteration of that step is not counted: redone


RETIRED = [
    (["--threads", "2"], "--torch-threads"),
    (["--threads=2"], "--torch-threads"),
    (["--checkpoint-frequency", "100"], "--checkpoint-every"),
    (["--checkpoint_frequency=100"], "--checkpoint-every"),
    (["--expert.expert-path", "demos.npz"], "--expert.path"),
]


@pytest.mark.parametrize("flag, new", RETIRED)
def test_old_flag_spellings_are_refused_with_a_hint_to_the_new_name(tmp_path, demos_file, flag, new):
    """Issue 48 item 8: one flag name per concept across the scripts (--torch-threads, --checkpoint-every,
    --expert.path); an old or a sibling's old spelling exits 2 naming the new one, before anything is created."""
    argv = ["--env-id", PENDULUM, "--expert.path", str(demos_file), *flag, "--run-dir", str(tmp_path / "run")]
    assert f"use {new} " in one_line_exit_2(lambda: fi.main(argv))
    assert not (tmp_path / "run").exists()


def test_progress_in_a_log_file_is_a_plain_line_every_period(monkeypatch, capsys):
    """Issue 48 item 11: stderr not a terminal -> LogLines: a line when PROGRESS_EVERY_S has passed and one at the
    end, never a carriage return."""
    monkeypatch.setattr(fi.sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setattr(fi, "PROGRESS_EVERY_S", 1e9)
    with fi.progress_bar(10, 2, "phase") as bar:
        bar.update(3)
        assert capsys.readouterr().err == ""  # the period has not passed
        monkeypatch.setattr(fi, "PROGRESS_EVERY_S", 0.0)
        bar.set_postfix(ret="7")
        bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("phase: 6/10 (60 %") and lines[0].endswith(", ret 7") and len(lines) == 2, lines


def test_the_expert_phase_keeps_the_best_evaluated_actor_not_the_last(tmp_path, monkeypatch):
    """As the reference's EvalCallback best_model: evaluations every 100 steps return 5, 9, 3 (scripted), so the
    demos' actor is the one evaluated at step 200, and the meta's choice says so."""
    from torch.utils.tensorboard import SummaryWriter

    seen = scripted_expert_evaluations(monkeypatch, fi, [5.0, 9.0, 3.0], with_successes=False)
    args = small_args(sac=dict(learning_starts=50))
    args.expert.timesteps, args.expert.eval_every, args.checkpoint_every = 300, 100, 10**6
    writer = SummaryWriter(str(tmp_path))
    agent, _, best, steps = fi.train_expert(args, pendulum_info(), None, tmp_path, writer)
    writer.close()
    assert best == [9.0, 200] and steps == 300 and len(seen) == 3
    assert_actor_is(agent.actor, seen[1])
    assert_actor_is(agent.actor, seen[2], expected=False)  # not the last


def test_the_expert_phase_stops_at_the_first_evaluation_that_reaches_the_target(tmp_path, monkeypatch, pendulum_demos):
    """--expert.target-return: training stops at the first evaluation that reaches it (conftest's check)."""
    from torch.utils.tensorboard import SummaryWriter

    args, writer = small_args(sac=dict(learning_starts=50)), SummaryWriter(str(tmp_path))
    args.checkpoint_every, args.expert.experts_dir = 10**6, str(tmp_path / "experts")
    info = pendulum_info()
    check_expert_stops_at_target(
        monkeypatch, fi, False, args, lambda: fi.train_expert(args, info, None, tmp_path, writer), pendulum_demos
    )
    writer.close()


@pytest.fixture(scope="module")
def whole_and_resumed_runs(tmp_path_factory, pendulum_demos) -> tuple[Path, Path]:
    """The same tiny run (1,000 policy steps, an outer iteration every 100, a checkpoint every 100) twice on the CPU:
    uninterrupted, and killed (SIGTERM) once its first checkpoint exists, then resumed with its own command."""
    root = tmp_path_factory.mktemp("resume")
    demos = save_npz(root / "demos.npz", pendulum_demos)
    flags = irl_resume_flags(demos, TINY)
    return whole_and_killed_then_resumed(SCRIPT, root, flags, "resuming at step {step}")


@pytest.mark.slow
def test_a_killed_and_resumed_run_ends_with_the_counters_of_an_uninterrupted_one(whole_and_resumed_runs):
    """Issue 48 (resume): stopped mid-phase and resumed, a run ends with the policy steps, outer iterations
    (discriminator updates) and evaluation steps of the uninterrupted run."""
    assert_counters_of_1000_steps(whole_and_resumed_runs, "policy_steps")


@pytest.mark.slow
def test_a_killed_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(whole_and_resumed_runs):
    """Issue 48 (exact resume): on the CPU with the same seed, the resumed run's policy and evaluation returns equal
    the uninterrupted run's: the checkpoint holds the episode in progress (simulator state, time limit count,
    observation), and a signal inside an outer iteration or an evaluation puts its RNGs and counters back first."""
    assert_same_weights_and_eval_returns(fi.load_policy, *whole_and_resumed_runs)


@pytest.mark.slow
def test_a_run_killed_inside_an_expert_episode_continues_it_exactly(tmp_path):
    """Issue 48 (exact resume, expert phase): SAC on the true reward, killed inside an episode (HalfCheetah-v5 never
    terminates: 1,000-step episodes; the kill comes with the checkpoint of step 500) and resumed, continues that
    episode (simulator state, time limit count, return, every RNG): the counters, expert weights and demos equal an
    uninterrupted run's."""
    flags = ["--env-id", "HalfCheetah-v5", "--expert.only", "--expert.timesteps", 1500, "--expert.num-demos", 1]
    flags += ["--expert.eval-every", 500, "--expert.eval-episodes", 1]  # evaluations at 500 (where it is killed), 1,000
    flags += ["--sac.learning-starts", 500, "--checkpoint-every", 500, "--torch-threads", 1, *TINY]
    resumed_at = "expert phase: resuming at step {step}"
    assert_same_expert_phase(whole_and_killed_in_the_expert_phase(SCRIPT, tmp_path, flags, 1000, resumed_at))
