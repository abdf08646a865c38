"""Tests of hype_irl_mujoco.py: the hybrid sampler's exact expert fraction, the rho schedules, the discriminator math,
relabelling and the NaN-reward canary, exact expert-state restores, a behavioural imitation test of the HyPE learning
rule, a slow InvertedPendulum-v5 run, a smoke run of the real command, resume, the user contract (policy.pt and the
five-line snippet, --eval-only, VP9 video, exit codes, reproducibility) and generated bad input (flags, env ids,
mutated demos, corrupt run-dir files)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

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
    interrupt_when_exists,
    interrupt_when_found,
    irl_resume_flags,
    mujoco_irl_smoke_flags,
    mujoco_rendering_available,
    mutated_arrays,
    numeric_flag_cases,
    one_line_exit_2,
    quiet_main,
    run_contract_snippet,
    run_script_subprocess,
    save_npz,
    scripted_expert_evaluations,
    whole_and_killed_in_the_expert_phase,
    whole_and_killed_then_resumed,
    write_minari_dataset,
)
from mujoco_irl_contract import *  # noqa: F403  the contract tests shared with filter_irl_mujoco.py, run on this script

import hype_irl_mujoco as hy

SCRIPT = "hype_irl_mujoco.py"
PENDULUM = "InvertedPendulum-v5"
SIZES = {"obs": 4, "act": 1, "nq": 2, "nv": 2, "env": PENDULUM}
PD_GAINS = np.array([0.5, 5.0, 0.5, 0.5])  # balances InvertedPendulum-v5 for the full 1000 steps
TINY = MUJOCO_IRL_TINY


@pytest.fixture
def irl():
    """The script under test, for the contract tests shared with filter_irl_mujoco.py (mujoco_irl_contract.py)."""
    return hy


def pd_expert(obs: np.ndarray) -> np.ndarray:
    return np.array([PD_GAINS @ obs])


@pytest.fixture(scope="module")
def pendulum_demos() -> dict:
    return hy.collect_demos(PENDULUM, pd_expert, 2, max_episode_steps=200)


@pytest.fixture
def experts_dir(tmp_path, pendulum_demos) -> Path:
    """An experts cache holding the PD controller's demos (no expert training needed)."""
    (tmp_path / "experts" / PENDULUM).mkdir(parents=True)
    save_npz(tmp_path / "experts" / PENDULUM / "demos.npz", pendulum_demos)
    return tmp_path / "experts"


def script_command(*args) -> list[str]:
    """The command line of this script on ``args`` (for the tests that signal a running process)."""
    return [sys.executable, str(REPO_ROOT / SCRIPT), *map(str, args)]


def run_script_quietly(args: list, timeout: float = 300):
    return run_script_subprocess(SCRIPT, *args, timeout=timeout)


# ------------------------------------------------------------------------------------------------ hybrid sampler
@pytest.mark.parametrize(
    "batch_size, rho, expected",
    [(256, 0.2, 51), (256, 0.1, 26), (256, 0.01, 3), (100, 0.25, 25), (7, 0.5, 4), (256, 0.0, 0), (256, 1.0, 256)],
)
def test_hybrid_sampler_returns_exact_expert_fraction_every_batch(batch_size, rho, expected):
    num_expert, num_learner = 1000, 37
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        idx = hy.hybrid_indices(batch_size, rho, num_expert, num_learner, gen)
        assert idx.shape == (batch_size,)
        assert int((idx < num_expert).sum()) == expected  # exactly round(rho * B) expert rows, every batch
        assert int(idx.min()) >= 0 and int(idx.max()) < num_expert + num_learner


def test_hybrid_sampler_is_uniform_within_each_part_and_handles_empty_replay():
    gen = torch.Generator().manual_seed(1)
    idx = torch.cat([hy.hybrid_indices(100, 0.5, 4, 6, gen) for _ in range(400)])
    expert_counts = torch.bincount(idx[idx < 4], minlength=4).float()
    learner_counts = torch.bincount(idx[idx >= 4] - 4, minlength=6).float()
    for counts in (expert_counts, learner_counts):
        expected = counts.sum() / len(counts)
        assert (((counts - expected) ** 2) / expected).sum() < 25  # chi-square, <= 5 dof, p ~ 1e-4
    assert bool((hy.hybrid_indices(64, 0.2, 10, 0, gen) < 10).all())  # no learner data yet: expert rows only


def test_storage_sample_mixes_marked_expert_and_learner_rows():
    obs_dim, act_dim = 3, 2
    width = 2 * obs_dim + act_dim + 2
    expert = torch.full((50, width), -1.0)
    storage = hy.Storage(obs_dim, act_dim, 20, torch.device("cpu"), expert)
    for i in range(30):  # wraps around the 20-row ring
        storage.add(np.full(width, float(i), dtype=np.float32))
    obs, act, next_obs, done, reward = storage.sample(40, 0.25, torch.Generator().manual_seed(0))
    assert obs.shape == (40, obs_dim) and act.shape == (40, act_dim) and done.shape == (40,) and reward.shape == (40,)
    assert int((obs[:, 0] == -1).sum()) == 10  # 25 % expert rows
    assert set(obs[obs[:, 0] >= 0, 0].tolist()) <= set(map(float, range(10, 30)))  # only the 20 newest learner rows
    rows = storage.learner_rows()
    assert rows[:, 0].tolist() == list(map(float, range(10, 30)))  # oldest first, for checkpoints


# ------------------------------------------------------------------------------------------------ rho schedules
def test_rho_schedule_values_at_chosen_steps():
    hopper = hy.parse_rho_schedule(hy.RHO_SCHEDULES["Hopper"])
    assert hopper == [(0.2, 0.1, 200_000), (0.1, 0.01, 1_000_000)]
    steps = [0, 100_000, 200_000, 600_000, 1_000_000, 5_000_000]
    assert [hy.rho_at(s, hopper) for s in steps] == pytest.approx([0.2, 0.15, 0.1, 0.055, 0.01, 0.01])
    walker = hy.parse_rho_schedule(hy.RHO_SCHEDULES["Walker2d"])
    assert [hy.rho_at(s, walker) for s in [0, 150_000, 300_000, 650_000, 1_000_000, 2_000_000]] == pytest.approx(
        [0.2, 0.2, 0.2, 0.15, 0.1, 0.1]
    )
    assert hy.rho_at(12345, hy.parse_rho_schedule("0.3")) == pytest.approx(0.3)
    assert (
        hy.RHO_SCHEDULES["Humanoid"] == hy.RHO_SCHEDULES["Hopper"]
        and hy.RHO_SCHEDULES["Ant"] == hy.RHO_SCHEDULES["Walker2d"]
    )


@pytest.mark.parametrize("spec", ["abc", "0.2,0.1", "1.5", "0.2,0.1,100;0.1,0.0,50", "0.2,0.1,0"])
def test_rho_schedule_rejects_bad_specs(spec):
    with pytest.raises(hy.UsageError, match="--irl.rho-schedule"):
        hy.parse_rho_schedule(spec)


# ------------------------------------------------------------------------------------------------ discriminator math
def test_gradient_penalty_on_linear_function_with_known_gradient():
    w = torch.tensor([1.2, -0.5])  # ||grad|| = 1.3 everywhere
    xe, xl = torch.randn(16, 2), torch.randn(16, 2)
    gp = hy.gradient_penalty(lambda x: x @ w, xe, xl, target=0.4)
    assert gp.item() == pytest.approx(0.81, rel=1e-6)  # (1.3 - 0.4)^2


def test_gradient_penalty_evaluates_at_the_interpolates():
    # f(x) = ||x||^2 / 2: grad = x_hat; alpha = 0.5 -> x_hat = midpoint
    xe, xl = torch.tensor([[3.0, 4.0], [0.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    gp = hy.gradient_penalty(lambda x: 0.5 * (x**2).sum(-1), xe, xl, 0.4, alpha=torch.full((2, 1), 0.5))
    # midpoints (2, 2) and (0, 1): norms 2 sqrt(2) and 1 -> ((2 sqrt(2) - 0.4)^2 + 0.6^2) / 2
    assert gp.item() == pytest.approx(3.1286292, rel=1e-6)


def test_discriminator_loss_is_ipm_plus_weighted_penalty():
    f = lambda x: x.sum(-1)  # noqa: E731 - gradient (1, 1): norm sqrt(2)
    xe, xl = torch.full((4, 2), 1.0), torch.full((4, 2), 2.5)
    loss, ipm, gp = hy.discriminator_loss(f, xe, xl, gp_weight=10.0, gp_target=0.4)
    assert ipm.item() == pytest.approx(-3.0)  # 2 - 5
    assert gp.item() == pytest.approx(1.0286292, rel=1e-6)  # (sqrt(2) - 0.4)^2
    assert loss.item() == pytest.approx(7.2862915, rel=1e-6)  # -3 + 10 * 1.0286292


def test_discriminator_lr_is_harmonic_and_soft_q_target_hand_values():
    assert [hy.disc_lr_at(k, 8e-4) for k in (0, 1, 2, 4, 200)] == pytest.approx([8e-4, 8e-4, 4e-4, 2e-4, 4e-6])
    r, d = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    nq, nlp, alpha = torch.tensor([11.0, 7.0]), torch.tensor([1.0, 3.0]), torch.tensor(0.5)
    plain = hy.soft_q_target(r, d, nq, nlp, alpha, 0.9)
    assert plain.tolist() == pytest.approx([10.45, 2.0])  # 1 + 0.9 * (11 - 0.5 * 1); the terminal: r
    absorbing = hy.soft_q_target(r, d, nq, nlp, alpha, 0.9, torch.tensor(-3.0))
    assert absorbing.tolist() == pytest.approx([10.45, -25.0])  # terminal: 2 + 0.9 * -3 / (1 - 0.9)


def test_tremble_replaces_whole_action_with_probability_p():
    rng, a = np.random.default_rng(0), np.zeros(3, np.float32)
    low, high = -np.ones(3, np.float32), np.ones(3, np.float32)
    assert all((hy.tremble(a, rng, 0.0, low, high) == a).all() for _ in range(100))
    replaced = [not (hy.tremble(a, rng, 0.2, low, high) == a).all() for _ in range(5000)]
    assert abs(np.mean(replaced) - 0.2) < 4 * math.sqrt(0.2 * 0.8 / 5000)


# ------------------------------------------------------------------------------------------------ relabelling
def test_relabelling_uses_the_current_discriminator_and_stored_rewards_are_nan():
    disc = hy.Discriminator(5, 8)
    obs, act = torch.randn(6, 4), torch.randn(6, 1)
    with torch.no_grad():
        for layer in disc.net:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.zero_()
        disc.net[-1].bias.fill_(-2.0)
    torch.testing.assert_close(hy.relabel_rewards(disc, obs, act), torch.full((6,), 2.0))
    with torch.no_grad():
        disc.net[-1].bias.fill_(3.0)  # the discriminator changes: so do the rewards of the same transitions
    torch.testing.assert_close(hy.relabel_rewards(disc, obs, act), torch.full((6,), -3.0))

    info = hy.EnvInfo(4, 1, np.array([-3.0], np.float32), np.array([3.0], np.float32))
    sac = hy.SAC(info, hy.SACArgs(hidden_dim=16, batch_size=8), torch.device("cpu"))
    nan_rows = torch.from_numpy(
        hy.Storage.rows(np.zeros((4, 4)), np.zeros((4, 1)), np.zeros((4, 4)), np.zeros((4, 1)), np.full((4, 1), np.nan))
    )
    storage = hy.Storage(4, 1, 16, torch.device("cpu"), nan_rows)
    for _ in range(8):
        storage.add(hy.Storage.rows(np.random.randn(4), np.random.randn(1), np.random.randn(4), 0.0, float("nan")))
    o, a, no, d, stored = storage.sample(8, 0.5)
    assert torch.isnan(stored).all()  # neither expert nor learner rows carry an env reward
    out = sac.update(o, a, no, d, hy.relabel_rewards(disc, o, a), absorbing=True)
    assert math.isfinite(out["qf_loss"].item()) and out["relabelled_reward"].item() == pytest.approx(-3.0)
    assert not math.isfinite(
        sac.update(o, a, no, d, stored)["qf_loss"].item()
    )  # the canary: reading it poisons the loss


# ------------------------------------------------------------------------------------------------ expert data
def test_collect_demos_format_and_exact_restore_replays_expert_next_states():
    rng = np.random.default_rng(0)
    demos = hy.collect_demos("Hopper-v5", lambda o: rng.uniform(-1, 1, 3), 2)  # falls: contacts and terminals
    n = len(demos["observations"])
    assert set(hy.DEMO_FORMAT) | {"env_id"} == set(demos)
    assert (
        demos["observations"].dtype == np.float32
        and demos["qpos"].dtype == np.float64
        and demos["terminals"].dtype == bool
    )
    assert demos["episode_starts"].sum() == 2 and demos["terminals"].sum() == 2 and demos["seeds"].tolist() == [0, 1]
    assert demos["returns"] == pytest.approx(
        [demos["rewards"][demos["episode_ids"] == e].sum() for e in (0, 1)], rel=1e-5
    )
    env, _ = hy.make_env("Hopper-v5")
    env.reset(seed=123)
    for i in range(n):
        obs = hy.restore_state(env, demos["qpos"][i], demos["qvel"][i], demos["qacc_warmstart"][i])
        np.testing.assert_array_equal(obs.astype(np.float32), demos["observations"][i])
        next_obs = env.step(demos["actions"][i])[0]
        np.testing.assert_array_equal(next_obs.astype(np.float32), demos["next_observations"][i])


def test_load_demos_derives_timesteps_and_refuses_resets_without_state(tmp_path, pendulum_demos):
    partial = {k: v for k, v in pendulum_demos.items() if k not in ("timesteps", "qpos", "qvel", "qacc_warmstart")}
    path = save_npz(tmp_path / "partial.npz", partial)
    loaded = hy.load_demos(path, PENDULUM, SIZES, reset_prob=0.0)
    np.testing.assert_array_equal(loaded["timesteps"], pendulum_demos["timesteps"])
    with pytest.raises(hy.UsageError, match="expert resets are impossible"):
        hy.load_demos(path, PENDULUM, SIZES, reset_prob=0.5)


def test_minari_dataset_reads_as_the_same_demos_as_in_filter(tmp_path, monkeypatch, pendulum_demos):
    import filter_irl_mujoco as fi

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    write_minari_dataset(pendulum_demos, "test/pendulum/pd-v0")
    got = hy.load_demos("minari:test/pendulum/pd-v0", PENDULUM, SIZES, reset_prob=0.0)
    keys = ["observations", "next_observations", "actions", "rewards", "terminals", "timeouts"]
    for k in keys + ["episode_ids", "episode_starts", "timesteps", "returns"]:
        np.testing.assert_allclose(got[k], pendulum_demos[k], rtol=1e-6, err_msg=k)
    # the two scripts agree on the format: filter_irl_mujoco.py reads the same arrays from the same dataset
    theirs = fi.load_demos("minari:test/pendulum/pd-v0", PENDULUM, SIZES, reset_prob=0.0)
    assert set(theirs) == set(got) and all(np.array_equal(theirs[k], got[k]) for k in got)
    for spec, reset_prob in (("minari:test/pendulum/pd-v0", 0.5), ("minari:test/absent-v0", 0.0)):
        with pytest.raises(hy.UsageError):  # no MuJoCo state for resets / not downloaded
            hy.load_demos(spec, PENDULUM, SIZES, reset_prob=reset_prob)


# ------------------------------------------------------------------------------------------------ behaviour
def test_hype_learning_rule_imitates_expert_actions_without_any_env_reward():
    """One-step contextual imitation: states s ~ U(-1, 1)^2, expert action a* = 0.8 * (s0 - s1) / 2 in [-0.8, 0.8]. The
    loop is HyPE's: discriminator steps (IPM + GP, lr0 / k) on expert vs fresh learner pairs, SAC updates on hybrid
    minibatches (rho = 0.5) relabelled with the current discriminator; no reward exists anywhere. The learner's
    actions must approach the expert's; with the relabelled reward's sign flipped (a wrong discriminator) they
    must not."""

    def run(sign: float) -> float:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        args = hy.SACArgs(hidden_dim=64, batch_size=128, policy_frequency=1, q_lr=3e-3, policy_lr=1e-3)
        info = hy.EnvInfo(2, 1, np.array([-1.0], np.float32), np.array([1.0], np.float32))
        sac = hy.SAC(info, args, torch.device("cpu"))
        disc = hy.Discriminator(3, 64)
        expert_s = torch.rand(2000, 2, generator=gen) * 2 - 1
        expert_a = (0.4 * (expert_s[:, 0] - expert_s[:, 1]))[:, None]
        ones = torch.ones(2000, 1)
        storage = hy.Storage(
            2, 1, 4000, torch.device("cpu"), torch.cat([expert_s, expert_a, expert_s, ones, ones * np.nan], 1)
        )
        for k in range(12):
            s = torch.rand(256, 2, generator=gen) * 2 - 1
            with torch.no_grad():
                a = sac.actor.get_action(s)[0]
            for row in torch.cat([s, a, s, torch.ones(256, 1), torch.full((256, 1), np.nan)], 1):
                storage.add(row.numpy())
            opt = torch.optim.Adam(disc.parameters(), lr=hy.disc_lr_at(k, 5e-3))
            for _ in range(20):
                loss, _, _ = hy.discriminator_loss(disc, torch.cat([expert_s, expert_a], 1)[:256], torch.cat([s, a], 1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            for _ in range(60):
                o, act, no, d, _ = storage.sample(args.batch_size, 0.5, gen)
                sac.update(o, act, no, d, sign * hy.relabel_rewards(disc, o, act))
        test_s = torch.rand(500, 2, generator=gen) * 2 - 1
        with torch.no_grad():
            pred = sac.actor.get_action(test_s)[2]
        return float(((pred[:, 0] - 0.4 * (test_s[:, 0] - test_s[:, 1])) ** 2).mean())

    baseline = float(((0.4 * (torch.rand(500) * 2 - 1 - (torch.rand(500) * 2 - 1))) ** 2).mean())  # always acting 0
    good, flipped = run(1.0), run(-1.0)
    assert good < 0.25 * baseline, (good, baseline)
    assert flipped > 2 * good, (good, flipped)


@pytest.mark.slow
def test_hype_on_inverted_pendulum_learns_to_balance_from_demos_alone(run_script, run_dir, experts_dir):
    """The real command on InvertedPendulum-v5 (horizon 200, PD-controller demos): within 3,000 policy steps the
    learner, which never sees the env reward (NaN in its replay), balances far longer than a random policy (~5 steps)
    and its discriminator ranks expert pairs above the learner's."""
    rc, out, err = run_script(
        SCRIPT,
        "--env-id",
        PENDULUM,
        "--expert.experts-dir",
        experts_dir,
        "--run-dir",
        run_dir,
        "--max-episode-steps",
        200,
        "--irl.total-timesteps",
        3000,
        "--sac.learning-starts",
        500,
        "--irl.train-every",
        500,
        "--eval.frequency",
        1000,
        "--eval.episodes",
        3,
        "--sac.hidden-dim",
        64,
        "--sac.batch-size",
        128,
        "--disc.batch-size",
        1024,
        "--irl.p-tremble",
        0,
        timeout=400,
    )
    assert rc == 0, err[-2000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["expert_return"] == 200.0
    assert max(h["mean"] for h in res["history"]) >= 0.35 * res["expert_return"], res["history"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    gap = [ex.value - le.value for ex, le in zip(ea.Scalars("irl/reward_expert"), ea.Scalars("irl/reward_learner"))]
    assert gap[-1] > 0, gap


# ------------------------------------------------------------------------------------------------ the real command
def test_smoke_full_pipeline_from_nothing_writes_all_artifacts(run_script, run_dir, tmp_path):
    experts = tmp_path / "experts"
    video = ["--capture-video"] if mujoco_rendering_available(hy, PENDULUM) else []
    smoke = [*mujoco_irl_smoke_flags(PENDULUM, experts, run_dir), "--checkpoint-every", 100, *video, *TINY]
    rc, out, err = run_script(SCRIPT, *smoke, timeout=300)
    assert rc == 0, err[-2000:]
    assert_run_directory_printed_at_start_and_end(out, run_dir)
    # stderr is not a terminal: plain progress lines (one every 30 s and one at the end of a phase), no tqdm bars
    assert "\r" not in err and "expert: 300/300 (100 %" in err and "irl: 300/300 (100 %" in err, err[-2000:]
    assert_mujoco_irl_artifacts(run_dir, experts, SCRIPT, PENDULUM)
    res = json.loads((run_dir / "results.json").read_text())
    for key in ("eval_mean", "eval_std", "expert_return", "normalized_return", "SPS", "final_rho", "wall_time_s"):
        assert math.isfinite(res[key]), key
    assert res["policy_env_steps"] == 300 and res["disc_env_steps"] > 0 and res["outer_iterations"] == 3
    assert res["method"] == "HyPE" and [h["step"] for h in res["history"]] == [150, 300]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {
        "charts/SPS",
        "charts/episodic_return",
        "eval/episodic_return",
        "losses/qf_loss",
        "irl/disc_loss",
        "irl/rho",
        "irl/relabelled_reward",
        "expert/SPS",
    } <= tags
    assert all(math.isfinite(e.value) for e in ea.Scalars("losses/qf_loss"))  # NaN env rewards never reached the loss
    if video:
        assert_vp9_video(run_dir / "videos" / "final.webm", hy.VIDEO_SIZE)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, pendulum_demos) -> tuple[Path, Path, list]:
    """A finished tiny run on cached demos (no expert phase): (run dir, demos file, its command's arguments)."""
    root = tmp_path_factory.mktemp("finished")
    demos = save_npz(root / "demos.npz", pendulum_demos)
    args = ["--env-id", PENDULUM, "--expert.path", demos, *MUJOCO_IRL_FINISHED_RUN, *TINY]
    args += ["--max-episode-steps", 200, "--torch-threads", 1]
    rc, _, err = run_script_quietly(args + ["--run-dir", root / "run"])
    assert rc == 0, err[-2000:]
    return root / "run", demos, args


def test_policy_snippet_from_the_contract_loads_and_acts(finished_run):
    policy, envs, actions = run_contract_snippet(hy, finished_run[0] / "policy.pt")
    assert not policy.training and policy.env_id == PENDULUM and policy.max_episode_steps == 200
    assert actions.shape == (1, 1) and envs.action_space.contains(actions.astype(np.float32))
    envs.step(actions)


def test_resume_continues_from_the_saved_step(run_dir, experts_dir):
    budget = ["--irl.total-timesteps", 700, "--sac.learning-starts", 100, "--irl.train-every", 100]
    budget += ["--eval.frequency", 100000, "--checkpoint-every", 100, "--irl.reset-prob", 0.5, *TINY]
    args = script_command("--env-id", PENDULUM, "--expert.experts-dir", experts_dir, "--run-dir", run_dir, *budget)
    ckpt = run_dir / "checkpoints" / "irl.pt"
    rc, out, err = interrupt_when_exists(args, ckpt, wait_s=120, exit_s=60)
    assert rc == 130 and "interrupted" in err and out.splitlines()[-1] == f"run directory: {run_dir}", err[-2000:]
    step = torch.load(ckpt, weights_only=False)["progress"]["step"]
    assert 100 <= step < 700 and not (run_dir / "results.json").exists()
    (run_dir / "checkpoints" / "irl.pt.tmp").write_bytes(b"left by a killed write")
    rc, out, err = run_script_quietly(args[2:], timeout=180)  # the same command again
    assert rc == 0, err[-2000:]
    assert f"resuming from step {step}" in out and not (run_dir / "checkpoints" / "irl.pt.tmp").exists()
    res = json.loads((run_dir / "results.json").read_text())
    assert res["resumed_from_step"] == step and res["policy_env_steps"] == 700 and res["method"] == "HyPE+FILTER"
    assert res["outer_iterations"] == 7  # one discriminator update per 100 steps, none repeated or skipped


# ------------------------------------------------------------------------------------------------ bad input
VALID_VALUES = MUJOCO_IRL_DOCUMENTED_VALID


def test_every_numeric_flag_with_0_minus_1_nan_and_absurd_values(tmp_path, pendulum_demos):
    """Generated from the Args dataclass: each case exits 2 with one line naming the flag, or is documented valid
    (then validation accepts it); nothing is created."""
    demos = save_npz(tmp_path / "demos.npz", pendulum_demos)
    base = ["--env-id", PENDULUM, "--expert.path", str(demos), "--run-dir", str(tmp_path / "run")]
    cases = numeric_flag_cases(hy.Args)
    ranged = [name for name, _, spec in hy.flat_fields(hy.Args()) if "range" in spec.metadata]
    assert len(cases) == 4 * len(ranged) and "sac.gamma" in ranged  # every numeric field carries its range
    check_numeric_flag_cases(
        hy.parse_args(base),
        cases,
        VALID_VALUES,
        main=hy.main,
        validate=hy.validate,
        unparsed=lambda flag, value: hy.main([*base, flag, value]),  # e.g. NaN for an int: the command line's turn
        created=tmp_path / "run",
    )


def test_every_mutated_demos_key_exits_2_naming_the_key(tmp_path, pendulum_demos):
    """Generated: each key dropped, as strings, with a NaN, one row short, one axis too many -> exit 2 naming the key
    (or a documented valid file: optional keys may be dropped)."""
    small = {k: v for k, v in pendulum_demos.items() if k != "env_id"}
    hy.load_demos(save_npz(tmp_path / "valid.npz", pendulum_demos), PENDULUM, SIZES, 0.5)  # the valid base
    cases = [(k, how, {**arrays, "env_id": pendulum_demos["env_id"]}) for k, how, arrays in mutated_arrays(small)]
    others = ({}, {"env_id": np.array("Hopper-v5")}, {"env_id": np.array([PENDULUM])}, {"env_id": np.array(3)})
    cases += [("env_id", "mutated", {**small, **other}) for other in others]
    failures = []
    for i, (key, how, arrays) in enumerate(cases):
        try:
            hy.load_demos(save_npz(tmp_path / f"m{i}.npz", arrays), PENDULUM, SIZES, 0.5)
            if not (how == "dropped" and key in ("timesteps", "seeds")):
                failures.append((key, how, "accepted"))
        except hy.UsageError as e:
            if key not in str(e):
                failures.append((key, how, str(e)))
    assert not failures, "\n".join(map(str, failures))


def _demos_with(tmp_path: Path, demos: dict, drop=(), **replace) -> Path:
    """`demos` without the keys in `drop` and with `replace`d ones, saved as tmp_path/bad.npz."""
    d = {k: v for k, v in demos.items() if k not in drop}
    d.update(replace)
    return save_npz(tmp_path / "bad.npz", d)


def _run_dir_with_args(tmp_path: Path, saved: dict) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "args.json").write_text(json.dumps(saved))
    return run_dir


BAD_INPUTS = {
    "missing keys": (
        lambda t, d: ["--expert.path", _demos_with(t, d, drop=("actions", "terminals"))],
        "lacks keys actions, terminals",
    ),
    "obs size": (
        lambda t, d: ["--expert.path", _demos_with(t, d, observations=d["observations"][:, :3])],
        "key observations has shape",
    ),
    "other env's demos": (
        lambda t, d: ["--expert.path", _demos_with(t, d, env_id=np.array("Hopper-v5"))],
        "holds demos of Hopper-v5",
    ),
    "resets without state": (
        lambda t, d: ["--irl.reset-prob", 0.5, "--expert.path", _demos_with(t, d, drop=("qpos",))],
        "expert resets are impossible",
    ),
    "missing expert path": (lambda t, d: ["--expert.path", t / "nope.npz"], "does not exist"),
    "other number of demos": (
        lambda t, d: ["--expert.path", _demos_with(t, d), "--expert.num-demos", 999],
        "expert episodes, not --expert.num-demos 999",
    ),
    "bad rho": (lambda t, d: ["--irl.rho-schedule", "0.2,0.1"], "--irl.rho-schedule"),
    "bad rho order": (lambda t, d: ["--irl.rho-schedule", "0.2,0.1,100;0.1,0.0,50"], "increasing"),
    "unwritable run dir": (lambda t, d: ["--run-dir", "/proc/x/run"], "not writable"),
    "learning starts": (lambda t, d: ["--sac.learning-starts", 5000, "--irl.total-timesteps", 100], "must be below"),
    "target without evaluations": (
        lambda t, d: ["--expert.target-return", 3000, "--expert.eval-every", 0],
        "set --expert.eval-every above 0",
    ),
    "unknown flag": (lambda t, d: ["--bogus", 1], "Unrecognized options: --bogus"),
    "eval-only nothing": (lambda t, d: ["--eval-only", t / "nothing"], "policy.pt does not exist"),
    "other env run dir": (
        lambda t, d: ["--run-dir", _run_dir_with_args(t, {"script": SCRIPT, "env_id": "Hopper-v5", "args": {}})],
        "holds a Hopper-v5 run",
    ),
    "other script run dir": (
        lambda t, d: ["--run-dir", _run_dir_with_args(t, {"script": "filter_irl_mujoco.py", "args": {}})],
        "is a run dir of filter",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, pendulum_demos, case):
    """In-process (fast): the same `main` as the command line."""
    bad_input_line(tmp_path, PENDULUM, pendulum_demos, *BAD_INPUTS[case])


def bad_input_line(tmp_path, env_id, demos, make_args, message) -> str:
    """Runs `main` with the case's flags: exit 2, one line naming `message`, nothing created; returns the line."""
    args = ["--env-id", env_id, "--expert.experts-dir", tmp_path / "empty", "--run-dir", tmp_path / "new"]
    args = [str(a) for a in args + make_args(tmp_path, demos)]
    before = sorted(tmp_path.rglob("*"))
    line = one_line_exit_2(lambda: hy.main(args))
    assert message in line, line
    assert sorted(tmp_path.rglob("*")) == before  # nothing created
    return line


# ------------------------------------------------------------------------------------------------ mazes (HyPER's data)
MAZE = "PointMaze_UMaze-v3"
MAZE_TINY = ["--irl.total-timesteps", 300, "--irl.train-every", 150, "--sac.learning-starts", 100]
MAZE_TINY += ["--eval.frequency", 150, "--eval.episodes", 2, "--disc.trajectories", 1, "--torch-threads", 1]
MAZE_TINY += ["--sac.hidden-dim", 32, "--sac.batch-size", 32, "--disc.batch-size", 64]


@pytest.fixture(scope="module")
def maze_demos() -> dict:
    """mbirl_antmaze.py's planner expert on PointMaze UMaze: 3 episodes in the shared layout, each ending at its goal"""
    import mbirl_antmaze as mb

    return mb.make_expert_data(MAZE, mb.ExpertArgs(num_demos=3), 0, None)


def test_maze_env_is_flat_and_an_expert_reset_restores_state_and_goal(maze_demos):
    d = maze_demos
    env, horizon = hy.make_env(MAZE)
    assert horizon == 300 and env.observation_space.shape == (6,)  # the env's own time limit, [x, y, vx, vy, goal]
    sim = env.unwrapped.point_env
    ends = np.flatnonzero(d["terminals"])
    for i in (2, 30, *ends):  # mid-episode steps and the steps that reach the goal
        env.reset(seed=99)  # another start and another goal
        assert not np.allclose(env.unwrapped.goal, d["goal"][i])
        obs = hy.restore_state(env, d["qpos"][i], d["qvel"][i], d["qacc_warmstart"][i], d["goal"][i])
        np.testing.assert_allclose(obs, d["observations"][i], atol=1e-6)
        np.testing.assert_allclose(sim.model.site_pos[env.unwrapped.target_site_id][:2], d["goal"][i])  # the marker
        next_obs, _, terminated, _, _ = env.step(d["actions"][i])
        np.testing.assert_allclose(next_obs, d["next_observations"][i], atol=1e-5)
        assert terminated == d["terminals"][i]
    rng = np.random.default_rng(0)
    obs, t = hy.start_episode(env, 5, d, reset_prob=1.0, rng=rng)  # the learner's reset: the recorded state and time
    i = int(np.flatnonzero((d["observations"] == obs.astype(np.float32)).all(1))[0])
    assert t == d["timesteps"][i] and np.allclose(env.unwrapped.goal, d["goal"][i])
    env.close()


def test_terminal_reward_defaults_to_none_on_mazes_and_min_elsewhere_unless_set():
    assert hy.terminal_reward(hy.Args(env_id=MAZE)) == "none" and hy.terminal_reward(hy.Args()) == "min"
    assert hy.terminal_reward(hy.Args(env_id=MAZE, irl=hy.IRLArgs(terminal_reward="min"))) == "min"


class ReplayActor:
    """Open-loop: the actions of one recorded episode, then zeros (evaluate's `actor.act` interface)."""

    def __init__(self, actions: np.ndarray):
        self.actions, self.t = actions, 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        action = self.actions[self.t] if self.t < len(self.actions) else np.zeros(2, np.float32)
        self.t += 1
        return action[None]


def test_maze_evaluation_counts_an_episode_that_reaches_the_goal_as_a_success(maze_demos):
    d = maze_demos
    first = d["actions"][d["episode_ids"] == 0]  # recorded from reset seed 0: replaying it reaches the goal
    returns, successes = hy.evaluate(ReplayActor(first), MAZE, 1, seed=0, p_tremble=0.0)
    assert successes == [True] and returns == [1.0]
    returns, successes = hy.evaluate(ReplayActor(first[:0]), MAZE, 1, seed=0, p_tremble=0.0, max_episode_steps=20)
    assert successes == [False] and returns == [0.0]  # standing still for the whole horizon
    assert hy.evaluate(ReplayActor(np.zeros((5, 1))), PENDULUM, 1, 0, 0.0, max_episode_steps=5)[1] is None


def test_maze_smoke_run_on_mbirl_data_writes_success_rates(run_script, run_dir, tmp_path, maze_demos):
    demos = save_npz(tmp_path / "maze_demos.npz", maze_demos)
    flags = ["--env-id", MAZE, "--expert.path", demos, "--run-dir", run_dir, "--irl.reset-prob", 0.5]
    rc, out, err = run_script(SCRIPT, *flags, *MAZE_TINY, timeout=240)
    assert rc == 0, err[-2000:]
    assert_run_directory_printed_at_start_and_end(out, run_dir)
    res = json.loads((run_dir / "results.json").read_text())
    assert res["method"] == "HyPE+FILTER" and res["terminal_reward"] == "none" and res["expert_return"] == 1.0
    assert res["success_rate"] in (0.0, 0.5, 1.0) and [h["step"] for h in res["history"]] == [150, 300]
    assert all(h["success_rate"] in (0.0, 0.5, 1.0) for h in res["history"])
    assert (run_dir / "learning_curve.png").stat().st_size > 1000 and (run_dir / "policy.pt").is_file()
    assert not (run_dir / "checkpoints" / "expert.pt").exists()  # no expert phase on a maze
    saved = json.loads((run_dir / "args.json").read_text())
    assert saved["env_id"] == MAZE and saved["args"]["expert"]["path"] == str(demos)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    assert [e.value for e in ea.Scalars("eval/success_rate")] == [h["success_rate"] for h in res["history"]]
    policy, envs, actions = run_contract_snippet(hy, run_dir / "policy.pt")
    assert policy.env_id == MAZE and envs.observation_space.shape == (1, 6) and actions.shape == (1, 2)
    code, _ = quiet_main(lambda: hy.main(["--eval-only", str(run_dir), "--eval.episodes", "2"]))
    record = json.loads((run_dir / "evaluations" / "eval_001.json").read_text())
    assert code == 0 and record["success_rate"] in (0.0, 0.5, 1.0)


MAZE_BAD_INPUTS = {  # case: (flags after --env-id, what the one line must say)
    "no demos": (lambda t, d: [], "python mbirl_antmaze.py --env-id PointMaze_UMaze-v3"),
    "another maze's demos": (
        lambda t, d: ["--env-id", "PointMaze_Medium-v3", "--expert.path", _demos_with(t, d)],
        "holds demos of PointMaze_UMaze-v3",
    ),
    "no goal": (lambda t, d: ["--expert.path", _demos_with(t, d, drop=("goal",))], "lacks keys goal"),
    "goal not in obs": (
        lambda t, d: ["--expert.path", _demos_with(t, d, goal=d["goal"] + 1.0)],
        "key goal must end every observation",
    ),
    "retired maze": (lambda t, d: ["--env-id", "PointMaze_UMaze-v2"], "did you mean PointMaze_UMaze-v3"),
}


@pytest.mark.parametrize("case", list(MAZE_BAD_INPUTS))
def test_maze_bad_input_exits_2_with_one_line_and_creates_nothing(tmp_path, maze_demos, case):
    line = bad_input_line(tmp_path, MAZE, maze_demos, *MAZE_BAD_INPUTS[case])
    if case == "no demos":
        assert "--expert.path" in line, line


class RandomAnt:
    """Stand-in for mbirl_antmaze.py's Ant controller (none ships yet): uniform random actions, for the 31-D layout."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def reset(self, maze, obs):
        pass

    def __call__(self, obs):
        return self.rng.uniform(-1, 1, 8)


def test_antmaze_layout_expert_reset_and_a_tiny_run(tmp_path):
    import mbirl_antmaze as mb

    ant = "AntMaze_UMaze-v5"
    d = mb.record_episodes(ant, RandomAnt(0), 1)
    env, horizon = hy.make_env(ant)
    assert horizon == 700 and env.observation_space.shape == (31,) and d["observations"].shape == (700, 31)
    assert not Path(env.unwrapped.tmp_xml_file_path).exists()  # the maze XML written to the temp dir is removed
    for i in (0, 350, 698):
        env.reset(seed=7)
        obs = hy.restore_state(env, d["qpos"][i], d["qvel"][i], d["qacc_warmstart"][i], d["goal"][i])
        np.testing.assert_allclose(obs, d["observations"][i], atol=1e-5)
        np.testing.assert_allclose(env.step(d["actions"][i])[0], d["next_observations"][i], atol=1e-5)
    env.close()
    demos = save_npz(tmp_path / "ant.npz", d)
    argv = ["--env-id", ant, "--expert.path", demos, "--run-dir", tmp_path / "run", "--irl.reset-prob", 0.5]
    argv += [*MAZE_TINY, "--irl.total-timesteps", 150, "--eval.episodes", 1, "--max-episode-steps", 40]
    code, err = quiet_main(lambda: hy.main([str(a) for a in argv]))
    assert code == 0, err[-2000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["env_id"] == ant and res["success_rate"] in (0.0, 1.0) and res["policy_env_steps"] == 150


def test_the_printed_command_resumes_a_run_in_its_default_run_dir(tmp_path, experts_dir):
    """Issue 48 item 10: without --run-dir the run dir ends in a timestamp; the interrupt message gives the command
    with --run-dir, and running it exactly as printed resumes (the step counter continues)."""
    flags = ["--env-id", PENDULUM, "--expert.experts-dir", experts_dir, "--irl.total-timesteps", 100000, *TINY]
    flags += ["--sac.learning-starts", 50, "--irl.train-every", 100, "--checkpoint-every", 100]
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), *map(str, flags), "--eval.frequency", "100000"]
    check_printed_command_resumes(cmd, tmp_path, lambda step, text: f"resuming from step {step}" in text)


@pytest.mark.parametrize(
    "phase, flags",
    [
        ("discriminator rollouts", ["--disc.trajectories", "1000"]),
        ("discriminator update", ["--disc.steps", "10000", "--disc.batch-size", "20000"]),
    ],
)
def test_a_signal_inside_a_long_phase_exits_130_within_10_s(tmp_path, experts_dir, phase, flags):
    """Issue 48 item 9: the stop flag is checked inside each env step batch and update, not once per policy step: a
    SIGTERM while an outer iteration's PHASE runs (seconds to minutes with these flags) ends the run with exit 130
    within 10 s, the checkpoint holding the state before that outer iteration."""
    cmd = script_command("--env-id", PENDULUM, "--expert.experts-dir", experts_dir, *TINY)
    cmd += ["--sac.learning-starts", "50", "--irl.train-every", "100", "--run-dir", str(tmp_path / "run"), *flags]
    rc, _, err, seconds = interrupt_when_found(cmd, tmp_path, "run/events.out.tfevents*", after_s=3)
    assert rc == 130 and seconds < 10 and "interrupted in the IRL phase at step " in err, (seconds, err[-2000:])
    saved = torch.load(tmp_path / "run" / "checkpoints" / "irl.pt", weights_only=False)["progress"]
    assert saved["step"] == 100 * saved["k"], saved  # the outer iteration of that step is not counted: redone


RETIRED = [
    (["--expert.expert-path", "demos.npz"], "--expert.path"),
    (["--expert.expert_path=demos.npz"], "--expert.path"),
    (["--checkpoint-frequency", "100"], "--checkpoint-every"),
    (["--threads", "2"], "--torch-threads"),
]


@pytest.mark.parametrize("flag, new", RETIRED)
def test_old_flag_spellings_are_refused_with_a_hint_to_the_new_name(tmp_path, experts_dir, flag, new):
    """Issue 48 item 8: one flag name per concept across the scripts (--expert.path, --checkpoint-every,
    --torch-threads); an old spelling (--expert.expert-path was an alias here) exits 2 naming the new one, before
    anything is created."""
    argv = ["--env-id", PENDULUM, "--expert.experts-dir", str(experts_dir), *flag, "--run-dir", str(tmp_path / "run")]
    assert f"use {new} " in one_line_exit_2(lambda: hy.main(argv))
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def whole_and_resumed_runs(tmp_path_factory, pendulum_demos) -> tuple[Path, Path]:
    """The same tiny run (1,000 policy steps, an outer iteration every 100, a checkpoint every 100) twice on the CPU:
    uninterrupted, and killed (SIGTERM) once its first checkpoint exists, then resumed with its own command."""
    root = tmp_path_factory.mktemp("resume")
    demos = save_npz(root / "demos.npz", pendulum_demos)
    flags = irl_resume_flags(demos, [*TINY, "--max-episode-steps", 200])
    return whole_and_killed_then_resumed(SCRIPT, root, flags, "resuming from step {step}")


@pytest.mark.slow
def test_a_killed_and_resumed_run_ends_with_the_counters_of_an_uninterrupted_one(whole_and_resumed_runs):
    """Issue 48 (resume): stopped mid-phase and resumed, a run ends with the policy steps, outer iterations
    (discriminator updates) and evaluation steps of the uninterrupted run."""
    assert_counters_of_1000_steps(whole_and_resumed_runs, "step")


@pytest.mark.slow
def test_a_killed_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(whole_and_resumed_runs):
    """Issue 48 (exact resume): on the CPU with the same seed, the resumed run's policy and evaluation returns equal
    the uninterrupted run's: the checkpoint holds the episode in progress (simulator state, its seed, time index,
    observation), and a signal inside an outer iteration or an evaluation puts its RNGs and counters back first."""
    assert_same_weights_and_eval_returns(hy.load_policy, *whole_and_resumed_runs)


def test_the_expert_phase_keeps_the_best_evaluated_actor_not_the_last(tmp_path, monkeypatch):
    """As the reference's EvalCallback best_model: evaluations every 100 steps return 5, 9, 3 (scripted), so the
    demos' actor is the one evaluated at step 200, and the phase says so."""
    from torch.utils.tensorboard import SummaryWriter

    seen = scripted_expert_evaluations(monkeypatch, hy, [5.0, 9.0, 3.0], with_successes=True)
    args = hy.Args(env_id="InvertedPendulum-v5", log_frequency=500, checkpoint_every=10**6)
    args.sac.learning_starts, args.sac.hidden_dim = 50, 64
    args.expert.timesteps, args.expert.eval_every = 300, 100
    info = hy.EnvInfo(4, 1, np.array([-3.0], np.float32), np.array([3.0], np.float32))
    writer = SummaryWriter(str(tmp_path))
    sac, _, best, steps = hy.train_expert(args, info, hy.Run(tmp_path, writer, torch.device("cpu")), None)
    writer.close()
    assert best == [9.0, 200] and steps == 300 and len(seen) == 3
    assert_actor_is(sac.actor, seen[1])
    assert_actor_is(sac.actor, seen[2], expected=False)  # not the last


def test_the_expert_phase_stops_at_the_first_evaluation_that_reaches_the_target(tmp_path, monkeypatch, pendulum_demos):
    """--expert.target-return: training stops at the first evaluation that reaches it (conftest's check)."""
    from torch.utils.tensorboard import SummaryWriter

    args = hy.Args(env_id="InvertedPendulum-v5", log_frequency=500, checkpoint_every=10**6)
    args.sac.learning_starts, args.sac.hidden_dim, args.expert.experts_dir = 50, 64, str(tmp_path / "experts")
    info = hy.EnvInfo(4, 1, np.array([-3.0], np.float32), np.array([3.0], np.float32))
    writer = SummaryWriter(str(tmp_path))
    run = hy.Run(tmp_path, writer, torch.device("cpu"))
    check_expert_stops_at_target(
        monkeypatch, hy, True, args, lambda: hy.train_expert(args, info, run, None), pendulum_demos
    )
    writer.close()


@pytest.mark.slow
def test_a_run_killed_inside_an_expert_episode_continues_it_exactly(tmp_path):
    """Issue 48 (exact resume, expert phase): SAC on the true reward, killed inside an episode (HalfCheetah-v5 never
    terminates; 400-step episodes here, the kill comes with the checkpoint of step 500) and resumed, continues that
    episode (simulator state, its seed, time index, return, every RNG): the counters, expert weights, demos and the
    final policy equal an uninterrupted run's."""
    flags = ["--env-id", "HalfCheetah-v5", "--max-episode-steps", 400, "--expert.timesteps", 1200]
    flags += ["--expert.num-demos", 1, "--sac.learning-starts", 500, "--checkpoint-every", 500]
    flags += ["--expert.eval-every", 500, "--expert.eval-episodes", 1]  # evaluations at 500 (the kill) and 1,000
    flags += ["--irl.total-timesteps", 600, "--irl.train-every", 300, "--eval.frequency", 600]
    flags += ["--disc.trajectories", 1, "--torch-threads", 1, *TINY]
    resumed_at = "[expert] resuming from step {step}"
    runs = whole_and_killed_in_the_expert_phase(SCRIPT, tmp_path, flags, 400, resumed_at)
    assert_same_expert_phase(runs)
    assert_same_weights_and_eval_returns(hy.load_policy, runs[0][0], runs[1][0])
