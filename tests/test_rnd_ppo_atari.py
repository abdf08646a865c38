"""Tests of rnd_ppo_atari.py: the RND math against hand computations, a novelty behaviour test, a smoke run, a 2-rank
torchrun run, the user contract (policy.pt snippet, --eval-only, video, exit codes, reproducibility), resume after
SIGTERM and generated bad input."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from atari_contract import *  # noqa: F403  the bad-input tests shared with trex_ppo_atari.py, run on this script
from conftest import (
    REPO_ROOT,
    assert_run_directory_printed_at_start_and_end,
    assert_same_weights_and_eval_returns,
    check_eval_only_signal_writes_nothing,
    check_foreign_run_dirs_refused,
    check_help_groups,
    check_numeric_flag_cases,
    corrupted,
    each_file_corrupted,
    eval_only_twice,
    exit_2_naming_the_file,
    file_bytes,
    interrupt_when_exists,
    interrupt_when_found,
    numeric_flag_cases,
    one_line_exit_2,
    printed_resume_command,
    quiet_main,
    run_contract_snippet,
    subprocess_env,
)

import rnd_ppo_atari as rnd

SCRIPT = "rnd_ppo_atari.py"
# Tiny budgets: 4 envs x 16 steps per iteration, episodes capped at 100 agent steps, one short evaluation.
TINY = ["--ppo.num-envs", "4", "--ppo.num-steps", "16", "--ppo.num-minibatches", "2", "--ppo.update-epochs", "1"]
TINY += ["--rnd.num-iterations-obs-norm-init", "1", "--env.max-episode-frames", "400", "--eval.episodes", "1"]
TINY += ["--no-progress-bar"]


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
    normalised, state = rnd.intrinsic_rewards(rewards, torch.zeros(2), rms, 0.5, rnd.World())
    # all T*N filtered values 1, 2.5, 4.25, 10, 25, 42.5: count 6 (not N or T), population variance 224.217
    assert rms.count == pytest.approx(6 + 1e-4)
    assert rms.var.item() == pytest.approx(224.217, rel=1e-3)
    # no mean subtraction: divided by std(filtered values) = 14.9739
    expected = [[1 / 14.9739, 10 / 14.9739], [2 / 14.9739, 20 / 14.9739], [3 / 14.9739, 30 / 14.9739]]
    torch.testing.assert_close(normalised, torch.tensor(expected), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(state, filtered[-1])


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
    # k3 = mean((r - 1) - log r) = ((0.5 - 0.405465) + (-0.5 + 0.693147)) / 2
    assert approx_kl.item() == pytest.approx(0.143841, abs=1e-6)


def test_env_ids_map_to_roms():
    assert rnd.resolve_env_id("MontezumaRevengeNoFrameskip-v4") == "montezuma_revenge"
    assert rnd.resolve_env_id("ALE/MontezumaRevenge-v5") == "montezuma_revenge"
    assert rnd.resolve_env_id("ALE/MsPacman-v5") == "ms_pacman"


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
        return torch.stack(
            [(255 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 120.0)).to(torch.uint8) for cy, cx in centres]
        )

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


def test_gru_policy_act_keeps_and_resets_its_state():
    torch.manual_seed(0)
    agent = rnd.Agent(4, rnn_hidden_layers=1).eval()
    obs = np.random.default_rng(0).integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
    agent.act(obs)
    carried = agent.act_state.clone()
    assert carried.abs().sum() > 0
    agent.act(obs, first=np.array([True, False]))
    state_after_reset = agent.act_state
    agent.act_state = None
    agent.act(obs)  # a fresh start: as if every env started an episode
    torch.testing.assert_close(state_after_reset[:, 0], agent.act_state[:, 0])
    assert not torch.allclose(state_after_reset[:, 1], agent.act_state[:, 1])


# ---------------------------------------------------------------------------------------------------------------
# Rooms in training: RoomEnvs (Python envs with RAM) against ale-py's vector env, and the bookkeeping
# ---------------------------------------------------------------------------------------------------------------
def test_room_envs_give_the_vector_envs_frames_rewards_and_episode_ends():
    """Without sticky actions both backends are deterministic: the same actions give bit-identical observations (the
    zero-padded stack at a reset too), rewards, terminals, truncations (the frame cap) and final_obs, through step and
    through send/recv; only RoomEnvs has info["room"]."""
    settings = dict(sticky_action_prob=0.0, max_episode_frames=200)
    vector = rnd.make_envs(rnd.EnvArgs(**settings, track_rooms=False), "montezuma_revenge", 3, 5)
    python = rnd.make_envs(rnd.EnvArgs(**settings), "montezuma_revenge", 3, 5)
    assert type(vector).__name__ == "AtariVectorEnv" and isinstance(python, rnd.RoomEnvs)
    assert python.single_action_space == vector.single_action_space and python.num_envs == 3
    first = [envs.reset(seed=np.arange(5, 8))[0] for envs in (vector, python)]
    assert first[0].shape == (3, 4, 84, 84) and first[0].dtype == np.uint8 and np.array_equal(*first)
    assert np.array_equal(python.reset(seed=5)[0], first[1])  # an int seeds envs 5, 6, 7 (as the contract's reset)
    rng, ends = np.random.default_rng(0), 0
    for t in range(120):
        actions = rng.integers(0, 18, 3)
        if t % 2:
            for envs in (vector, python):
                envs.send(actions)
            a, b = vector.recv(), python.recv()
        else:
            a, b = vector.step(actions), python.step(actions)
        for x, y in zip(a[:4], b[:4]):
            assert x.dtype == y.dtype and np.array_equal(x, y), t
        assert ("final_obs" in a[4]) == ("final_obs" in b[4]) and "room" in b[4] and "room" not in a[4]
        done = a[2] | a[3]
        if done.any():
            assert np.array_equal(a[4]["final_obs"][done], b[4]["final_obs"][done]) and not (a[0][done] == 0).all()
            ends += done.sum()
    assert ends == 6  # 200 frames = 50 agent steps: each env's episode ended twice
    assert type(rnd.make_envs(rnd.EnvArgs(), "breakout", 1, 0)).__name__ == "AtariVectorEnv"  # no room byte


def test_emulator_seeds_wrap_below_2_31_for_the_vector_env_only():
    """The envs of rank r start at seed x 100003 + r x N: above 2**31 for --seed 21475 or more, which ale-py's vector
    env (32-bit seeds) refused with a traceback after the run dir was made. Its seeds are wrapped below 2**31
    (unchanged below); RoomEnvs' Python envs keep the unwrapped seeds they always had."""
    seed = 30000 * 100_003
    vector = rnd.make_envs(rnd.EnvArgs(), "breakout", 2, seed)  # raised TypeError in ale-py's reset
    assert rnd.emulator_seeds(vector, seed).tolist() == [seed % 2**31, seed % 2**31 + 1]
    assert rnd.emulator_seeds(vector, 5).tolist() == [5, 6]
    vector.close()
    rooms = rnd.make_envs(rnd.EnvArgs(), "montezuma_revenge", 1, seed)
    assert isinstance(rooms, rnd.RoomEnvs) and rnd.emulator_seeds(rooms, seed).tolist() == [seed]


def test_a_signal_while_the_envs_start_stops_before_the_next_env_or_the_seeded_reset(monkeypatch):
    """Issue 48 battery, finding 6: making 128 RoomEnvs takes ~30 s on a busy CPU (each a gymnasium env with its
    emulator) and no stop flag was read meanwhile, so a SIGTERM then took up to 51 s; now each env checks it first.
    ale-py's vector env is made and then seeded by two long C++ calls (~10 CPU-s each for 128 emulators) that no
    signal interrupts: the flag is checked between them, so a signal during the first skips the second."""
    import ale_py.vector_env

    made = []
    monkeypatch.setattr(rnd, "make_python_env", lambda *a: made.append(a) or rnd.STOP.update(signal=15))
    monkeypatch.setattr(rnd, "STOP", {"signal": 0, "solo": True})
    with pytest.raises(rnd.Interrupted, match="during the env start-up"):
        rnd.make_envs(rnd.EnvArgs(), "montezuma_revenge", 128, 0)
    assert len(made) == 1  # the signal came while the first env was made: no second one

    class SignalledWhileMade:  # stands for AtariVectorEnv: a signal arrives while its constructor runs
        def __init__(self, **settings):
            self.num_envs = settings["num_envs"]
            rnd.STOP.update(signal=15)

        def reset(self, seed):
            made.append(seed)

    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", SignalledWhileMade)
    rnd.STOP["signal"] = 0
    with pytest.raises(rnd.Interrupted, match="during the env start-up"):
        rnd.make_envs(rnd.EnvArgs(), "breakout", 128, 0)
    assert len(made) == 1  # not seeded after the signal


def test_evaluation_plays_more_episodes_than_envs_in_waves():
    """5 episodes on 2 envs (env 0 plays episodes 0, 2, 4; env 1 plays 1 and 3): every episode is played to the
    10-step cap (40 frames) and keeps its own score, length and rooms."""
    agent, env_args = rnd.Agent(18), rnd.EnvArgs(max_episode_frames=40)
    ev = rnd.evaluate(agent, env_args, "montezuma_revenge", rnd.EvalArgs(episodes=5, num_envs=2), "cpu", 3)
    assert ev["lengths"] == [10] * 5 and ev["returns"] == [0.0] * 5 and ev["rooms"] == [[1]] * 5


def test_rollouts_record_each_episodes_rooms_and_every_room_from_ram():
    """Env 0 is moved to room 0 by writing RAM byte 3 between two rollouts (walking out of room 1 takes hundreds of
    precise steps): its episode then counts 2 rooms, env 1's 1, and the process has seen {0, 1}."""
    envs = rnd.RoomEnvs(rnd.EnvArgs(sticky_action_prob=0.0, max_episode_frames=40), "montezuma_revenge", 2, 3)
    agent = rnd.Agent(envs.single_action_space.n)
    player, buf = rnd.Player(envs, agent, 3, "cpu"), rnd.Rollout(6, 2, "cpu")
    assert player.rollout(agent, buf) == [] and player.rooms == {1}  # 40 frames = 10 steps: no episode ended yet
    envs.envs[0].unwrapped.ale.setRAM(3, 0)
    episodes = player.rollout(agent, buf)
    assert [(step, length, rooms) for step, _, length, rooms in episodes] == [(3, 10, 2), (3, 10, 1)]
    assert player.rooms == {0, 1} and player.episode_rooms == [{1}, {1}]  # the new episodes start in room 1
    run = {"global_step": 100, "history": {"episode_step": [], "episode_rooms": []}}
    recent = []
    rnd.log_episodes(None, run, recent, episodes, 2)
    assert len(recent) == 2 and run["history"]["episode_rooms"] == []  # other ranks keep scores only


def learner_for_snapshot():
    agent, model = rnd.Agent(18), rnd.RNDModel()
    optimizer = torch.optim.Adam([*agent.parameters(), *model.predictor.parameters()])
    norms = dict(obs_rms=rnd.RunningMeanStd((84, 84)), reward_rms=rnd.RunningMeanStd(()))
    return dict(agent=agent, rnd=model, optimizer=optimizer, **norms)


def test_snapshot_keeps_training_rooms_and_their_curve_through_resume():
    learner, world = learner_for_snapshot(), rnd.World()
    run, _ = rnd.resume(None, learner, [], world, 1, torch.zeros(2))
    run |= {"iteration": 4, "global_step": 256, "rooms_train": {0, 1, 4}}
    run["history"]["train_rooms"] = [1, 1, 2, 3]
    state = rnd.snapshot_state(learner, run, [], torch.zeros(2), copied=True)
    run["rooms_train"].add(7)  # after the copy: not in the snapshot
    resumed, _ = rnd.resume(state, learner_for_snapshot(), [], world, 1, torch.zeros(2))
    assert resumed["rooms_train"] == {0, 1, 4} and resumed["history"]["train_rooms"] == [1, 1, 2, 3]


@pytest.mark.slow
def test_training_rooms_survive_an_interrupt_and_reach_results_and_events(tmp_path, monkeypatch):
    """In process: the first start reads the 'room' from RAM byte 42 (the player's x, which random play changes) and
    is stopped as by SIGTERM in iteration 3; the resumed start reads the true byte 3. Its results keep every x seen
    before the stop, the curve continues, and TensorBoard has the per-iteration and per-episode room counts."""
    command = ["--env-id", "MontezumaRevengeNoFrameskip-v4", *TINY, "--env.max-episode-frames", "40"]
    command += ["--eval.episodes", "0", "--ppo.total-timesteps", "256", "--run-dir", str(tmp_path / "run")]
    measure_sps = rnd.measure_sps

    def stop_after_two(run, sps_start):
        if run["iteration"] == 2:
            rnd.STOP["signal"] = 15
        return measure_sps(run, sps_start)

    with monkeypatch.context() as patch:
        patch.setitem(rnd.ROOM_RAM_ADDRESS, "montezuma_revenge", 42)
        patch.setattr(rnd, "measure_sps", stop_after_two)
        code, err = quiet_main(lambda: rnd.main(rnd.parse_args(command)))
    assert code == 130 and "resume with" in err, err
    before = set(rnd.load(rnd.checkpoint_paths(tmp_path / "run")[-1], "snapshot")["rooms_train"])
    assert len(before) > 2, before
    code, _ = quiet_main(lambda: rnd.main(rnd.parse_args(command)))
    assert code == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(res["rooms_seen_train"]) == before | {1} and res["visited_rooms_train"] == len(before | {1})
    curve = res["train_rooms_curve"]
    assert curve["step"] == [64, 128, 192, 256] and curve["visited_rooms"][2:] == [len(before | {1})] * 2
    assert curve["visited_rooms"][1] == len(before) and len(res["train_episode_rooms"]["step"]) >= 4
    tags = scalars(tmp_path / "run")
    assert [s for s, _ in tags["charts/visited_rooms_train"]] == [64, 128, 192, 256]
    assert [v for _, v in tags["charts/episodic_rooms"]] == res["train_episode_rooms"]["rooms"]


# ---------------------------------------------------------------------------------------------------------------
# Subprocess runs of the real command, and the user contract
# ---------------------------------------------------------------------------------------------------------------
FINISHED_RUN = ["--env-id", "MontezumaRevengeNoFrameskip-v4", *TINY, "--progress-bar", "--torch-threads", "1"]
FINISHED_RUN += ["--ppo.total-timesteps", "192", "--capture-video"]  # the command of the finished tiny run


def build_finished_run(tmp_path_factory):
    from conftest import run_script_subprocess

    run_dir = tmp_path_factory.mktemp("rnd") / "run"
    rc, out, err = run_script_subprocess(SCRIPT, *FINISHED_RUN, "--run-dir", run_dir, timeout=240)
    assert rc == 0, err[-3000:]
    assert_run_directory_printed_at_start_and_end(out, run_dir)
    # stderr is not a terminal: plain progress lines (one every 30 s and one at the end), no tqdm bars
    assert "\r" not in err and "training: 192/192 (100 %" in err, err[-3000:]
    assert json.loads((run_dir / "args.json").read_text())["args"]["torch_threads"] == 1
    return run_dir


def check_smoke_run_writes_all_artifacts(finished_run, run_script):
    run_dir = finished_run
    res = json.loads((run_dir / "results.json").read_text())
    for key in ("eval_mean_return", "eval_std_return", "global_step", "sps", "visited_rooms"):
        assert math.isfinite(res[key]), key
    assert res["global_step"] == 192 and res["iterations"] == 3 and res["frames"] == 768
    assert res["visited_rooms"] >= 1 and res["eval_lengths"][0] <= 100  # RAM[3] rooms; 400-frame cap = 100 steps
    saved = json.loads((run_dir / "args.json").read_text())
    assert (
        saved["script"] == SCRIPT and saved["env_id"] == "MontezumaRevengeNoFrameskip-v4" and saved["batch_size"] == 64
    )
    assert [p.name for p in rnd.checkpoint_paths(run_dir)] == ["ckpt_00000003.pt"]
    ckpt = rnd.load(rnd.checkpoint_paths(run_dir)[0], "snapshot")
    assert {"agent", "rnd", "optimizer", "obs_rms", "reward_rms", "filter_state", "rng", "global_step"} <= set(ckpt)
    assert ckpt["obs_rms"]["count"] > 256  # warm-up (64 frames) + 3 rollouts of 64 next frames
    tags = scalars(run_dir)
    for tag in (
        "charts/SPS",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/value_loss",
        "rnd/predictor_loss",
        "rnd/intrinsic_reward",
        "rnd/intrinsic_return",
        "rnd/extrinsic_return",
        "charts/visited_rooms",
        "eval/episodic_return",
    ):
        assert tag in tags and all(math.isfinite(v) for _, v in tags[tag]), tag
    assert [s for s, _ in tags["charts/SPS"]] == [128, 192]  # SPS starts after the first iteration
    assert (run_dir / "curves.png").stat().st_size > 1000
    # a finished run is never overwritten: the same command exits 0, nothing changed; other flags exit 2 naming them
    before = file_bytes(run_dir)
    rc, out, err = run_script(SCRIPT, *FINISHED_RUN, "--run-dir", run_dir)
    assert rc == 0 and "finished" in out, err
    changed = [*FINISHED_RUN, "--seed", "2", "--ppo.total-timesteps", "256", "--run-dir", str(run_dir)]
    line = one_line_exit_2(lambda: rnd.main(rnd.parse_args(changed)))
    assert "--seed 2 (was 1)" in line and "--ppo.total-timesteps 256 (was 192)" in line, line
    assert file_bytes(run_dir) == before


def check_contract_snippet_video_and_eval_only(finished_run, run_script, monkeypatch):
    import cv2

    capture = cv2.VideoCapture(str(next((finished_run / "videos").glob("*.webm"))))
    assert int(capture.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little") == b"VP90" and capture.read()[0]
    monkeypatch.chdir(finished_run.parent)  # the five lines of docs/CONTRACT.md, from where a user stands
    policy, envs, actions = run_contract_snippet(rnd, "run/policy.pt")
    assert actions.shape == (1,) and envs.single_action_space.contains(int(actions[0]))
    assert not policy.training and policy.env_id == "MontezumaRevengeNoFrameskip-v4"
    envs.close()
    eval_only = [SCRIPT, "--eval-only", finished_run, "--eval.episodes", "1", "--capture-video"]
    for ev in eval_only_twice(lambda: run_script(*eval_only), finished_run):
        assert len(ev["eval_returns"]) == 1 and ev["env_id"] == "MontezumaRevengeNoFrameskip-v4"
    assert (finished_run / "videos" / "eval_002.webm").exists()


def check_corrupt_artifacts_give_exit_2_or_a_clean_redo(finished_run, tmp_path):
    """Every file of a finished run dir, truncated or replaced by random bytes, then the resume command (results.json
    removed; the budget is reached, so only the final step runs): exit 2 naming the file, or 0 -- never a traceback."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir, ignore=shutil.ignore_patterns("evaluations", "videos"))
    (run_dir / "results.json").unlink()
    command = ["--env-id", "MontezumaRevengeNoFrameskip-v4", *TINY, "--ppo.total-timesteps", "192"]
    command += ["--eval.episodes", "0", "--run-dir", str(run_dir)]
    exit_2 = []
    read_on_resume = ("args.json", "ckpt_00000003.pt")  # both damages for these, one of the two for the rest
    for path, how in each_file_corrupted(run_dir, read_on_resume):
        if exit_2_naming_the_file(lambda: rnd.main(rnd.parse_args(command)), path):
            exit_2.append(path.name)
        (run_dir / "results.json").unlink(missing_ok=True)
    assert set(read_on_resume) <= set(exit_2)
    for name in ("args.json", "policy.pt"):  # what --eval-only reads
        with corrupted(run_dir / name):
            assert name in one_line_exit_2(lambda: rnd.main(rnd.parse_args(["--eval-only", str(run_dir)])))
    (run_dir / "results.json").write_text("{not json")
    assert "results.json" in one_line_exit_2(lambda: rnd.main(rnd.parse_args(command)))


@pytest.mark.slow
def test_finished_run_artifacts_contract_and_corrupt_files(tmp_path_factory, monkeypatch, run_script, tmp_path):
    """One tiny run of the whole command (it takes most of this file's time), then every check that needs it."""
    finished_run = build_finished_run(tmp_path_factory)
    check_smoke_run_writes_all_artifacts(finished_run, run_script)
    check_contract_snippet_video_and_eval_only(finished_run, run_script, monkeypatch)
    check_corrupt_artifacts_give_exit_2_or_a_clean_redo(finished_run, tmp_path)
    for signum in (signal.SIGINT, signal.SIGTERM):  # issue 48: --eval-only stops within 10 s and writes nothing
        (tmp_path / signum.name).mkdir()
        check_eval_only_signal_writes_nothing(SCRIPT, finished_run, tmp_path / signum.name, signum)


@pytest.mark.slow
def test_same_seed_gives_identical_weights(tmp_path, run_script):
    """Issue 16: the same command twice (one torch thread) gives the same weights and the same evaluation."""
    for name in ("a", "b"):
        command = ["--env-id", "BreakoutNoFrameskip-v4", *TINY, "--ppo.total-timesteps", "128", "--seed", "5"]
        rc, _, err = run_script(SCRIPT, *command, "--run-dir", tmp_path / name, timeout=240)
        assert rc == 0, err[-2000:]
    assert_same_weights_and_eval_returns(rnd.load_policy, tmp_path / "a", tmp_path / "b")
    ra, rb = (rnd.load(rnd.checkpoint_paths(tmp_path / name)[-1], "snapshot")["rnd"] for name in "ab")
    assert all(torch.equal(ra[k], rb[k]) for k in ra)  # the predictor too


@pytest.mark.parametrize(("raised", "code", "stderr"), [(None, 0, ""), (2, 2, ""), ("bad flag", 1, "bad flag\n")])
def test_a_torchrun_rank_ends_with_main_s_exit_code(monkeypatch, capsys, raised, code, stderr):
    """A rank ends by os._exit (gloo's worker threads can abort the interpreter's own shutdown), with main's code."""

    def fake_main(_args):
        if raised is not None:
            raise SystemExit(raised)

    ended = []
    monkeypatch.setattr(rnd, "parse_args", lambda: None)
    monkeypatch.setattr(rnd, "main", fake_main)
    monkeypatch.setattr(rnd.os, "_exit", ended.append)
    rnd.run_rank()
    assert ended == [code] and capsys.readouterr().err == stderr


@pytest.mark.slow
def test_torchrun_two_ranks_end_with_identical_weights(run_dir):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", SCRIPT, "--env-id", "BreakoutNoFrameskip-v4"]
    cmd += ["--ppo.num-envs", "2", "--ppo.num-steps", "8", "--ppo.num-minibatches", "2", "--ppo.update-epochs", "2"]
    cmd += ["--rnd.num-iterations-obs-norm-init", "1", "--ppo.total-timesteps", "64", "--eval.episodes", "0"]
    cmd += ["--policy.rnn-hidden-layers", "1", "--no-progress-bar", "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["world_size"] == 2 and res["global_step"] == 64 and res["iterations"] == 2 and res["policy"] == "gru"
    assert res["visited_rooms"] is None  # rooms are a Montezuma/Pitfall metric only
    sums = res["rank_param_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]  # gradients all-reduced: same weights on both ranks
    assert res["rank_obs_checksums"][0] != res["rank_obs_checksums"][1]  # ...from different envs/seeds
    norms = res["rank_normaliser_checksums"]
    assert len(norms) == 2 and norms[0] == norms[1]  # observation and reward statistics merged across ranks


@pytest.mark.slow
def test_resume_after_sigterm_continues_from_saved_iteration(run_dir, run_script):
    args = [SCRIPT, "--env-id", "BreakoutNoFrameskip-v4", *TINY, "--checkpoint-every", "1"]
    args += ["--keep-checkpoints", "2", "--run-dir", str(run_dir)]
    first = run_dir / "checkpoints" / "ckpt_00000001.pt"
    rc, _, err = interrupt_when_exists([sys.executable, *args, "--ppo.total-timesteps", "64000"], first)
    assert rc == 130, err[-3000:]
    assert f"--run-dir {run_dir}" in err and not (run_dir / "results.json").exists()
    assert (run_dir / "curves.png").exists()  # plotted during training
    saved = rnd.load(rnd.checkpoint_paths(run_dir)[-1], "snapshot")
    k = saved["iteration"]
    assert k >= 1 and saved["global_step"] == 64 * k
    rc, out, err = run_script(*args, "--ppo.total-timesteps", str(64 * (k + 2)), timeout=180)
    assert rc == 0, err[-3000:]
    assert f"resumed from iteration {k} (global step {64 * k})" in out
    res = json.loads((run_dir / "results.json").read_text())
    assert res["iterations"] == k + 2 and res["global_step"] == 64 * (k + 2)
    assert [p.name for p in rnd.checkpoint_paths(run_dir)] == [f"ckpt_{k + 1:08d}.pt", f"ckpt_{k + 2:08d}.pt"]
    steps = [s for s, _ in scalars(run_dir)["losses/policy_loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 64 * (k + 2)  # continued, not restarted at step 64


@pytest.mark.slow
def test_target_score_stops_plain_ppo_early(run_script, run_dir):
    # --rnd.int-coef 0 is the paper's PPO baseline: no bonus, no predictor training
    rc, out, err = run_script(
        SCRIPT,
        "--env-id",
        "BreakoutNoFrameskip-v4",
        *TINY,
        "--env.max-episode-frames",
        "40",
        "--ppo.target-score",
        "-1",
        "--ppo.target-score-window",
        "1",
        "--eval.episodes",
        "0",
        "--rnd.int-coef",
        "0",
        "--ppo.total-timesteps",
        "6400",
        "--run-dir",
        run_dir,
        timeout=120,
    )
    assert rc == 0, err[-3000:]
    res = json.loads((run_dir / "results.json").read_text())
    assert res["stop_reason"] == "target_score" and res["iterations"] == 1 and res["train_episodes_in_mean"] == 1
    tags = scalars(run_dir)
    assert [v for _, v in tags["rnd/predictor_loss"]] == [0.0] and [v for _, v in tags["rnd/intrinsic_reward"]] == [0.0]


def test_non_finite_loss_exits_3(tmp_path, monkeypatch):
    monkeypatch.setattr(rnd, "ppo_policy_loss", lambda *a, **k: (torch.tensor(float("nan")),) * 3)
    args = rnd.parse_args(["--env-id", "BreakoutNoFrameskip-v4", *TINY, "--ppo.total-timesteps", "64"])
    args.run_dir = str(tmp_path / "run")
    code, err = quiet_main(lambda: rnd.main(args))
    assert code == 3 and "non-finite loss at iteration 1" in err


# ---------------------------------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming the fix, nothing written
# ---------------------------------------------------------------------------------------------------------------
# Values of the generated cases that are valid, with their documented meaning (the test checks they validate).
DOCUMENTED_VALID = {
    ("--seed", "0"),
    ("--torch-threads", "0"),
    ("--env.sticky-action-prob", "0"),
    ("--env.env-threads", "0"),
    ("--ppo.gamma", "0"),
    ("--ppo.gae-lambda", "0"),
    ("--ppo.ent-coef", "0"),
    ("--ppo.vf-coef", "0"),
    ("--ppo.max-grad-norm", "0"),
    ("--ppo.target-score", "0"),
    ("--ppo.target-score", "-1"),
    ("--rnd.int-gamma", "0"),
    ("--rnd.ext-coef", "0"),
    ("--rnd.int-coef", "0"),
    ("--rnd.num-iterations-obs-norm-init", "0"),
    ("--policy.rnn-hidden-layers", "0"),
    ("--eval.episodes", "0"),
    ("--eval.every", "0"),
}


def test_every_numeric_flag_rejects_zero_negative_nan_and_absurd_values(tmp_path):
    run_dir = tmp_path / "run"
    defaults = rnd.parse_args(["--run-dir", str(run_dir), "--ppo.total-timesteps", "1000000"])
    cases = numeric_flag_cases(rnd.Args)
    assert len(cases) >= 120 and ("--rnd.update-proportion", "0") in cases  # 4 values x 30+ numeric flags
    check_numeric_flag_cases(
        defaults,
        cases,
        DOCUMENTED_VALID,
        main=rnd.main,
        validate=lambda args: rnd.validate(args, rnd.World()),
        unparsed=lambda flag, value: rnd.parse_args([flag, value]),  # NaN for an int: the parser's one-line error
        created=run_dir,
    )


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--ppo.num-envs", "6", "--ppo.num-minibatches", "4"], "multiple of num-minibatches"),
        (["--ppo.num-envs", "2.5"], "--ppo.num-envs"),
        (["--eval-only"], "--eval-only"),
        (["--seed", "-1"], "--seed must be in [0, 4294967295] (got -1)"),  # the bound exact, not 4.29497e+09
        (["--seed", "3.5"], "--seed: invalid literal"),
        (["--seed", "nan"], "--seed: invalid literal"),
        (["--torch-threads", "100000"], "--torch-threads must be in [0, 1024] (got 100000)"),
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
    ],
)
def test_rules_between_flags_and_parse_errors_are_one_line(extra, needle, tmp_path):
    line = one_line_exit_2(lambda: rnd.main(rnd.parse_args(["--run-dir", str(tmp_path / "run"), *extra])))
    assert needle in line and not (tmp_path / "run").exists()


ENV_IDS = {
    "HalfCheetah-v5": "not an Atari game",
    "CartPole-v1": "not an Atari game",
    "MontezumaRevenge-v0": "MontezumaRevengeNoFrameskip-v4",
    "MontezumaRevengeDeterministic-v4": "ALE/MontezumaRevenge-v5",
    "ALE/MontezumaRevenge-v4": "ALE/MontezumaRevenge-v5",
    "MontezumaRevenge-v5": "ALE/MontezumaRevenge-v5",
    "montezuma_revenge": "MontezumaRevengeNoFrameskip-v4",
    "MontezumasRevengeNoFrameskip-v4": "did you mean MontezumaRevengeNoFrameskip-v4",
}


@pytest.fixture
def atari():
    """(this script, its game, ENV_IDS) for the tests shared with trex_ppo_atari.py (atari_contract.py)."""
    return rnd, "MontezumaRevengeNoFrameskip-v4", ENV_IDS


def test_run_dirs_of_other_scripts_envs_and_unwritable_places_are_refused(tmp_path):
    other = tmp_path / "other"
    saved_args = [
        ({"script": "trex_ppo_atari.py", "env_id": "MontezumaRevengeNoFrameskip-v4"}, "not made by rnd_ppo_atari.py"),
        ({"script": SCRIPT, "env_id": "PongNoFrameskip-v4"}, "holds a run on PongNoFrameskip-v4"),
        ({"env_id": "MontezumaRevengeNoFrameskip-v4", "num_envs": 8}, "not made by"),
    ]
    check_foreign_run_dirs_refused(
        lambda folder: rnd.main(rnd.parse_args(["--run-dir", str(folder)])), other, saved_args
    )
    assert "cannot write" in one_line_exit_2(lambda: rnd.main(rnd.parse_args(["--run-dir", "/proc/rnd_run"])))
    assert "no policy.pt" in one_line_exit_2(lambda: rnd.main(rnd.parse_args(["--eval-only", str(other)])))


def test_corrupt_snapshot_exits_2_and_names_the_file(run_dir):
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"script": SCRIPT, "env_id": "BreakoutNoFrameskip-v4"}))
    bad = run_dir / "checkpoints" / "ckpt_00000002.pt"
    bad.write_bytes(b"not a checkpoint")
    argv = ["--env-id", "BreakoutNoFrameskip-v4", *TINY, "--ppo.total-timesteps", "128", "--run-dir", str(run_dir)]
    line = one_line_exit_2(lambda: rnd.main(rnd.parse_args(argv)))
    assert str(bad) in line and "delete it" in line
    assert sorted(p.name for p in run_dir.rglob("*")) == ["args.json", "checkpoints", "ckpt_00000002.pt"]


def test_resume_with_a_different_network_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"script": SCRIPT, "env_id": "MontezumaRevengeNoFrameskip-v4"}))
    snapshot = {k: {} for k in ("agent", "rnd", "optimizer", "obs_rms", "reward_rms", "rng", "history")}
    snapshot |= {"filter_state": torch.zeros(4), "iteration": 3, "global_step": 192, "recent_returns": []}
    snapshot |= {"rooms_seen": [], "rooms_train": [], "config": {"rnn_hidden_layers": 0, "rnn_hidden_size": 256}}
    rnd.save(run_dir / "checkpoints" / "ckpt_00000003.pt", "snapshot", **snapshot)
    inputs = rnd.validate_run_dir(rnd.parse_args(["--run-dir", str(run_dir)]), "cpu", "montezuma_revenge")
    assert inputs.snapshot["iteration"] == 3
    args = rnd.parse_args(["--run-dir", str(run_dir), "--policy.rnn-hidden-layers", "1"])
    assert "--policy.rnn-hidden-layers 0: resume with the same values" in one_line_exit_2(lambda: rnd.main(args))


def test_help_is_grouped_by_phase():
    check_help_groups(
        lambda: rnd.parse_args(["--help"]),
        groups=("env", "ppo", "rnd", "policy", "eval"),
        absent=("--batch-size", "--num-iterations "),  # derived values are not flags
    )


@pytest.mark.slow
def test_the_printed_command_resumes_a_run_in_its_default_run_dir(tmp_path):
    """Issue 48 item 10: without --run-dir the run dir ends in a timestamp; the interrupt message gives the command
    with --run-dir, and running it exactly as printed resumes (the iteration counter continues)."""
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), "--env-id", "BreakoutNoFrameskip-v4", *TINY]
    cmd += ["--checkpoint-every", "1", "--ppo.total-timesteps", "64000"]
    rc, _, err, _ = interrupt_when_found(cmd, tmp_path, "runs/*/checkpoints/ckpt_00000001.pt")
    assert rc == 130, err[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    k = rnd.load(rnd.checkpoint_paths(run_dir)[-1], "snapshot")["iteration"]
    resume = printed_resume_command(err)
    assert resume[-2:] == ["--run-dir", str(run_dir.relative_to(tmp_path))], resume
    rc, out, err, _ = interrupt_when_found(resume, tmp_path, f"runs/*/checkpoints/ckpt_{k + 1:08d}.pt")
    assert rc == 130 and f"resumed from iteration {k} " in out, err[-2000:]
    assert [p.parent.name for p in (tmp_path / "runs").glob("*/args.json")] == [run_dir.name]  # no new run dir
    assert rnd.load(rnd.checkpoint_paths(run_dir)[-1], "snapshot")["iteration"] > k


# 512 RoomEnvs (a gymnasium env with its emulator each) take a minute or more to make: a signal lands meanwhile
MANY_ROOM_ENVS = ["--env-id", "MontezumaRevengeNoFrameskip-v4", "--ppo.num-envs", "512"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase, flags, wait_for, saved",
    [  # (the phase signalled, its flags, the file whose appearance starts the 2 s wait, the snapshot left)
        ("PPO update", ["--ppo.update-epochs", "40"], "run/checkpoints/ckpt_00000001.pt", 1),
        ("observation-normalisation warm-up", ["--rnd.num-iterations-obs-norm-init", "100000"], "run/args.json", None),
        ("env start-up", MANY_ROOM_ENVS, "run/args.json", None),
    ],
)
def test_a_signal_inside_a_long_phase_exits_130_within_10_s(tmp_path, phase, flags, wait_for, saved):
    """Issue 48 item 9: the stop flag is checked per env step batch and per PPO minibatch, not once per iteration:
    a SIGTERM inside a long update, warm-up or env start-up ends the run with exit 130 within 10 s; inside an update,
    the snapshot of the last whole iteration is saved."""
    cmd = [sys.executable, str(REPO_ROOT / SCRIPT), "--env-id", "BreakoutNoFrameskip-v4", *TINY, *flags]
    cmd += ["--checkpoint-every", "1", "--ppo.total-timesteps", "64000", "--run-dir", str(tmp_path / "run")]
    rc, _, err, seconds = interrupt_when_found(cmd, tmp_path, wait_for, after_s=2)
    assert rc == 130 and seconds < 10 and f"during {'a' if saved else 'the'} {phase}" in err, (seconds, err[-2000:])
    snapshots = rnd.checkpoint_paths(tmp_path / "run")
    assert (rnd.load(snapshots[-1], "snapshot")["iteration"] if snapshots else None) == saved
