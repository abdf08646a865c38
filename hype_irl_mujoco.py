"""HyPE: hybrid inverse RL on MuJoCo — the learner's SAC minibatches mix expert transitions into its own replay.

Moment matching alternates a discriminator (a cost) f(s, a), trained with an integral-probability-metric loss plus a
gradient penalty, and a SAC learner maximising -f(s, a). HyPE makes the policy step cheap: every SAC minibatch holds
a fraction rho of expert transitions and 1 - rho of the learner's own replay, all relabelled with the CURRENT
discriminator, so the learner needs no global exploration. `--irl.reset-prob > 0` adds FILTER's resets to expert
states (HyPE+FILTER); `--irl.rho-schedule 0` is plain moment matching. Paper: Ren, Swamy, Wu, Bagnell, Choudhury
(2024), "Hybrid Inverse Reinforcement Learning", ICML 2024 (arXiv 2402.08848).

Usage:
    python hype_irl_mujoco.py --env-id Hopper-v5                       # expert phase (or the cache), then HyPE
    python hype_irl_mujoco.py --env-id InvertedPendulum-v5 --expert.timesteps 10000 --irl.total-timesteps 10000
    python hype_irl_mujoco.py --run-dir runs/X                          # resume; --eval-only runs/X evaluates

Mazes (PointMaze/AntMaze on mbirl_antmaze.py's demos), defaults, the data format, the run dir: docs/hype_irl_mujoco.md.
"""

import contextlib
import copy
import ctypes
import dataclasses
import datetime as dt
import difflib
import importlib.util
import io
import json
import math
import os
import random
import shlex
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, Optional

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

try:
    # its import prints an Adroit notice that would break the one-line error messages
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
except ImportError:  # only the mazes need gymnasium-robotics
    gymnasium_robotics = None

SCRIPT = "hype_irl_mujoco.py"
MAZE_VERSIONS = {"PointMaze_": ("v3",), "AntMaze_": ("v4", "v5")}  # ids mbirl_antmaze.py has data for
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
VIDEO_SIZE = 240  # rendered frame width and height
STATE_KEYS = ("qpos", "qvel", "qacc_warmstart")
# demos.npz, key: (dtype, shape) in N transitions, E episodes, the env's obs/act sizes and MuJoCo's nq/nv
DEMO_FORMAT = {
    "observations": (np.float32, ("N", "obs")),
    "actions": (np.float32, ("N", "act")),
    "next_observations": (np.float32, ("N", "obs")),
    "rewards": (np.float32, ("N",)),
    "terminals": (bool, ("N",)),
    "timeouts": (bool, ("N",)),
    "episode_ids": (np.int64, ("N",)),
    "episode_starts": (bool, ("N",)),
    "timesteps": (np.int64, ("N",)),
    "returns": (np.float64, ("E",)),
    "seeds": (np.int64, ("E",)),
    "qpos": (np.float64, ("N", "nq")),
    "qvel": (np.float64, ("N", "nv")),
    "qacc_warmstart": (np.float64, ("N", "nv")),
}
# The reference's piecewise-linear rho schedules ([start, end, until] segments, in learner env steps).
# HalfCheetah, not in the reference, gets the Ant/Walker2d one (our choice); others get Hopper's.
RHO_SCHEDULES = dict.fromkeys(("Hopper", "Humanoid"), "0.2,0.1,200000;0.1,0.01,1000000")
RHO_SCHEDULES.update(dict.fromkeys(("Ant", "Walker2d", "HalfCheetah"), "0.2,0.2,300000;0.2,0.1,1000000"))


Terminal = Optional[Literal["min", "none"]]


def ranged(default, interval: str):
    """A numeric setting and the interval it must lie in ("(" and ")" exclude the bound)."""
    return field(default=default, metadata={"range": interval})


@dataclass
class ExpertArgs:  # the comment after each field is its --help line
    experts_dir: str = "experts"  # cache of experts and demos: {experts_dir}/{env_id}/demos.npz (shared with FILTER)
    path: Optional[str] = None  # your own demos.npz (or minari:DATASET_ID, no MuJoCo states) instead of the cache
    timesteps: int = ranged(1_000_000, "[1, 1e9]")  # SAC expert training steps on the true reward (no cached demos)
    num_demos: Optional[int] = ranged(None, "[1, 1e5]")  # expert episodes to record (reset seeds 0, 1, ...; default 64)
    eval_every: int = ranged(10_000, "[0, 1e9]")  # demos by the best actor of evaluations this often (0: the last)
    eval_episodes: int = ranged(5, "[1, 1000]")  # deterministic episodes per expert evaluation (the reference: 5)
    target_return: Optional[float] = ranged(None, "[-1e9, 1e9]")  # stop once an evaluation's mean reaches it


@dataclass
class SACArgs:
    buffer_size: int = ranged(1_000_000, "[1, 1e9]")  # learner replay capacity
    gamma: float = ranged(0.99, "[0, 1)")  # discount factor, in [0, 1)
    tau: float = ranged(0.005, "(0, 1]")  # target network smoothing coefficient, in (0, 1]
    batch_size: int = ranged(256, "[1, 65536]")  # SAC minibatch size (expert + learner rows)
    learning_starts: int = ranged(5000, "[0, 1e9]")  # random-action steps before SAC updates (each phase; < budget)
    policy_lr: float = ranged(3e-4, "(0, 1]")  # actor learning rate
    q_lr: float = ranged(1e-3, "(0, 1]")  # critic (and entropy-temperature, as CleanRL) learning rate
    policy_frequency: int = ranged(2, "[1, 1000]")  # actor/temperature: this many updates every this many calls
    alpha: float = ranged(0.2, "(0, 100]")  # entropy temperature when --sac.no-autotune
    autotune: bool = True  # automatic entropy tuning toward -act_dim
    hidden_dim: int = ranged(256, "[1, 4096]")  # width of the two hidden layers of actor, critics and discriminator


@dataclass
class DiscArgs:
    lr: float = ranged(8e-4, "(0, 1]")  # discriminator lr0; outer iteration k uses lr0 / max(1, k) with a fresh Adam
    steps: int = ranged(1, "[1, 1e4]")  # discriminator gradient steps per outer iteration
    batch_size: int = ranged(4096, "[1, 1e6]")  # expert and learner (s, a) pairs per discriminator step
    trajectories: int = ranged(4, "[1, 1000]")  # fresh learner episodes per outer iteration (their steps are counted)
    gp_weight: float = ranged(10.0, "[0, 1e6]")  # gradient-penalty weight (0 = off)
    gp_target: float = ranged(0.4, "[0, 1000]")  # gradient-penalty target norm


@dataclass
class IRLArgs:
    total_timesteps: int = ranged(1_000_000, "[1, 1e9]")  # IRL budget in policy env steps (disc. steps counted apart)
    train_every: int = ranged(5000, "[1, 1e9]")  # learner env steps per outer iteration (one discriminator update)
    rho_schedule: Optional[str] = None  # expert fraction: 'start,end,until;...' in learner steps, a number, or per env
    reset_prob: float = ranged(0.0, "[0, 1]")  # probability an episode starts at an expert state: >0 is HyPE+FILTER
    p_tremble: float = ranged(0.01, "[0, 1]")  # probability of a uniform random action (training and evaluation)
    terminal_reward: Terminal = None  # min: absorbing, lowest batch reward; none: end (unset: mazes none, others min)


@dataclass
class EvalArgs:
    frequency: int = ranged(50_000, "[1, 1e9]")  # evaluate every this many policy env steps
    episodes: int = ranged(10, "[1, 1e5]")  # deterministic evaluation episodes (reset seeds seed + 10000, +1, ...)


@dataclass
class Args:
    exp_name: str = "hype_irl_mujoco"  # the name of this experiment
    seed: int = ranged(1, "[0, 2e9]")  # seed of the experiment
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled, CUDA is used when available (falls back to the CPU)
    track: bool = False  # if toggled, the run is tracked with Weights and Biases (needs wandb installed)
    wandb_project_name: str = "cleanRL"  # the wandb project name
    wandb_entity: Optional[str] = None  # the entity (team) of the wandb project
    capture_video: bool = False  # record an evaluation episode as VP9 WebM in {run_dir}/videos/ (also --eval-only)
    save_model: bool = True  # save the final learner policy to `{run_dir}/policy.pt` (needed by --eval-only)
    run_dir: Optional[str] = None  # default runs/{env_id}__{exp_name}__{seed}__{unix_time}; an existing one resumes
    env_id: str = "Hopper-v5"  # MuJoCo v5 env id (Hopper, Walker2d, Ant, ...), PointMaze_*-v3 or AntMaze_*-v4/v5
    max_episode_steps: Optional[int] = ranged(None, "[1, 1e6]")  # episode horizon (default: the env's, 1000 for MuJoCo)
    torch_threads: int = ranged(0, "[0, 1024]")  # CPU threads for torch (0 = torch's default; 1 on a shared CPU)
    log_frequency: int = ranged(1000, "[1, 1e9]")  # TensorBoard scalars (losses, SPS, rho) every this many env steps
    checkpoint_every: int = ranged(25_000, "[1, 1e9]")  # checkpoint every this many env steps (and on SIGINT)
    eval_only: Optional[str] = None  # evaluate {RUN_DIR}/policy.pt into {RUN_DIR}/evaluations/eval_NNN.json
    expert: ExpertArgs = field(default_factory=ExpertArgs)
    sac: SACArgs = field(default_factory=SACArgs)
    disc: DiscArgs = field(default_factory=DiscArgs)
    irl: IRLArgs = field(default_factory=IRLArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


@dataclass
class EnvInfo:  # what the phases need to know about the env, read once by validation
    obs_dim: int
    act_dim: int
    low: np.ndarray
    high: np.ndarray


# ---------------------------------------------------------------------- Environments
def is_maze(env_id: str) -> bool:
    return env_id.startswith(tuple(MAZE_VERSIONS))


class FlatMazeObs(gym.ObservationWrapper):
    """A maze's dict observation -> mbirl_antmaze.py's flat one, (x, y) first and the goal last:
    PointMaze [x, y, vx, vy, gx, gy] (6-D); AntMaze [x, y, qpos[2:15], qvel, gx, gy] (31-D)."""

    def __init__(self, env: gym.Env, prepend_xy: bool):
        super().__init__(env)
        self.prepend_xy = prepend_xy
        dim = env.observation_space["observation"].shape[0] + 2 + 2 * prepend_xy
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float64)

    def observation(self, obs: dict) -> np.ndarray:
        parts = [obs["achieved_goal"]] if self.prepend_xy else []
        return np.concatenate(parts + [obs["observation"], obs["desired_goal"]])


def make_gym_env(env_id: str, **kwargs) -> gym.Env:
    """gym.make (with its TimeLimit); a maze as mbirl_antmaze.py makes it: it ends at the goal
    (within 0.45), the goal stays put, AntMaze v5 has no contact forces, its temp XML is removed."""
    if not is_maze(env_id):
        return gym.make(env_id, disable_env_checker=True, **kwargs)
    kwargs.update(continuing_task=False, reset_target=False)
    if env_id.startswith("AntMaze_") and not env_id.endswith("-v4"):
        kwargs["include_cfrc_ext_in_observation"] = False
    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    xml = getattr(env.unwrapped, "tmp_xml_file_path", None)
    if xml and os.path.exists(xml):  # loaded already
        os.remove(xml)
    return env


def flat_obs(env_id: str, env: gym.Env) -> gym.Env:
    if not is_maze(env_id):
        return env
    return FlatMazeObs(env, prepend_xy=env_id.startswith("AntMaze_"))


def make_env(env_id: str, max_episode_steps=None, render: bool = False) -> tuple[gym.Env, int]:
    """The env WITHOUT gymnasium's TimeLimit, and its horizon: the loops count time, so an episode
    restored to expert time t runs exactly horizon - t more steps. Mazes: the flat observation."""
    size = {"render_mode": "rgb_array", "width": VIDEO_SIZE, "height": VIDEO_SIZE} if render else {}
    env = make_gym_env(env_id, **size)
    horizon = max_episode_steps or env.spec.max_episode_steps or 1000
    if isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return flat_obs(env_id, env), horizon


def simulator(env: gym.Env):
    """The MuJoCo env holding model and data: the maze's inner point/ant env, else the env."""
    u = env.unwrapped
    return getattr(u, "point_env", None) or getattr(u, "ant_env", None) or u


def restore_state(env: gym.Env, qpos, qvel, qacc_warmstart, goal=None) -> np.ndarray:
    """Exact restore: the expert's next states replay bit for bit (warm start included); on a
    maze the goal (and its target marker) too. Returns the recomputed observation, the recorded
    one except, on Ant/Humanoid, for the contact/actuator forces (gymnasium computes those from
    the last substep's solver state): the learner's reset uses the recorded one."""
    u, sim = env.unwrapped, simulator(env)
    if goal is not None:
        u.goal = np.array(goal, dtype=np.float64)
        if hasattr(u, "update_target_site_pos"):
            u.update_target_site_pos()
    sim.data.qpos[:], sim.data.qvel[:], sim.data.qacc_warmstart[:] = qpos, qvel, qacc_warmstart
    if sim.model.na:
        sim.data.act[:] = 0.0
    mujoco.mj_forward(sim.model, sim.data)
    if sim is u:
        return u._get_obs()
    inner = sim._get_obs()  # the point env's is (obs, info)
    return env.observation(u._get_obs(inner[0] if isinstance(inner, tuple) else inner))


def start_episode(env: gym.Env, seed: int, demos, reset_prob: float, rng) -> tuple[np.ndarray, int]:
    """Reset; with probability reset_prob restore a random expert state (and its goal on a maze): (obs, time index)."""
    obs, _ = env.reset(seed=seed)
    if reset_prob > 0 and rng.random() < reset_prob:
        i = int(rng.integers(len(demos["observations"])))
        goal = demos["goal"][i] if "goal" in demos else None
        restore_state(env, demos["qpos"][i], demos["qvel"][i], demos["qacc_warmstart"][i], goal)
        return demos["observations"][i].astype(np.float64), int(demos["timesteps"][i])
    return obs, 0


def episode_state(env: gym.Env, obs, ep_t: int, ep_return: float, from_expert: bool, seed: int) -> dict:
    """The learner's episode in progress, for a checkpoint (tensors: checkpoints load with weights_only)."""
    data, t = simulator(env).data, torch.as_tensor
    sim = dict(qpos=t(data.qpos.copy()), qvel=t(data.qvel.copy()), act=t(data.act.copy()), time=float(data.time))
    sim.update(qacc_warmstart=t(data.qacc_warmstart.copy()))
    goal = getattr(env.unwrapped, "goal", None)
    sim["goal"] = None if goal is None else t(np.array(goal, dtype=np.float64))
    return dict(sim=sim, obs=t(np.array(obs)), t=ep_t, ret=ep_return, from_expert=from_expert, seed=seed)


def resume_episode(env: gym.Env, saved: dict) -> tuple:
    """Continue a checkpointed episode exactly where it was: its reset (same seed, so the env's RNG is where it
    was), then the simulator state, the solver's warm-start and the maze goal. (obs, t, return, from_expert, seed)"""
    env.reset(seed=saved["seed"])
    sim, data = saved["sim"], simulator(env).data
    goal = None if sim["goal"] is None else sim["goal"].numpy()
    restore_state(env, sim["qpos"].numpy(), sim["qvel"].numpy(), sim["qacc_warmstart"].numpy(), goal)
    data.act[:], data.time = sim["act"].numpy(), sim["time"]
    mujoco.mj_forward(simulator(env).model, data)
    return saved["obs"].numpy(), saved["t"], saved["ret"], saved["from_expert"], saved["seed"]


def next_episode(env: gym.Env, progress: dict, seed: int, demos, reset_prob: float, rng) -> tuple:
    """The episode that comes next: on resume the checkpointed one, continued exactly; else a new
    one (reset seed `seed + episodes`, counted). Returns (obs, t, return, from_expert, seed)."""
    if progress.get("episode"):
        return resume_episode(env, progress.pop("episode"))
    obs, ep_t = start_episode(env, seed + progress["episodes"], demos, reset_prob, rng)
    progress["episodes"] += 1
    return obs, ep_t, 0.0, ep_t > 0, seed + progress["episodes"] - 1


# ---------------------------------------------------------------------- Networks
class Actor(nn.Module):
    """SAC actor: obs -> 256 -> 256 ReLU -> mean, log_std; tanh-squashed Gaussian (as CleanRL)."""

    def __init__(self, obs_dim: int, act_dim: int, low, high, hidden: int = 256):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(obs_dim, hidden), nn.Linear(hidden, hidden)
        self.fc_mean, self.fc_logstd = nn.Linear(hidden, act_dim), nn.Linear(hidden, act_dim)
        scale, bias = (high - low) / 2.0, (high + low) / 2.0
        self.register_buffer("action_scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor(bias, dtype=torch.float32))
        self.env_id, self.max_episode_steps = "", None  # set by load_policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc2(F.relu(self.fc1(obs))))
        log_std = torch.tanh(self.fc_logstd(h))
        return self.fc_mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action, its log-probability, deterministic action)."""
        mean, log_std = self(obs)
        std = log_std.exp()
        x = mean + std * torch.randn_like(mean)
        y = torch.tanh(x)
        log_prob = (-0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - torch.log(self.action_scale * (1 - y.pow(2)) + 1e-6).sum(-1)
        scale, bias = self.action_scale, self.action_bias
        return y * scale + bias, log_prob, torch.tanh(mean) * scale + bias

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """A batch of observations -> the batch of actions (numpy): deterministic, or sampled."""
        with torch.inference_mode():
            obs = torch.as_tensor(obs, dtype=torch.float32, device=self.action_scale.device)
            sample, _, mean = self.get_action(obs)
        return (mean if deterministic else sample).cpu().numpy()


class TwinQ(nn.Module):
    """Both Q-networks as stacked weights and batched matmuls: one kernel per layer for the
    pair (the CPU update is latency-bound on small batches)."""

    def __init__(self, in_dim: int, hidden: int = 256, n: int = 2):
        super().__init__()
        dims = [in_dim, hidden, hidden, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default init, per member
            self.weights.append(nn.Parameter(torch.empty(n, d_in, d_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, d_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """(B, obs), (B, act) -> (n, B)."""
        (w1, w2, w3), (b1, b2, b3) = self.weights, self.biases
        h = torch.cat([obs, act], -1).expand(w1.shape[0], -1, -1)
        h = F.relu(torch.baddbmm(b1, h, w1))
        h = F.relu(torch.baddbmm(b2, h, w2))
        # width-1 output as multiply-sum: the batched matmul's backward (an outer product) is slow
        # on CPU (with fused Adam: 17-23 % of the IRL phase's SPS, benchmarks/results/
        # readability_before_after.md)
        return (h * w3.transpose(1, 2)).sum(-1) + b3.squeeze(-1)


class Discriminator(nn.Module):
    """f(s, a): MLP 256-256 ReLU -> scalar cost, orthogonal weights (reference), default biases.
    Reward = -f."""

    def __init__(self, in_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, gain=1.0 if m.out_features == 1 else math.sqrt(2))

    def forward(self, sa: torch.Tensor) -> torch.Tensor:
        return self.net(sa).squeeze(-1)


# ---------------------------------------------------------------------- The math
def parse_rho_schedule(spec: str) -> list[tuple[float, float, int]]:
    """'0.2,0.1,200000;0.1,0.01,1000000' -> [(0.2, 0.1, 200000), (0.1, 0.01, 1000000)]; a single
    number is a constant rho."""
    spec, flag = spec.strip(), "--irl.rho-schedule"
    try:
        if ";" not in spec and "," not in spec:
            segments = [(float(spec), float(spec), 1)]
        else:
            parts = [part.split(",") for part in spec.split(";")]
            segments = [(float(a), float(b), int(float(until))) for a, b, until in parts]
    except ValueError:
        example = "e.g. '0.2,0.1,200000'"
        raise UsageError(f"{flag} {spec!r} is not 'start,end,until;...' or a number, {example}")
    ends = [0] + [until for _, _, until in segments]
    if not all(0.0 <= rho <= 1.0 for start, end, _ in segments for rho in (start, end)):
        raise UsageError(f"{flag} {spec!r}: every rho must lie in [0, 1]")
    if any(until <= previous for previous, until in zip(ends, ends[1:])):
        raise UsageError(f"{flag} {spec!r}: segment end steps must be positive and increasing")
    return segments


def rho_schedule(args: Args) -> str:
    """--irl.rho-schedule, or the reference's schedule for the env (Hopper's when it has none)."""
    default = RHO_SCHEDULES.get(args.env_id.split("-")[0], RHO_SCHEDULES["Hopper"])
    return args.irl.rho_schedule or default


def terminal_reward(args: Args) -> str:
    """min on MuJoCo (termination = a fall, the worst outcome); none on mazes, whose episodes
    end AT the goal."""
    return args.irl.terminal_reward or ("none" if is_maze(args.env_id) else "min")


def rho_at(step: int, segments: list[tuple[float, float, int]]) -> float:
    """Piecewise-linear: each segment runs from `start` at the previous `until` (0) to `end` at
    its own, then flat."""
    seg_start = 0
    for start, end, until in segments:
        if step <= until:
            return start + (end - start) * (step - seg_start) / (until - seg_start)
        seg_start = until
    return segments[-1][1]


def hybrid_indices(batch_size, rho, num_expert, num_learner, generator=None, device="cpu"):
    """Row indices of one minibatch in [expert rows 0..E-1 | learner rows E..E+L-1]: exactly
    round(rho * batch_size) expert rows, the rest learner rows, each uniform with replacement."""
    n_expert = int(round(rho * batch_size)) if num_expert > 0 else 0
    if num_learner == 0:
        n_expert = batch_size
    n_learner = batch_size - n_expert
    where = dict(generator=generator, device=device)
    expert = torch.randint(0, max(num_expert, 1), (n_expert,), **where)
    learner = torch.randint(0, max(num_learner, 1), (n_learner,), **where)
    return torch.cat([expert, num_expert + learner])


def relabel_rewards(disc: Discriminator, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """Reward of every sampled transition (expert and learner) under the CURRENT
    discriminator: r = -f(s, a)."""
    with torch.no_grad():
        return -disc(torch.cat([obs, act], -1))


def gradient_penalty(f, x_expert, x_learner, target: float = 0.4, alpha=None) -> torch.Tensor:
    """E[(||grad_x f(x_hat)||_2 - target)^2] at x_hat = alpha x_expert + (1 - alpha) x_learner,
    alpha ~ U(0, 1)."""
    if alpha is None:
        alpha = torch.rand(x_expert.shape[0], 1, device=x_expert.device)
    x_hat = (alpha * x_expert + (1 - alpha) * x_learner).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(x_hat).sum(), x_hat, create_graph=True)
    return ((grad.norm(2, dim=-1) - target) ** 2).mean()


def discriminator_loss(f, x_expert, x_learner, gp_weight: float = 10.0, gp_target: float = 0.4):
    """IPM loss E_expert[f] - E_learner[f] + gp_weight * GP (f is a cost). Returns (loss, ipm
    term, penalty)."""
    ipm = f(x_expert).mean() - f(x_learner).mean()
    gp = gradient_penalty(f, x_expert, x_learner, gp_target)
    return ipm + gp_weight * gp, ipm, gp


def disc_lr_at(outer_iteration: int, lr0: float) -> float:
    """Harmonic decay of the reference: lr0 at k = 0 and k = 1, lr0 / k after."""
    return lr0 / max(1, outer_iteration)


def soft_q_target(reward, done, next_q, next_logp, alpha, gamma: float, absorbing_reward=None):
    """r + gamma * (1 - d) * (min Q'(s', a') - alpha * log pi(a'|s')). With `absorbing_reward`,
    a terminal transition instead enters an absorbing state earning that reward forever:
    + gamma * d * r_abs / (1 - gamma)."""
    target = reward + gamma * (1.0 - done) * (next_q - alpha * next_logp)
    if absorbing_reward is not None:
        target = target + gamma * done * absorbing_reward / (1.0 - gamma)
    return target


def tremble(action: np.ndarray, rng, p: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Trembling hand: with probability p the whole action is replaced by a uniform random one."""
    if p > 0 and rng.random() < p:
        return rng.uniform(low, high).astype(np.float32)
    return action


# ---------------------------------------------------------------------- SAC and replay
class SAC:
    """Actor, batched twin Q, target twin Q, automatic entropy tuning. `update` takes the rewards
    explicitly: in the IRL phase always the discriminator's relabelled ones, never stored ones."""

    PARTS = ("actor", "qf", "qf_target", "q_optimizer", "actor_optimizer", "a_optimizer")

    def __init__(self, info: EnvInfo, cfg: SACArgs, device: torch.device):
        self.cfg = cfg
        self.actor = Actor(info.obs_dim, info.act_dim, info.low, info.high, cfg.hidden_dim)
        self.actor.to(device)
        self.qf = TwinQ(info.obs_dim + info.act_dim, cfg.hidden_dim).to(device)
        self.qf_target = TwinQ(info.obs_dim + info.act_dim, cfg.hidden_dim).to(device)
        self.qf_target.load_state_dict(self.qf.state_dict())
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=cfg.q_lr, fused=True)
        actor_params = self.actor.parameters()
        self.actor_optimizer = torch.optim.Adam(actor_params, lr=cfg.policy_lr, fused=True)
        self.target_entropy = -float(info.act_dim)
        self.log_alpha = torch.tensor([math.log(cfg.alpha)], device=device, requires_grad=True)
        # CleanRL uses q_lr for the temperature too
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.q_lr, fused=True)
        self.num_updates = 0

    def update(self, obs, act, next_obs, done, reward, absorbing: bool = False) -> dict:
        """One critic step, actor/temperature steps every `policy_frequency` calls, one target
        lerp (no host sync)."""
        cfg = self.cfg
        if cfg.autotune:
            alpha = self.log_alpha.detach().exp()
        else:
            alpha = torch.full_like(self.log_alpha, cfg.alpha)
        with torch.no_grad():
            next_act, next_logp, _ = self.actor.get_action(next_obs)
            next_q = self.qf_target(next_obs, next_act).min(0).values
            r_absorbing = reward.min() if absorbing else None
            target = soft_q_target(reward, done, next_q, next_logp, alpha, cfg.gamma, r_absorbing)
        q = self.qf(obs, act)
        qf_loss = ((q - target) ** 2).mean(-1).sum()  # qf1_loss + qf2_loss, as CleanRL
        self.q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.q_optimizer.step()
        out = {"qf_loss": qf_loss.detach(), "qf1_values": q[0].detach().mean()}
        out.update(qf2_values=q[1].detach().mean(), relabelled_reward=reward.mean())
        self.num_updates += 1
        if self.num_updates % cfg.policy_frequency == 0:
            self.qf.requires_grad_(False)  # the actor's loss needs gradients w.r.t. actions only
            for _ in range(cfg.policy_frequency):  # same batch each time, as CleanRL
                pi, logp, _ = self.actor.get_action(obs)
                actor_loss = (alpha * logp - self.qf(obs, pi).min(0).values).mean()
                self.actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
                self.actor_optimizer.step()
                out["actor_loss"] = actor_loss.detach()
                if cfg.autotune:
                    entropy_gap = logp.detach() + self.target_entropy
                    alpha_loss = (-self.log_alpha.exp() * entropy_gap).mean()
                    self.a_optimizer.zero_grad(set_to_none=True)
                    alpha_loss.backward()
                    self.a_optimizer.step()
                    alpha = self.log_alpha.detach().exp()
                    out["alpha_loss"] = alpha_loss.detach()
            self.qf.requires_grad_(True)
        with torch.no_grad():
            for target_param, param in zip(self.qf_target.parameters(), self.qf.parameters()):
                target_param.lerp_(param, cfg.tau)
        out["alpha"] = alpha.squeeze()
        return out

    def state_dict(self) -> dict:
        state = {part: getattr(self, part).state_dict() for part in self.PARTS}
        log_alpha = self.log_alpha.detach().clone()
        return {**state, "log_alpha": log_alpha, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        for part in self.PARTS:
            getattr(self, part).load_state_dict(state[part])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.num_updates = state["num_updates"]


class Storage:
    """Combined replay on the device: rows [0, E) hold expert transitions, rows [E, E + capacity)
    a ring of learner transitions. A row is [obs | act | next_obs | done | reward] so a minibatch
    is ONE gather. In the IRL phase the reward column is NaN in every row (the env reward is
    hidden, expert rewards are not loaded): a learning step that read it would turn the losses
    into NaN and stop the run, which makes 'env reward never used' checkable."""

    def __init__(self, obs_dim: int, act_dim: int, capacity: int, device, expert_rows=None):
        self.obs_dim, self.act_dim, self.capacity = obs_dim, act_dim, capacity
        self.num_expert = 0 if expert_rows is None else expert_rows.shape[0]
        width = 2 * obs_dim + act_dim + 2
        self.data = torch.zeros(self.num_expert + capacity, width, device=device)
        if expert_rows is not None:
            self.data[: self.num_expert] = expert_rows
        self.ptr, self.size = 0, 0

    @staticmethod
    def rows(obs, act, next_obs, done, reward) -> np.ndarray:
        columns = [obs, act, next_obs, np.atleast_1d(done), np.atleast_1d(reward)]
        return np.concatenate(columns, -1, dtype=np.float32)

    def add(self, row: np.ndarray) -> None:
        self.data[self.num_expert + self.ptr] = torch.from_numpy(row)
        self.ptr = (self.ptr + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rho: float, generator: Optional[torch.Generator] = None):
        """(obs, act, next_obs, done, reward) of one hybrid minibatch."""
        device = self.data.device
        idx = hybrid_indices(batch_size, rho, self.num_expert, self.size, generator, device)
        batch, o, a = self.data[idx], self.obs_dim, self.act_dim
        obs, act, next_obs = batch[:, :o], batch[:, o : o + a], batch[:, o + a : 2 * o + a]
        return obs, act, next_obs, batch[:, -2], batch[:, -1]

    def learner_rows(self) -> torch.Tensor:
        """The filled learner rows, oldest first (for checkpoints)."""
        rows = self.data[self.num_expert : self.num_expert + self.size]
        return torch.roll(rows, -self.ptr, 0) if self.size == self.capacity else rows

    def load_learner_rows(self, rows: torch.Tensor) -> None:
        n = min(rows.shape[0], self.capacity)
        self.data[self.num_expert : self.num_expert + n] = rows[-n:].to(self.data.device)
        self.size, self.ptr = n, n % self.capacity


# ---------------------------------------------------------------------- Run and logging
@dataclass
class Run:
    """Where a phase writes: the run dir, TensorBoard and the device. SIGINT/SIGTERM set STOP;
    the loops then save a checkpoint and stop within the step."""

    dir: Path
    writer: object  # torch.utils.tensorboard.SummaryWriter
    device: torch.device


class Stop(Exception):
    """Every early end of a command: main prints the one-line message and exits with `code`."""

    code, prefix = 1, "error: "


class UsageError(Stop):  # bad input, found before any work starts
    code = 2


class NonFiniteLoss(Stop):  # a loss became NaN or infinite (the last checkpoint is kept)
    code = 3


class Interrupted(Stop):  # SIGINT/SIGTERM, after the phase saved its checkpoint; args (phase, step)
    code, prefix = 130, ""

    def __str__(self) -> str:
        phase, step = self.args
        if phase == EVAL_ONLY:  # its evaluation file is written whole or not at all
            return "interrupted during --eval-only: no evaluation written; the same command starts it again"
        where = f"in the {phase} at step {step}" if phase else "while recording the final video"
        return f"interrupted {where}: checkpoint saved"


EVAL_ONLY = "--eval-only"  # Interrupted's phase when an --eval-only command is stopped


STOP = threading.Event()  # set by SIGINT/SIGTERM: the loops save a checkpoint, raise Interrupted


def check_stop() -> None:
    """Inside a step (a rollout, a discriminator update, an evaluation): a signal stops it at once. The phase's
    saved_on_stop saves the checkpoint of the last whole step and names the phase."""
    if STOP.is_set():
        raise Interrupted(None, None)


@contextlib.contextmanager
def saved_on_stop(phase: str, progress: dict, checkpoint=None):
    """A signal noticed inside a step: the phase's checkpoint (the state after the last whole step), then
    Interrupted(phase, step)."""
    try:
        yield
    except Interrupted as e:
        if e.args[0] is not None:
            raise
        if checkpoint is not None:
            checkpoint()
        raise Interrupted(phase, progress["step"]) from None


class SPSMeter:
    """Steps per second after warm-up (from the first update on), evaluation time excluded."""

    def __init__(self):
        self.t0, self.s0, self.paused = None, 0, 0.0

    def start(self, step: int) -> None:
        if self.t0 is None:
            self.t0, self.s0 = time.perf_counter(), step

    def pause_while(self, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.paused += time.perf_counter() - t
        return out

    def sps(self, step: int) -> Optional[float]:
        if self.t0 is not None and step > self.s0:
            return (step - self.s0) / max(1e-9, time.perf_counter() - self.t0 - self.paused)


PROGRESS_EVERY_S = 30.0  # stderr not a terminal (a log file): a plain progress line this often, no tqdm bars


class LogLines:
    """Progress where stderr is not a terminal: one plain line every PROGRESS_EVERY_S seconds and one at the end,
    never tqdm's carriage-return bars (they flood a redirected log). The part of tqdm's interface the loops use."""

    def __init__(self, total: int, initial: int = 0, desc: str = ""):
        self.total, self.n, self.desc, self.postfix = total, initial, desc, ""
        self.t0 = self.last = time.monotonic()
        self.n0 = initial

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.show()

    def show(self) -> None:
        self.last = time.monotonic()
        rate = (self.n - self.n0) / max(self.last - self.t0, 1e-9)
        done = f"{self.n}/{self.total} ({100 * self.n / max(self.total, 1):.0f} %, {rate:.0f} steps/s)"
        print(f"{self.desc}: {done}{self.postfix}", file=sys.stderr, flush=True)

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self.postfix = "".join(f", {k} {v}" for k, v in values.items())

    def write(self, text: str) -> None:
        print(text, flush=True)

    def close(self) -> None:
        if self.n != self.n0:
            self.show()
            self.n0 = self.n

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int, initial: int, desc: str):
    """tqdm's bar on a terminal; a plain line every PROGRESS_EVERY_S seconds otherwise (a log file)."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        return LogLines(total, initial, desc)

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, mininterval=2)


def check_finite(losses: dict, phase: str, step: int) -> dict[str, float]:
    """The losses as floats; a NaN or infinite one stops the run (NonFiniteLoss, exit 3)."""
    values = {k: float(v.detach()) for k, v in losses.items()}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        fix = "lower the learning rates or check the expert data (last checkpoint kept)"
        raise NonFiniteLoss(f"{phase}: non-finite {', '.join(bad)} at step {step}; {fix}")
    return values


def log_losses(writer, phase: str, losses: dict, args: Args, step, meter, rho=None, disc_steps=0):
    """The expert phase's scalars under expert/, the learner's under CleanRL's tags (losses/,
    charts/) and irl/."""
    expert = phase == "expert"
    values = check_finite(losses, "expert SAC" if expert else "IRL learner", step)
    group = "expert" if expert else "charts"
    scalars = {f"{group}/learning_rate": args.sac.q_lr, f"{group}/SPS": meter.sps(step)}
    for name, value in values.items():
        if expert:
            scalars["expert/" + name] = value
        else:
            scalars[("irl/" if name == "relabelled_reward" else "losses/") + name] = value
    if not expert:
        scalars.update({"irl/rho": rho, "irl/total_env_steps": step + disc_steps})
    for tag, value in scalars.items():
        if value is not None:
            writer.add_scalar(tag, value, step)


def log_episode(writer, prefix: str, from_expert: bool, ret: float, length: int, step: int, bar):
    """Episodes started from an expert state have partial returns: logged apart."""
    if from_expert:
        writer.add_scalar("irl/reset_episodic_return", ret, step)
        return
    writer.add_scalar(f"{prefix}/episodic_return", ret, step)
    writer.add_scalar(f"{prefix}/episodic_length", length, step)
    bar.set_postfix(ret=f"{ret:.0f}", refresh=False)


# ---------------------------------------------------------------------- Phases
def evaluate(actor, env_id, episodes, seed, p_tremble, max_episode_steps=None, video=None):
    """True returns of deterministic actions, trembling as in training (reference); `video`: the
    first episode's. Returns (returns, successes): on a maze whether each episode reached its
    goal (within 0.45), else None."""
    rng, returns, successes, frames = np.random.default_rng(seed), [], [], []
    for ep in range(episodes):
        env, horizon = make_env(env_id, max_episode_steps, render=video is not None and ep == 0)
        low, high = env.action_space.low, env.action_space.high
        obs, _ = env.reset(seed=seed + ep)
        ret, success = 0.0, False
        for _ in range(horizon):
            check_stop()
            action = tremble(actor.act(obs[None])[0], rng, p_tremble, low, high)
            obs, reward, terminated, _, info = env.step(action)
            ret, success = ret + float(reward), success or bool(info.get("success", False))
            if env.render_mode:
                frames.append(env.render())
            if terminated:
                break
        returns.append(ret)
        successes.append(success or terminated)  # a maze terminates only at its goal
        env.close()
    if video is not None:
        write_video(video, frames, fps=env.metadata.get("render_fps", 30))
    return returns, (successes if is_maze(env_id) else None)


def explore(sac: SAC, obs, learn_started: bool, info: EnvInfo, p_tremble: float, rng) -> np.ndarray:
    """The behaviour action: uniform random until learning starts, then a sample of the policy;
    with probability p_tremble a uniform random one instead (trembling hand)."""
    if learn_started:
        action = sac.actor.act(obs[None], False)[0]
    else:
        action = rng.uniform(info.low, info.high)
    return tremble(action.astype(np.float32), rng, p_tremble, info.low, info.high)


def train_expert(args: Args, info: EnvInfo, run: Run, ckpt: Optional[dict]) -> tuple[SAC, list, Optional[list], int]:
    """Expert phase: SAC on the TRUE env reward for `expert.timesteps`, resumable from
    checkpoints/expert.pt. Every `expert.eval_every` steps the actor plays `expert.eval_episodes`
    deterministic episodes (the same reset seeds each time) and the best one is kept, as the
    reference records its demos with SB3's EvalCallback best_model; once the best reaches
    `expert.target_return` (if set) training stops there. Returns the expert (its actor the best
    evaluated one), its learning curve [(step, return)], [best mean, its step] and the steps trained."""
    env, horizon = make_env(args.env_id, args.max_episode_steps)
    sac = SAC(info, args.sac, run.device)
    capacity = min(args.sac.buffer_size, args.expert.timesteps)
    storage = Storage(info.obs_dim, info.act_dim, capacity, run.device)
    np_rng = np.random.default_rng(args.seed)
    every, target = args.expert.eval_every, args.expert.target_return
    progress = {"step": 0, "episodes": 0, "curve": [], "evaluated": 0, "best": None}  # best: [mean, step]
    best_actor = None  # the weights of the best evaluated actor
    if ckpt:
        progress = restore_checkpoint(ckpt, "expert", sac, storage, np_rng)
        best_actor = ckpt["best_actor"]
    ckpt_path, meter, losses = run.dir / "checkpoints" / "expert.pt", SPSMeter(), {}
    obs, ep_t, ep_return, _, ep_seed = next_episode(env, progress, args.seed, None, 0.0, np_rng)

    def checkpoint() -> None:  # everything, every RNG, and the episode in progress
        episode = episode_state(env, obs, ep_t, ep_return, False, ep_seed)
        save_checkpoint(ckpt_path, sac, storage, np_rng, progress, episode=episode, best_actor=best_actor)

    def evaluate_expert() -> None:  # at a multiple of `every` not evaluated yet (a stop inside: again on resume)
        step = progress["step"]
        if not (every and step % every == 0 and progress["evaluated"] < step):
            return
        episodes, seed = args.expert.eval_episodes, args.seed + 50_000  # the same reset seeds every time
        returns, _ = meter.pause_while(evaluate, sac.actor, args.env_id, episodes, seed, 0.0, args.max_episode_steps)
        mean = float(np.mean(returns))
        run.writer.add_scalar("expert/eval_return", mean, step)
        if progress["best"] is None or mean > progress["best"][0]:
            nonlocal best_actor
            progress["best"] = [mean, step]
            best_actor = {k: v.detach().cpu().clone() for k, v in sac.actor.state_dict().items()}
        progress["evaluated"] = step

    stop = saved_on_stop("expert phase", progress, checkpoint)
    with progress_bar(args.expert.timesteps, progress["step"], "expert") as bar, stop:
        while progress["step"] < args.expert.timesteps:
            if STOP.is_set():
                checkpoint()
                raise Interrupted("expert phase", progress["step"])
            evaluate_expert()
            if target is not None and progress["best"] is not None and progress["best"][0] >= target:
                break  # good enough: its demos now, not after the remaining steps
            learn_started = progress["step"] >= args.sac.learning_starts
            action = explore(sac, obs, learn_started, info, args.irl.p_tremble, np_rng)
            next_obs, reward, terminated, _, _ = env.step(action)
            storage.add(Storage.rows(obs, action, next_obs, float(terminated), float(reward)))
            obs, ep_t, ep_return = next_obs, ep_t + 1, ep_return + float(reward)
            step = progress["step"] = progress["step"] + 1
            if terminated or ep_t >= horizon:
                log_episode(run.writer, "expert", False, ep_return, ep_t, step, bar)
                progress["curve"].append((step, ep_return))
                episode = next_episode(env, progress, args.seed, None, 0.0, np_rng)
                obs, ep_t, ep_return, _, ep_seed = episode
            if learn_started:
                meter.start(step - 1)
                b_obs, b_act, b_next, b_done, b_rew = storage.sample(args.sac.batch_size, 0.0)
                losses = sac.update(b_obs, b_act, b_next, b_done, b_rew)
            if step % args.log_frequency == 0 and losses:
                log_losses(run.writer, "expert", losses, args, step, meter)
            if step % args.checkpoint_every == 0:
                checkpoint()
                curve = progress["curve"]
                plot_curves(run.dir / "learning_curve.png", args, [], float("nan"), curve)
            bar.update(1)
        evaluate_expert()  # the last step's
    checkpoint()
    env.close()
    if progress["best"] is not None:
        sac.actor.load_state_dict(best_actor)
    return sac, progress["curve"], progress["best"], progress["step"]


def collect_demos(env_id: str, policy, num_demos: int, max_episode_steps=None) -> dict:
    """Complete episodes of `policy(obs) -> action` (reset seeds 0, 1, ...) as demos.npz, MuJoCo
    states included."""
    env, horizon = make_env(env_id, max_episode_steps)
    keys = ("observations", "actions", "next_observations", "rewards", "terminals", "timeouts")
    keys += ("episode_ids", "episode_starts", "timesteps") + STATE_KEYS
    buf, returns, data = {k: [] for k in keys}, [], env.unwrapped.data
    low, high = env.action_space.low, env.action_space.high
    for ep in range(num_demos):
        obs, _ = env.reset(seed=ep)
        ret = 0.0
        for t in range(horizon):
            check_stop()
            # the MuJoCo state before the step
            state = (data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy())
            action = np.clip(np.asarray(policy(obs), dtype=np.float32), low, high)
            next_obs, reward, terminated, _, _ = env.step(action)
            timeout = t + 1 >= horizon
            values = (obs, action, next_obs, reward, terminated, timeout, ep, t == 0, t, *state)
            for k, v in zip(buf, values):
                buf[k].append(v)
            ret, obs = ret + float(reward), next_obs
            if terminated:
                break
        returns.append(ret)
    env.close()
    demos = {k: np.asarray(buf[k], dtype=DEMO_FORMAT[k][0]) for k in buf}
    demos["returns"] = np.asarray(returns, np.float64)
    demos["seeds"] = np.arange(num_demos, dtype=np.int64)
    demos["env_id"] = np.array(env_id)
    return demos


def collect_disc_pairs(actor: Actor, env: gym.Env, horizon: int, args: Args, rng, progress):
    """(s, a) pairs of `disc.trajectories` fresh episodes of the current policy from the env's
    own start states; their steps are counted in progress["disc_env_steps"]."""
    pairs, low, high = [], env.action_space.low, env.action_space.high
    counters = {k: progress[k] for k in ("episodes", "disc_env_steps")}  # kept on a signal: the checkpoint's
    for _ in range(args.disc.trajectories):
        obs, t = start_episode(env, args.seed + progress["episodes"], None, 0.0, rng)
        progress["episodes"] += 1
        while t < horizon:
            if STOP.is_set():
                progress.update(counters)
                check_stop()
            action = tremble(actor.act(obs[None], False)[0], rng, args.irl.p_tremble, low, high)
            pairs.append(np.concatenate([obs, action]).astype(np.float32))
            obs, _, terminated, _, _ = env.step(action)
            t, progress["disc_env_steps"] = t + 1, progress["disc_env_steps"] + 1
            if terminated:
                break
    return torch.from_numpy(np.stack(pairs))


def update_discriminator(disc: Discriminator, expert_sa, learner_sa, k: int, cfg: DiscArgs) -> dict:
    """Outer iteration k: `steps` steps of a FRESH Adam at lr0 / max(1, k), each on batch_size
    expert and batch_size learner pairs. Returns the last step's statistics."""
    lr, device = disc_lr_at(k, cfg.lr), expert_sa.device
    optimizer = torch.optim.Adam(disc.parameters(), lr=lr)
    before = {k: v.clone() for k, v in disc.state_dict().items()}
    for _ in range(cfg.steps):
        if STOP.is_set():  # the checkpoint keeps the discriminator of the last whole outer iteration
            disc.load_state_dict(before)
            check_stop()
        x_e = expert_sa[torch.randint(0, len(expert_sa), (cfg.batch_size,), device=device)]
        x_l = learner_sa[torch.randint(0, len(learner_sa), (cfg.batch_size,), device=device)]
        loss, ipm, gp = discriminator_loss(disc, x_e, x_l, cfg.gp_weight, cfg.gp_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        stats = dict(disc_loss=loss, ipm=ipm, gradient_penalty=gp)
        stats.update(reward_expert=-disc(x_e).mean(), reward_learner=-disc(x_l).mean())
    return {**check_finite(stats, "discriminator", k), "disc_lr": lr}


def evaluate_learner(sac: SAC, args: Args, run: Run, progress, expert_return, expert_curve, np_rng, bar=None):
    """Evaluate, append to the history, log, redraw the learning curve and (given the progress
    bar) print the result. A signal inside undoes it whole (the policy samples: torch's RNG moves)."""
    with undone_on_stop(progress, np_rng):
        seed, step, p_tremble = args.seed + 10_000, progress["step"], args.irl.p_tremble
        horizon = args.max_episode_steps
        returns, successes = evaluate(sac.actor, args.env_id, args.eval.episodes, seed, p_tremble, horizon)
        mean, total = float(np.mean(returns)), step + progress["disc_env_steps"]
        success_rate = float(np.mean(successes)) if successes is not None else None
        record = dict(step=step, total_env_steps=total, mean=mean, std=float(np.std(returns)))
        progress["history"].append(dict(record, returns=returns, success_rate=success_rate))
        run.writer.add_scalar("eval/episodic_return", mean, step)
        if success_rate is not None:
            run.writer.add_scalar("eval/success_rate", success_rate, step)
        if math.isfinite(expert_return) and expert_return != 0:
            run.writer.add_scalar("eval/normalized_return", mean / expert_return, step)
        plot_curves(run.dir / "learning_curve.png", args, progress["history"], expert_return, expert_curve)
        if bar is not None:
            reached = f", success rate {success_rate:.2f}" if success_rate is not None else ""
            expert = f"(expert {expert_return:.1f})"
            bar.write(f"[irl] step {step}: eval return {mean:.1f} {expert}{reached}")


def expert_storage(demos: dict, info: EnvInfo, capacity: int, device) -> Storage:
    """The replay with the expert transitions in front: their reward column NaN (demo rewards
    never enter learning), done = the dataset's terminals only."""
    done = demos["terminals"].astype(np.float32)[:, None]
    rewards = np.full(done.shape, np.nan)
    obs, act, next_obs = demos["observations"], demos["actions"], demos["next_observations"]
    rows = torch.from_numpy(Storage.rows(obs, act, next_obs, done, rewards))
    return Storage(info.obs_dim, info.act_dim, capacity, device, rows)


def run_outer_iteration(sac, disc, disc_env, horizon, expert_sa, args, np_rng, progress, writer, step):
    """Fresh learner episodes, then the discriminator's steps on them (logged under irl/*). A signal
    inside undoes it whole: it is redone on resume."""
    with undone_on_stop(progress, np_rng, disc):
        k = progress["k"]
        pairs = collect_disc_pairs(sac.actor, disc_env, horizon, args, np_rng, progress)
        stats = update_discriminator(disc, expert_sa, pairs.to(expert_sa.device), k, args.disc)
        stats.update(outer_iteration=k, disc_env_steps=progress["disc_env_steps"])
        for name, value in stats.items():
            writer.add_scalar(f"irl/{name}", value, step)
        progress["k"] += 1


def hybrid_update(sac: SAC, storage: Storage, disc, step: int, segments, absorbing: bool):
    """One SAC update on a hybrid minibatch: round(rho * batch) expert rows and the rest learner
    rows, every reward relabelled as -f(s, a) with the current f. Returns (losses, rho)."""
    rho = rho_at(step, segments)
    b_obs, b_act, b_next, b_done, _ = storage.sample(sac.cfg.batch_size, rho)
    b_rew = relabel_rewards(disc, b_obs, b_act)
    return sac.update(b_obs, b_act, b_next, b_done, b_rew, absorbing), rho


def train_hype(args: Args, info: EnvInfo, demos: dict, expert_curve, run: Run, ckpt) -> tuple:
    """IRL phase (HyPE), resumable from checkpoints/irl.pt; returns (learner, progress). Each
    policy step: (1) every `irl.train_every` steps, an outer iteration: fresh learner episodes
    and discriminator steps; (2) act, store the transition with a NaN reward; (3) at an episode's
    end, maybe start the next at an expert state; (4) one SAC update on round(rho * batch) expert
    and the rest learner rows, all rewards relabelled as -f(s, a) with the current f."""
    env, horizon = make_env(args.env_id, args.max_episode_steps)
    disc_env, _ = make_env(args.env_id, args.max_episode_steps)
    sac = SAC(info, args.sac, run.device)
    capacity = min(args.sac.buffer_size, args.irl.total_timesteps)
    storage = expert_storage(demos, info, capacity, run.device)
    expert_sa = storage.data[: storage.num_expert, : info.obs_dim + info.act_dim]  # (s, a) pairs
    expert_return = float(np.mean(demos["returns"]))
    disc = Discriminator(info.obs_dim + info.act_dim, args.sac.hidden_dim).to(run.device)
    segments, absorbing = parse_rho_schedule(rho_schedule(args)), terminal_reward(args) == "min"
    np_rng = np.random.default_rng(args.seed + 1000)
    fresh = dict(step=0, disc_env_steps=0, k=0, episodes=0, history=[])
    progress = restore_checkpoint(ckpt, "irl", sac, storage, np_rng, disc) if ckpt else fresh
    progress["resumed_from_step"] = progress["step"]
    ckpt_path, meter, reset_prob = run.dir / "checkpoints" / "irl.pt", SPSMeter(), args.irl.reset_prob
    episode = next_episode(env, progress, args.seed, demos, reset_prob, np_rng)
    obs, ep_t, ep_return, from_expert, ep_seed = episode
    losses, rho = {}, 0.0
    next_eval = (progress["step"] // args.eval.frequency + 1) * args.eval.frequency

    def checkpoint() -> None:  # everything, every RNG, and the episode in progress
        episode = episode_state(env, obs, ep_t, ep_return, from_expert, ep_seed)
        save_checkpoint(ckpt_path, sac, storage, np_rng, progress, disc, episode)

    stop = partial(saved_on_stop, "IRL phase", progress, checkpoint)
    evaluation = (sac, args, run, progress, expert_return, expert_curve, np_rng)
    outer = (disc_env, horizon, expert_sa, args, np_rng, progress, run.writer)
    with progress_bar(args.irl.total_timesteps, progress["step"], "irl") as bar, stop():
        step = progress["step"]
        if step % args.eval.frequency == 0 and 0 < step != (progress["history"] or [{}])[-1].get("step"):
            meter.pause_while(evaluate_learner, *evaluation, bar)  # a signal stopped it: it comes first
        while progress["step"] < args.irl.total_timesteps:
            step = progress["step"]
            if STOP.is_set():
                checkpoint()
                raise Interrupted("IRL phase", step)
            # 1. an outer iteration starts: fresh learner episodes, then the discriminator's steps
            if step % args.irl.train_every == 0 and progress["k"] <= step // args.irl.train_every:
                run_outer_iteration(sac, disc, *outer, step)
            # 2. act; the env reward is NOT stored (NaN in its column): rewards come from f only
            learn_started = step >= args.sac.learning_starts
            action = explore(sac, obs, learn_started, info, args.irl.p_tremble, np_rng)
            next_obs, env_reward, terminated, _, _ = env.step(action)
            storage.add(Storage.rows(obs, action, next_obs, float(terminated), float("nan")))
            obs, ep_t, ep_return = next_obs, ep_t + 1, ep_return + float(env_reward)  # (for logs)
            step = progress["step"] = step + 1
            # 3. the episode ends: the next one may start at an expert state
            if terminated or ep_t >= horizon:
                log_episode(run.writer, "charts", from_expert, ep_return, ep_t, step, bar)
                episode = next_episode(env, progress, args.seed, demos, reset_prob, np_rng)
                obs, ep_t, ep_return, from_expert, ep_seed = episode
            # 4. one SAC update on a hybrid minibatch, relabelled with the current f
            if learn_started:
                meter.start(step - 1)
                losses, rho = hybrid_update(sac, storage, disc, step, segments, absorbing)
            if step % args.log_frequency == 0 and losses:
                disc_steps = progress["disc_env_steps"]
                log_losses(run.writer, "irl", losses, args, step, meter, rho, disc_steps)
            if step >= next_eval:
                next_eval += args.eval.frequency
                meter.pause_while(evaluate_learner, *evaluation, bar)
            if step % args.checkpoint_every == 0:
                checkpoint()
            bar.update(1)
    if losses:
        check_finite({"qf_loss": losses["qf_loss"]}, "IRL learner", progress["step"])
    if not progress["history"] or progress["history"][-1]["step"] != progress["step"]:
        with stop():
            evaluate_learner(*evaluation)
    progress.update(SPS=meter.sps(progress["step"]), final_rho=rho)
    plot_curves(run.dir / "learning_curve.png", args, progress["history"], expert_return, expert_curve)
    checkpoint()
    env.close()
    disc_env.close()
    return sac, progress


def save_policy(path: Path, actor: Actor, args: Args, info: EnvInfo) -> None:
    """policy.pt of docs/CONTRACT.md: the actor's weights and what load_policy needs to rebuild
    it and its env."""
    config = dict(obs_dim=info.obs_dim, act_dim=info.act_dim, hidden=args.sac.hidden_dim)
    config.update(low=info.low.tolist(), high=info.high.tolist())
    state = {k: v.cpu() for k, v in actor.state_dict().items()}
    saved = dict(script=SCRIPT, env_id=args.env_id, network="Actor", config=config, state_dict=state)
    save(path, "policy", **saved, max_episode_steps=args.max_episode_steps)


def pipeline(args: Args, info: EnvInfo, demos: Optional[dict], checkpoints: dict, run: Run) -> dict:
    """The whole algorithm: the expert phase and its demos (unless demos were given or cached),
    HyPE, then policy.pt and results.json (returned)."""
    start, expert_curve = time.time(), []
    if demos is None:
        expert, expert_curve, best, steps = train_expert(args, info, run, checkpoints.get("expert"))
        num_demos = args.expert.num_demos or 64
        with saved_on_stop("expert demo collection", {"step": 0}):  # (the expert's checkpoint is saved)
            demos = collect_demos(args.env_id, expert.actor.act, num_demos, args.max_episode_steps)
        demos = write_expert_cache(args, expert, demos, best, steps)
    sac, progress = train_hype(args, info, demos, expert_curve, run, checkpoints.get("irl"))
    results = irl_results(args, demos, progress, time.time() - start, run.device)
    if args.save_model:
        save_policy(run.dir / "policy.pt", sac.actor, args, info)
    if args.capture_video:
        video, seed = run.dir / "videos" / "final.webm", args.seed + 10_000
        evaluate(sac.actor, args.env_id, 1, seed, args.irl.p_tremble, args.max_episode_steps, video)
    save(run.dir / "results.json", "results", **results)
    mean, std, expert_return = results["eval_mean"], results["eval_std"], results["expert_return"]
    rate = results["success_rate"]
    success = f", success rate {rate:.2f}" if rate is not None else ""
    print(f"[irl] final return {mean:.1f} +- {std:.1f} (expert {expert_return:.1f}){success}")
    return results


# ---- run management ----
# Everything below is plumbing a reader of the algorithm can skip: the command line and its
# validation, exit codes, checkpoints, plots, video and the expert-data cache.
MINARI_PREFIX = "minari:"
OPTIONAL_DEMO_KEYS = ("timesteps", "seeds") + STATE_KEYS
MAZE_DEMO_FORMAT = {**DEMO_FORMAT, "goal": (np.float64, ("N", 2))}  # each step's goal (mbirl's data)
MAZE_DEMO_KEYS = ("qpos", "qvel", "goal")  # required on mazes


def main(argv: Optional[list[str] | Args] = None) -> None:
    """Parse (or take) and validate everything, then run the pipeline. Every early end is a Stop:
    one line on stderr and its exit code (2 bad input, 3 non-finite loss, 130 interrupted)."""
    run = None
    try:
        args = argv if isinstance(argv, Args) else parse_args(argv)
        if args.eval_only:
            return evaluate_saved_policy(args)
        run_dir, info, demos, checkpoints = validate(args)
        if info is None:
            print(f"{run_dir} already holds a finished run (results.json); nothing to do")
            return
        run = start_run(args, run_dir)
        pipeline(args, info, demos, checkpoints, run)
    except Stop as e:
        if run is None:  # bad input, or a signal during --eval-only: nothing to resume
            print(f"{e.prefix}{e}", file=sys.stderr)
        else:
            resume = f"; resume with: {resume_command(run.dir, argv)}" if isinstance(e, Interrupted) else ""
            finish_run(run, f"{e.prefix}{e}{resume}")
        raise SystemExit(e.code)
    finish_run(run)


def resume_command(run_dir: Path, argv) -> str:
    """The exact command that resumes this run: this one's flags with --run-dir set to the run dir (the default
    run dir ends in a timestamp, so the same command alone would start a new run)."""
    script = sys.argv[0] if argv is None else SCRIPT
    argv = [] if isinstance(argv, Args) else list(sys.argv[1:] if argv is None else map(str, argv))
    kept = []
    while argv:
        arg = argv.pop(0)
        if arg in ("--run-dir", "--run_dir"):
            argv = argv[1:]
        elif not arg.startswith(("--run-dir=", "--run_dir=")):
            kept.append(arg)
    return shlex.join(["python", script, *kept, "--run-dir", str(run_dir)])


# ---- checkpoints, atomic writes, results
FORMAT_VERSION = 1
KEYS = {  # kind of a torch file: the keys it must hold (besides kind and version)
    "policy": ("script", "env_id", "network", "config", "state_dict", "max_episode_steps"),
    "expert_actor": ("actor", "env_id", "obs_dim", "act_dim", "hidden", "total_timesteps", "mean_return"),
    "expert_checkpoint": ("agent", "learner_rows", "progress", "rng", "best_actor"),
    "irl_checkpoint": ("agent", "learner_rows", "progress", "rng", "disc"),
}


def save(path: Path, kind: str, **payload) -> None:
    """Every artifact, atomically: write `name.tmp` beside `path`, then os.replace. By suffix: JSON, npz arrays, a
    PNG (payload `figure`); anything else is torch.save of {kind, version, **payload}, read back by `load`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".json":
        tmp.write_text(json.dumps(payload, indent=2))
    elif path.suffix == ".npz":
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **payload)
    elif path.suffix == ".png":
        payload["figure"].savefig(tmp, format="png")
    else:
        torch.save({"kind": kind, "version": FORMAT_VERSION, **payload}, tmp)
    os.replace(tmp, path)


def load(path: Path, kind: str, fix: str = "delete it (or the run dir) and re-run") -> dict:
    """`save`'s artifact as a dict, checked: npz arrays (demos), a torch file of `kind` (this version, its keys) or
    a JSON object. Anything else (truncated, random bytes, another script's file) is a UsageError naming the file."""
    try:
        if kind == "demos":
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        elif kind in KEYS:
            data = torch.load(path, map_location="cpu", weights_only=False)
        else:
            data = json.loads(Path(path).read_text())
    except Exception as e:  # any unreadable file is bad input
        raise UsageError(f"{path} is unreadable ({type(e).__name__}); {fix}")
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object or a dict; {fix}")
    if kind in KEYS and data.get("script", SCRIPT) != SCRIPT:
        raise UsageError(f"{path} was written by {data['script']}; use that script")
    if kind in KEYS and (data.get("kind"), data.get("version")) != (kind, FORMAT_VERSION):
        raise UsageError(f"{path} is not a current {kind} file of {SCRIPT}; {fix}")
    missing = [key for key in KEYS.get(kind, ()) if key not in data]
    if missing:
        raise UsageError(f"{path} lacks {', '.join(missing)}; {fix}")
    return data


def rng_states(np_rng) -> dict:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    rng = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(), cuda=cuda)
    return dict(rng, np_rng=np_rng.bit_generator.state)


def set_rng_states(rng: dict, np_rng) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    np_rng.bit_generator.state = rng["np_rng"]


@contextlib.contextmanager
def undone_on_stop(progress: dict, np_rng, *parts):
    """A signal inside the block puts the parts, the counters and every RNG back as they were when it started, so
    the checkpoint the phase then saves redoes the whole block on resume, exactly."""
    rng, counters = rng_states(np_rng), copy.deepcopy(progress)
    states = [copy.deepcopy(part.state_dict()) for part in parts]
    try:
        yield
    except Interrupted:
        set_rng_states(rng, np_rng)
        progress.update(counters)
        for part, state in zip(parts, states):
            part.load_state_dict(state)
        raise


def save_checkpoint(
    path: Path, sac: SAC, storage: Storage, np_rng, progress: dict, disc=None, episode=None, best_actor=None
) -> None:
    rng = rng_states(np_rng)
    rows = storage.learner_rows().to("cpu", copy=True)  # (a view would save the expert rows and free capacity too)
    progress = {**progress, "episode": episode} if episode is not None else progress
    state = {"agent": sac.state_dict(), "learner_rows": rows, "progress": progress, "rng": rng}
    if disc is None:  # the expert's, with the weights of its best evaluated actor (None before the first)
        save(path, "expert_checkpoint", **state, best_actor=best_actor)
    else:
        save(path, "irl_checkpoint", **state, disc=disc.state_dict())


def restore_checkpoint(ckpt: dict, phase: str, sac: SAC, storage: Storage, np_rng, disc=None) -> dict:
    """Load a validated checkpoint into the phase's objects and RNGs; returns its progress counters."""
    sac.load_state_dict(ckpt["agent"])
    storage.load_learner_rows(ckpt["learner_rows"])
    if disc is not None:
        disc.load_state_dict(ckpt["disc"])
    set_rng_states(ckpt["rng"], np_rng)
    print(f"[{phase}] resuming from step {ckpt['progress']['step']}", flush=True)
    return dict(ckpt["progress"])


def irl_results(args: Args, demos: dict, progress: dict, wall_time: float, device) -> dict:
    """results.json: the final evaluation, budget and env-step counts, SPS, rho and the evaluation history."""
    final, expert_return, steps = progress["history"][-1], float(np.mean(demos["returns"])), progress["step"]
    results = dict(env_id=args.env_id, method="HyPE+FILTER" if args.irl.reset_prob > 0 else "HyPE", seed=args.seed)
    results.update(eval_mean=final["mean"], eval_std=final["std"], eval_returns=final["returns"])
    results.update(eval_episodes=args.eval.episodes, expert_return=expert_return, num_demos=len(demos["returns"]))
    results["normalized_return"] = final["mean"] / expert_return if expert_return else float("nan")
    results["success_rate"] = final["success_rate"]  # mazes: the share of evaluation episodes reaching the goal
    results.update(policy_env_steps=steps, disc_env_steps=progress["disc_env_steps"], outer_iterations=progress["k"])
    results.update(
        total_env_steps=steps + progress["disc_env_steps"], SPS=progress["SPS"], rho_schedule=rho_schedule(args)
    )
    results.update(final_rho=progress["final_rho"], reset_prob=args.irl.reset_prob, p_tremble=args.irl.p_tremble)
    results.update(terminal_reward=terminal_reward(args), resumed_from_step=progress["resumed_from_step"])
    results.update(wall_time_s=wall_time, device=str(device), date=dt.datetime.now(dt.timezone.utc).isoformat())
    keys = ("step", "total_env_steps", "mean", "std", "success_rate")
    results["history"] = [{k: h.get(k) for k in keys} for h in progress["history"]]
    return results


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory instead of re-faulting fresh pages for every update's tensors (measured up to
    16 % of a SAC update on the 2-core VM, see the docs' speed section)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to tune
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MB (glibc's maximum) come from the heap
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not give the heap's top back while less than 1 GB is free


# ---- plots, video, evaluation of a saved policy
def plot_curves(path: Path, args: Args, history: list, expert_return: float, expert_curve=()) -> None:
    """learning_curve.png: one panel per phase (expert training; IRL evaluations, the latest marked)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, nothing to close

    fig = Figure(figsize=(11, 4), dpi=90)
    ax_e, ax_i = fig.subplots(1, 2)
    if is_maze(args.env_id):  # no expert phase: the left panel shows how often the learner reaches the goal
        steps, rates = [h["step"] for h in history], [h["success_rate"] for h in history]
        ax_e.plot(steps, rates, marker="o", label="learner (policy env steps)")
        ax_e.plot([h["total_env_steps"] for h in history], rates, ls="--", alpha=0.6, label="incl. discriminator steps")
        ax_e.set(title="IRL phase: success rate (goal within 0.45)", xlabel="env steps", ylim=(-0.05, 1.05))
    else:
        if len(expert_curve):
            ax_e.plot(*zip(*expert_curve), lw=0.8, label="SAC on the true reward (episodes)")
        if math.isfinite(expert_return):
            ax_e.axhline(expert_return, color="k", ls=":", label="demos' mean return")
        ax_e.set(title="expert phase", xlabel="env steps", ylabel="true return")
    if history:
        steps, means = [h["step"] for h in history], [h["mean"] for h in history]
        ax_i.plot(steps, means, marker="o", label="learner (policy env steps)")
        ax_i.plot([h["total_env_steps"] for h in history], means, ls="--", alpha=0.6, label="incl. discriminator steps")
        ax_i.plot(steps[-1:], means[-1:], marker="*", ms=14, color="C3", ls="", label=f"latest: {means[-1]:.0f}")
        ax_i.axhline(expert_return, color="k", ls=":", label="expert demos")
    ax_i.set(title="IRL phase: deterministic evaluation", xlabel="env steps", ylabel="true return")
    for ax in (ax_e, ax_i):
        ax.legend(fontsize=8) if ax.get_legend_handles_labels()[0] else None
    method = "HyPE+FILTER" if args.irl.reset_prob > 0 else "HyPE"
    fig.suptitle(f"{args.env_id}: {method} (rho {args.irl.rho_schedule or 'per env'}), seed {args.seed}")
    fig.tight_layout()
    save(path, "figure", figure=fig)


def write_video(path: Path, frames: list, fps: int) -> None:
    """VP9 WebM (plays in browsers, TensorBoard and wandb) through opencv's writer, atomically."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.webm")  # opencv picks the container from the extension
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"VP90"), fps, (width, height))
    try:
        for frame in frames:
            check_stop()  # VP9 encodes slowly on a busy CPU: a signal stops it, leaving no partial file
            writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
    except Interrupted:
        writer.release()
        tmp.unlink(missing_ok=True)
        raise
    writer.release()
    os.replace(tmp, path)


def load_policy(path, device="cpu") -> Actor:
    """policy.pt -> the Actor in eval mode, with `.act(obs)` (deterministic) and `.env_id`."""
    saved = torch.load(path, map_location=device, weights_only=True)
    config = saved["config"]
    low, high = np.array(config["low"]), np.array(config["high"])
    actor = Actor(config["obs_dim"], config["act_dim"], low, high, config["hidden"])
    actor.load_state_dict(saved["state_dict"])
    actor.env_id, actor.max_episode_steps = saved["env_id"], saved["max_episode_steps"]
    return actor.to(device).eval()


def make_policy_envs(policy: Actor, num_envs: int) -> gym.vector.VectorEnv:
    """The envs the policy was trained on, made as in training (the horizon as a TimeLimit;
    mazes flat)."""
    limit = {"max_episode_steps": policy.max_episode_steps} if policy.max_episode_steps else {}
    env_id = policy.env_id
    make = lambda: flat_obs(env_id, make_gym_env(env_id, **limit))  # noqa: E731
    return gym.vector.SyncVectorEnv([make for _ in range(num_envs)])


def evaluate_saved_policy(args: Args) -> None:
    """--eval-only RUN_DIR: evaluate RUN_DIR/policy.pt, write RUN_DIR/evaluations/eval_NNN.json (never overwritten)."""
    run_dir = Path(args.eval_only)
    path = run_dir / "policy.pt"
    if not path.is_file():
        raise UsageError(f"{path} does not exist; pass the run dir of a finished run (with policy.pt) to --eval-only")
    check_args(args)
    load(path, "policy", "re-run the training to rewrite it")
    try:
        policy = load_policy(path)
    except Exception as e:  # weights of another configuration
        raise UsageError(f"{path} is not a readable policy.pt ({type(e).__name__}); re-run the training to rewrite it")
    if args.capture_video:
        check_rendering(policy.env_id)
    check_writable(run_dir / "evaluations", "--eval-only")
    number = 1 + max([int(p.stem[5:]) for p in run_dir.glob("evaluations/eval_[0-9][0-9][0-9].json")], default=0)
    video = run_dir / "videos" / f"eval_{number:03d}.webm" if args.capture_video else None
    seed, episodes, p_tremble = args.seed + 20_000, args.eval.episodes, args.irl.p_tremble
    answer_signals()  # a signal stops the episodes (or the video) within a step: nothing is written
    print(f"evaluating {path}: {episodes} episodes", flush=True)
    try:
        rets, successes = evaluate(policy, policy.env_id, episodes, seed, p_tremble, policy.max_episode_steps, video)
    except Interrupted:
        raise Interrupted(EVAL_ONLY, None) from None
    record = dict(env_id=policy.env_id, mean=float(np.mean(rets)), std=float(np.std(rets)), returns=rets)
    record["success_rate"] = float(np.mean(successes)) if successes is not None else None
    record.update(episodes=episodes, seed=seed, p_tremble=p_tremble)
    out = run_dir / "evaluations" / f"eval_{number:03d}.json"
    save(out, "evaluation", **record)
    success = f", success rate {record['success_rate']:.2f}" if successes is not None else ""
    print(f"eval return {record['mean']:.1f} +- {record['std']:.1f}{success} over {len(rets)} episodes -> {out}")


# ---- expert data: the shared cache, user files and Minari datasets
def write_expert_cache(args: Args, agent: SAC, demos: dict, best: Optional[list], steps: int) -> dict:
    """Write demos.npz, expert_actor.pt and expert_meta.json (with the evaluation that chose the actor, [mean,
    step], or None for the last actor, and the SAC steps trained); a cache another run finished first is kept."""
    cache = Path(args.expert.experts_dir) / args.env_id
    if (cache / "demos.npz").exists():  # another run (or filter_irl_mujoco.py) finished first: never overwrite
        print(f"[expert] {cache}/demos.npz appeared meanwhile; using it", file=sys.stderr)
        return load(cache / "demos.npz", "demos")
    returns, now = demos["returns"], dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    sizes = dict(obs_dim=demos["observations"].shape[1], act_dim=demos["actions"].shape[1], hidden=args.sac.hidden_dim)
    save(cache / "demos.npz", "demos", **demos)
    actor = {k: v.cpu() for k, v in agent.actor.state_dict().items()}
    mean_return, timesteps = float(returns.mean()), steps
    actor_file = dict(actor=actor, env_id=args.env_id, **sizes, total_timesteps=timesteps, mean_return=mean_return)
    save(cache / "expert_actor.pt", "expert_actor", **actor_file)
    meta = dict(env_id=args.env_id, expert_timesteps=timesteps, num_demos=len(returns), seed=args.seed)
    meta.update(return_mean=mean_return, return_std=float(returns.std()), script=SCRIPT, date=now)
    meta.update(chosen_by_evaluation=best, eval_every=args.expert.eval_every, eval_episodes=args.expert.eval_episodes)
    meta.update(target_return=args.expert.target_return)
    save(cache / "expert_meta.json", "expert_meta", **meta, num_transitions=len(demos["observations"]), **sizes)
    print(f"[expert] {len(returns)} demos, return {meta['return_mean']:.1f} +- {meta['return_std']:.1f}")
    return demos


def minari_demos(dataset_id: str) -> dict[str, np.ndarray]:
    """A downloaded Minari dataset in the demos.npz layout (without MuJoCo states)."""
    try:
        import minari
    except ImportError:
        raise UsageError(f"reading {MINARI_PREFIX}{dataset_id} needs the minari package: pip install 'minari[hdf5]'")
    if dataset_id not in minari.list_local_datasets():
        raise UsageError(f"Minari dataset {dataset_id} is not downloaded: run `minari download {dataset_id}` first")
    try:
        dataset = minari.load_dataset(dataset_id)
        spec = dataset.spec.env_spec
        episodes = list(dataset.iterate_episodes())
    except Exception as e:  # a broken local copy
        raise UsageError(f"cannot read Minari dataset {dataset_id} ({type(e).__name__}); delete and download it again")
    if not all(isinstance(ep.observations, np.ndarray) and isinstance(ep.actions, np.ndarray) for ep in episodes):
        raise UsageError(f"Minari dataset {dataset_id} has dict or tuple spaces; pass a dataset with flat Box spaces")
    lengths = [len(ep.rewards) for ep in episodes]
    parts = {  # key: (its per-episode pieces, dtype)
        "observations": ([ep.observations[:-1] for ep in episodes], np.float32),
        "next_observations": ([ep.observations[1:] for ep in episodes], np.float32),
        "actions": ([ep.actions for ep in episodes], np.float32),
        "rewards": ([ep.rewards for ep in episodes], np.float32),
        "terminals": ([ep.terminations for ep in episodes], bool),
        "timeouts": ([ep.truncations for ep in episodes], bool),
        "episode_starts": ([np.arange(n) == 0 for n in lengths], bool),
        "timesteps": ([np.arange(n) for n in lengths], np.int64),
    }
    demos = {k: np.concatenate(p).astype(dtype) if p else np.zeros(0, dtype) for k, (p, dtype) in parts.items()}
    demos["episode_ids"] = np.repeat(np.arange(len(episodes), dtype=np.int64), lengths)
    demos["returns"] = np.array([float(np.sum(ep.rewards)) for ep in episodes], np.float64)
    demos["env_id"] = np.array(spec.id if spec is not None else "")
    for k in ("observations", "next_observations", "actions"):  # (0,) from an empty dataset: keep 2-d for the checks
        demos[k] = demos[k].reshape(len(demos["rewards"]), -1)
    return demos


def load_demos(path, env_id: str, sizes: dict, reset_prob: float) -> dict[str, np.ndarray]:
    """A demos.npz or minari:ID dataset, every key checked against the format and the env (`sizes`) by name."""
    if str(path).startswith(MINARI_PREFIX):
        demos = minari_demos(str(path)[len(MINARI_PREFIX) :])
    else:
        demos = load(path, "demos", "delete it or pass another file")
    missing = [k for k in list(DEMO_FORMAT) + ["env_id"] if k not in demos and k not in OPTIONAL_DEMO_KEYS]
    if missing:
        raise UsageError(f"{path} lacks keys {', '.join(missing)}; see the expert-data format in docs/{SCRIPT[:-3]}.md")
    lacking = [k for k in MAZE_DEMO_KEYS if k not in demos] if is_maze(env_id) else []
    if lacking:
        raise UsageError(
            f"{path} lacks keys {', '.join(lacking)}, which maze demos need (mbirl_antmaze.py writes them)"
        )
    if demos["env_id"].shape != () or demos["env_id"].dtype.kind != "U":
        raise UsageError(f"{path}: key env_id must be a 0-d string array naming the env")
    if str(demos["env_id"]) != env_id:
        raise UsageError(f"{path} holds demos of {demos['env_id']} (key env_id), not {env_id}; pass matching demos")
    demo_format = MAZE_DEMO_FORMAT if is_maze(env_id) else DEMO_FORMAT
    per_row = [k for k, (_, shape) in demo_format.items() if k in demos and shape[0] == "N"]
    lengths = [len(demos[k]) if demos[k].ndim else -1 for k in per_row]
    n = max(set(lengths), key=lengths.count)  # the length most keys agree on: the odd key out is named
    ids = demos["episode_ids"]
    episodes = len(np.unique(ids)) if ids.ndim == 1 and ids.dtype.kind in "iu" else len(demos["returns"])
    if n < 1 or episodes < 1:
        raise UsageError(f"{path} holds no complete expert episode; record at least one episode")
    dims = {"N": n, "E": episodes, **sizes}
    for key, (dtype, shape) in demo_format.items():
        if key not in demos:
            continue
        a, expected, kind = demos[key], tuple(dims.get(d, d) for d in shape), np.dtype(dtype).kind
        if a.dtype.kind not in {"f": "fiu", "i": "iu", "b": "biu"}[kind] or (
            kind == "b" and a.dtype.kind in "iu" and not np.isin(a, (0, 1)).all()
        ):
            raise UsageError(f"{path}: key {key} has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if a.shape != expected:
            raise UsageError(f"{path}: key {key} has shape {a.shape}, expected {expected} for {sizes['env']}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UsageError(f"{path}: key {key} holds NaN or infinite values")
    n, episodes = len(demos["observations"]), len(demos["returns"])
    first, last = np.r_[True, ids[1:] != ids[:-1]], np.r_[ids[1:] != ids[:-1], True]
    counts = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    demos.setdefault("timesteps", counts)  # derivable from episode_ids
    inside = ~last[:-1]
    continues = np.allclose(demos["next_observations"][:-1][inside], demos["observations"][1:][inside], 1e-5, 1e-6)
    sums = np.bincount(ids, weights=demos["rewards"].astype(np.float64), minlength=episodes)
    stray_terminal = np.any(demos["terminals"].astype(bool) & ~last)
    ordered = np.all(ids[1:] >= ids[:-1]) and np.array_equal(np.unique(ids), np.arange(episodes))
    rules = {  # key: (holds, what it must be)
        "episode_ids": (ordered, "must number the episodes 0..E-1 in order (E = len(returns))"),
        "episode_starts": (np.array_equal(demos["episode_starts"].astype(bool), first), "disagrees with episode_ids"),
        "timesteps": (np.array_equal(demos["timesteps"], counts), "must count 0, 1, ... inside each episode"),
        "next_observations": (continues, "must equal the next transition's observation inside an episode"),
        "terminals": (not stray_terminal, "marks a step that does not end its episode"),
        "returns": (np.allclose(sums, demos["returns"], rtol=1e-4, atol=1e-2), "must be the episodes' reward sums"),
    }
    if "goal" in demos and is_maze(env_id):
        rules["goal"] = (
            np.allclose(demos["goal"], demos["observations"][:, -2:], atol=1e-5),
            "must end every observation",
        )
    for key, (holds, message) in rules.items():
        if not holds:
            raise UsageError(f"{path}: key {key} {message}")
    if reset_prob > 0 and any(k not in demos for k in STATE_KEYS):
        states = "/".join(STATE_KEYS)
        raise UsageError(f"{path} has no {states}, so expert resets are impossible; pass --irl.reset-prob 0")
    return demos


# ---- validation: every flag, the env id, the run dir and every artifact, before any work
def flat_fields(obj, prefix: str = ""):
    """(dotted name, value, dataclasses.Field) of every leaf setting of the nested Args."""
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        if dataclasses.is_dataclass(value):
            yield from flat_fields(value, f"{prefix}{spec.name}.")
        else:
            yield f"{prefix}{spec.name}", value, spec


def check_paths(args: Args) -> None:
    """Every path flag (and the default run dir an --exp-name makes) fits the file system, checked before any
    of them is looked at."""
    default_run_dir = None if args.run_dir else f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    paths = {"--run-dir": args.run_dir, "--exp-name": default_run_dir, "--eval-only": args.eval_only}
    paths |= {"--expert.experts-dir": args.expert.experts_dir, "--expert.path": args.expert.path}
    for flag, path in paths.items():
        if path is not None and not fits_file_system(path):
            limits = "255 bytes a name, 4095 a path"
            raise UsageError(f"{flag}: {str(path)[:60]}... is too long for the file system ({limits}): shorten it")


def fits_file_system(path: str) -> bool:
    """Whether the file system can hold the path (255 bytes a name, 4095 a path, as on Linux): checked before anything
    looks at it, so a long one fails here with one line and not halfway through making the run dir."""
    parts = Path(path).parts
    return all(len(os.fsencode(p)) <= 255 for p in parts) and len(os.fsencode(Path(path).absolute())) <= 4095


def check_args(args: Args) -> None:
    """Ranges (NaN fails every one; `ranged` fields in Args) and cross-field rules of every flag."""
    for name, value, spec in flat_fields(args):
        interval, flag = spec.metadata.get("range"), "--" + name.replace("_", "-")
        if interval and value is not None:
            lo, hi = (float(x) for x in interval[1:-1].split(","))
            above = lo < value if interval[0] == "(" else lo <= value
            if not (above and (value < hi if interval[-1] == ")" else value <= hi)):
                raise UsageError(f"{flag} must lie in {interval}, not {value}")
    if not args.exp_name or "/" in args.exp_name:
        raise UsageError("--exp-name must be a non-empty name without '/'")
    check_paths(args)
    if args.sac.learning_starts >= args.irl.total_timesteps:
        raise UsageError("--sac.learning-starts must be below --irl.total-timesteps, or the learner never learns")
    if args.expert.target_return is not None and args.expert.eval_every == 0:
        raise UsageError("--expert.target-return needs evaluations: set --expert.eval-every above 0")
    if args.track and importlib.util.find_spec("wandb") is None:
        raise UsageError("--track needs wandb: pip install wandb (or drop --track)")
    if args.capture_video and importlib.util.find_spec("cv2") is None:
        raise UsageError("--capture-video needs opencv-python: pip install opencv-python")


def check_maze_id(env_id: str) -> None:
    """PointMaze_*-v3 or AntMaze_*-v4/v5 of gymnasium-robotics (near misses get a suggestion)."""
    if gymnasium_robotics is None:
        raise UsageError(f"{env_id} needs gymnasium-robotics: pip install gymnasium-robotics")
    prefix = next(p for p in MAZE_VERSIONS if env_id.startswith(p))
    mazes = [k for k in gym.registry if k.startswith(prefix) and k.rsplit("-", 1)[-1] in MAZE_VERSIONS[prefix]]
    if env_id not in mazes:
        guess = ", ".join(difflib.get_close_matches(env_id, mazes, n=3, cutoff=0.6)) or mazes[0]
        versions = "/".join(MAZE_VERSIONS[prefix])
        raise UsageError(
            f"unknown maze id {env_id!r} ({prefix}* ids are -{versions}); did you mean {guess}? (--env-id)"
        )


def check_env_id(env_id: str) -> tuple[EnvInfo, dict]:
    """A MuJoCo v5 env id or a maze id (other families, retired versions, near misses get a suggestion) -> the env's
    sizes (a maze's: its flat observation's and its inner MuJoCo env's)."""
    mujoco_ids = [k for k, s in gym.registry.items() if "mujoco" in str(s.entry_point)]
    current = [k for k in mujoco_ids if k.endswith("-v5")]
    if is_maze(env_id):
        check_maze_id(env_id)
    elif env_id.startswith("ALE/") or "NoFrameskip" in env_id:
        raise UsageError(f"{env_id} is an Atari env; this script takes MuJoCo envs such as Hopper-v5 (--env-id)")
    elif env_id not in gym.registry:
        lower = {k.lower(): k for k in current}
        close = difflib.get_close_matches(env_id.lower(), list(lower), n=3, cutoff=0.6)
        guess = ", ".join(lower[c] for c in close) or "Hopper-v5"
        raise UsageError(f"unknown env id {env_id!r}; did you mean {guess}? (--env-id)")
    elif env_id not in mujoco_ids:
        raise UsageError(f"{env_id} is not a MuJoCo env; pass a MuJoCo v5 env such as Hopper-v5 (--env-id)")
    elif env_id not in current:
        newer = env_id.rsplit("-v", 1)[0] + "-v5"
        raise UsageError(f"{env_id} is a retired version; use {newer if newer in current else 'a -v5 env'} (--env-id)")
    try:
        env, _ = make_env(env_id)
    except Exception as e:  # e.g. a broken MuJoCo install
        raise UsageError(f"cannot create {env_id} ({type(e).__name__}: {e}); check the gymnasium[mujoco] install")
    space, model = env.action_space, simulator(env).model
    info = EnvInfo(env.observation_space.shape[0], space.shape[0], space.low, space.high)
    env.close()
    return info, {"obs": info.obs_dim, "act": info.act_dim, "nq": model.nq, "nv": model.nv, "env": env_id}


def check_rendering(env_id: str) -> None:
    """--capture-video: MuJoCo must be able to render off-screen (EGL unless MUJOCO_GL says otherwise)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        env, _ = make_env(env_id, render=True)
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as e:
        raise UsageError(f"--capture-video: MuJoCo cannot render here ({type(e).__name__}); set MUJOCO_GL=egl/osmesa")


def check_writable(path: Path, flag_name: str) -> None:
    """The nearest existing ancestor must be a directory we can create something in (nothing is left behind)."""
    parent = next(p for p in (path, *path.parents) if p.exists())
    try:
        if not parent.is_dir():
            raise NotADirectoryError(parent)
        tempfile.TemporaryDirectory(dir=parent).cleanup()
    except OSError:
        raise UsageError(f"{flag_name} {path} is not writable here; pass a path you can write")


def load_checkpoint(path: Path, args: Args, info: EnvInfo, phase: str) -> Optional[dict]:
    """A phase's checkpoint, loaded and checked against this run's networks; None when there is none."""
    if not path.exists():
        return None
    fix = "delete it to redo it"
    ckpt = load(path, f"{phase}_checkpoint", fix)
    try:
        SAC(info, args.sac, torch.device("cpu")).load_state_dict(ckpt["agent"])
        if phase == "irl":
            Discriminator(info.obs_dim + info.act_dim, args.sac.hidden_dim).load_state_dict(ckpt["disc"])
    except Exception as e:  # another configuration's networks
        raise UsageError(f"{path} is of another configuration ({type(e).__name__}); {fix}")
    rows, progress, rng = ckpt["learner_rows"], ckpt["progress"], ckpt["rng"]
    width = 2 * info.obs_dim + info.act_dim + 2
    rows_fit = isinstance(rows, torch.Tensor) and rows.ndim == 2 and rows.shape[1] == width
    step_fits = isinstance(progress, dict) and isinstance(progress.get("step"), int)
    if not (rows_fit and step_fits and isinstance(rng, dict) and {"python", "numpy", "torch", "np_rng"} <= set(rng)):
        raise UsageError(f"{path} holds learner rows, a step or RNG states of another kind; {fix}")
    return ckpt


RETIRED_FLAGS = {  # an old spelling (or a sibling's) -> the flag its one-line hint names (docs/CONTRACT.md)
    "--expert.expert-path": "--expert.path",
    "--checkpoint-frequency": "--checkpoint-every",
    "--threads": "--torch-threads",
}


def tyro_cli(argv: list[str], default: Optional[Args], context: str = "") -> Args:
    """tyro's parser; a flag it rejects is a one-line UsageError built from the event tyro hands its parse-error
    hook (the flag and the reason) before it prints anything, so its printed box is never parsed. --help still
    prints and exits 0; a tyro without the hook prints its own box (exit 2)."""

    def one_line(event) -> None:  # raising here replaces tyro's box
        flag = getattr(event, "argument", None)
        name = flag.display_name() if flag is not None else "a flag"
        if getattr(event, "tokens", None):
            reason = f"Unrecognized options: {' '.join(event.tokens)}"
        elif getattr(event, "choices", None):
            reason = f"{name}: {event.value!r} is not one of {', '.join(event.choices)}"
        else:  # (the first line: for a union, tyro lists each member's failure below it)
            message = getattr(event, "message", None) or "a missing or bad value"
            reason = f"{name}: {message.splitlines()[0]}"
        raise UsageError(
            f"{context} ({reason}); delete it or pass another --run-dir" if context else f"{reason} (see --help)"
        )

    try:
        from tyro._errors import on_parse_error  # tyro's (experimental) parse-error hook
    except ImportError:
        on_parse_error = lambda hook: contextlib.nullcontext()  # noqa: E731
    with on_parse_error(one_line):
        return tyro.cli(Args, args=argv, **({"default": default} if default is not None else {}))


def as_argv(saved: dict, prefix: str = "") -> list[str]:
    """Saved settings as command-line flags, so that tyro checks their types as it checks the user's."""
    argv = []
    for key, value in saved.items():
        name = key.replace("_", "-")
        if isinstance(value, dict):
            argv += as_argv(value, f"{prefix}{key}.")
        elif isinstance(value, bool):
            argv.append(f"--{prefix}{'' if value else 'no-'}{name}")
        else:
            argv += [f"--{prefix}{name}", str(value)]
    return argv


def parse_args(argv: Optional[list[str]]) -> Args:
    """The command line; when --run-dir names an existing run of this script, its args.json supplies the defaults,
    so `--run-dir X` alone resumes it and flags passed again win."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    retired = [flag for a in argv if (flag := a.split("=")[0].replace("_", "-")) in RETIRED_FLAGS]
    if retired:
        new = RETIRED_FLAGS[retired[0]]
        raise UsageError(f"{retired[0]} was renamed: use {new} (the same flag in every script)")
    args = tyro_cli(argv, None)
    check_paths(args)
    saved_path = Path(args.run_dir) / "args.json" if args.run_dir and not args.eval_only else None
    if saved_path is None or not saved_path.exists():
        return args
    saved = load(saved_path, "args")
    if saved.get("script") != SCRIPT or not isinstance(saved.get("args"), dict):
        owner = saved.get("script") or "another script"
        raise UsageError(f"{args.run_dir} is a run dir of {owner}, not {SCRIPT}; pass another --run-dir")
    default = tyro_cli(as_argv(saved["args"]), None, f"{saved_path} holds settings this script cannot read")
    args = tyro_cli(argv, default)
    if args.env_id != saved.get("env_id"):
        raise UsageError(f"{args.run_dir} holds a {saved.get('env_id')} run, not {args.env_id}; pass another --run-dir")
    return args


def validate(args: Args) -> tuple[Path, Optional[EnvInfo], Optional[dict], dict]:
    """Check every input before anything is written; return what was loaded: (run dir, env sizes, demos (None: the
    expert phase runs), checkpoints by phase). A finished run dir returns (run dir, None, None, {})."""
    check_args(args)
    info, sizes = check_env_id(args.env_id)
    parse_rho_schedule(rho_schedule(args))
    row_bytes = 4 * (2 * info.obs_dim + info.act_dim + 2)
    rows = min(args.sac.buffer_size, max(args.expert.timesteps, args.irl.total_timesteps))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else float("inf")
    if rows * row_bytes > memory / 2:
        gib = rows * row_bytes / 2**30
        raise UsageError(f"a {rows}-row replay buffer needs {gib:.1f} GiB, over half the RAM; lower --sac.buffer-size")
    if args.capture_video:
        check_rendering(args.env_id)
    run_dir = Path(args.run_dir or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file; pass a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / "args.json").exists():
        raise UsageError(f"{run_dir} exists and is not a run dir of {SCRIPT}; pass another --run-dir")
    if (run_dir / "results.json").exists():
        load(run_dir / "results.json", "results")
        check_finished_with_same_flags(run_dir, load(run_dir / "args.json", "args").get("args", {}), args)
        return run_dir, None, None, {}
    check_writable(run_dir, "--run-dir")
    cache, path = Path(args.expert.experts_dir) / args.env_id / "demos.npz", args.expert.path
    if path and not path.startswith(MINARI_PREFIX) and not Path(path).is_file():
        raise UsageError(f"--expert.path {path} does not exist; pass a demos.npz or drop the flag to use the cache")
    path = path or (cache if cache.exists() else None)
    if path is None and is_maze(args.env_id):  # a sparse maze has no SAC expert phase
        make = f"python mbirl_antmaze.py --env-id {args.env_id}"
        raise UsageError(f"no maze demos at {cache}: make them with `{make}` or pass --expert.path FILE")
    demos = load_demos(path, args.env_id, sizes, args.irl.reset_prob) if path else None
    if demos is not None and args.expert.num_demos not in (None, len(demos["returns"])):  # never a silent mismatch
        n, flag = len(demos["returns"]), f"--expert.num-demos {args.expert.num_demos}"
        raise UsageError(
            f"{path} holds {n} expert episodes, not {flag}: pass another --expert.experts-dir or drop the flag"
        )
    checkpoints = {}
    if demos is None:
        check_writable(cache.parent, "--expert.experts-dir")
        if args.sac.learning_starts >= args.expert.timesteps:
            raise UsageError("--sac.learning-starts must be below --expert.timesteps, or the expert never learns")
        checkpoints["expert"] = load_checkpoint(run_dir / "checkpoints" / "expert.pt", args, info, "expert")
    checkpoints["irl"] = load_checkpoint(run_dir / "checkpoints" / "irl.pt", args, info, "irl")
    return run_dir, info, demos, checkpoints


def changed_flags(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """The flags whose value in this command differs from the run's args.json ("--flag NEW (was OLD)"); the run dir
    and --eval-only aside, and settings args.json lacks (added since) count as unchanged."""
    changed = []
    for key, was in saved.items():
        if key not in now or (not prefix and key in ("run_dir", "eval_only")):
            continue
        if isinstance(was, dict) and isinstance(now[key], dict):
            changed += changed_flags(was, now[key], f"{prefix}{key}.")
        elif was != now[key]:
            changed.append(f"--{(prefix + key).replace('_', '-')} {now[key]} (was {was})")
    return changed


def check_finished_with_same_flags(run_dir: Path, saved: dict, args) -> None:
    """A finished run re-run: the same flags -> nothing to do (exit 0); other flags -> UsageError naming them."""
    changed = changed_flags(saved, json.loads(json.dumps(dataclasses.asdict(args))))
    if changed:
        flags = ", ".join(changed)
        fix = "re-run with the flags of args.json, or pass a new --run-dir"
        raise UsageError(f"{run_dir} holds a finished run with other settings: {flags}; {fix}")


# ---- starting and ending a run
def start_run(args: Args, run_dir: Path) -> Run:
    """Seeds, the run dir (stale .tmp files removed), args.json, TensorBoard (and wandb), device and signals."""
    from torch.utils.tensorboard import SummaryWriter

    keep_freed_memory()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    run = Run(run_dir, None, device)
    run.dir.mkdir(parents=True, exist_ok=True)
    for stale in [*run.dir.rglob("*.tmp"), *run.dir.rglob("*.tmp.webm")]:  # left by a killed write
        stale.unlink()
    config = dataclasses.asdict(args)
    save(run.dir / "args.json", "args", script=SCRIPT, env_id=args.env_id, args=config)
    if args.track:
        import wandb

        project, entity = args.wandb_project_name, args.wandb_entity
        wandb.init(
            project=project, entity=entity, sync_tensorboard=True, config=config, name=run.dir.name, save_code=True
        )
    run.writer = SummaryWriter(str(run.dir))
    rows = [f"|{name}|{value}|" for name, value, _ in flat_fields(args)]
    run.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(rows))
    answer_signals()
    print(f"run directory: {run.dir}")
    return run


def answer_signals() -> None:
    """SIGINT/SIGTERM set STOP; the loops notice it within a step (training saves its checkpoint first)."""
    STOP.clear()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: STOP.set())


def finish_run(run: Run, message: Optional[str] = None) -> None:
    run.writer.close()
    if message:
        print(message, file=sys.stderr)
    print(f"run directory: {run.dir}")


if __name__ == "__main__":
    main()
