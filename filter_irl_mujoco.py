"""FILTER: inverse reinforcement learning with resets to expert states, on MuJoCo (single file).

Moment matching alternates a discriminator f(s, a) (an integral-probability-metric critic with a gradient penalty)
and a SAC learner trained on the reward -f(s, a). FILTER starts half of the learner's episodes from states of the
expert's demonstrations (exact MuJoCo restore, remaining horizon), so the policy step needs no global exploration;
`--irl.reset-prob 0` is the plain moment-matching (MM) baseline. Paper: Swamy, Choudhury, Bagnell, Wu (2023),
"Inverse Reinforcement Learning without Reinforcement Learning", ICML 2023 (arXiv 2303.14623).

Usage:
    python filter_irl_mujoco.py --env-id Hopper-v5                        # expert phase (cached), then FILTER
    python filter_irl_mujoco.py --env-id InvertedPendulum-v5 --expert.timesteps 10000 --irl.total-timesteps 10000
    python filter_irl_mujoco.py --run-dir runs/X                           # resume; --eval-only runs/X evaluates

Defaults, deliberate differences, the expert-data format and the run directory: docs/filter_irl_mujoco.md.
"""

import contextlib
import copy
import ctypes
import dataclasses
import difflib
import importlib.util
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
import tyro
from tqdm import tqdm

SCRIPT = "filter_irl_mujoco.py"
VIDEO_SIZE = 240  # rendered frame width and height
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
STATE_KEYS = ("qpos", "qvel", "qacc_warmstart")
DEMO_FORMAT = {  # key: (dtype, shape) in N transitions, E episodes and the env's sizes
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
OPTIONAL_DEMO_KEYS = ("timesteps", "seeds") + STATE_KEYS


def ranged(default, interval: str):
    """A numeric setting with the interval it must lie in ("(" and ")" exclude the bound), checked before any work."""
    return field(default=default, metadata={"range": interval})


@dataclass
class ExpertArgs:  # the comment after each field is its --help line
    experts_dir: str = "experts"  # cache: {experts_dir}/{env_id}/demos.npz (shared with hype_irl_mujoco.py)
    path: Optional[str] = None  # your own demos.npz, or minari:DATASET_ID (no MuJoCo states), instead of the cache
    timesteps: int = ranged(1_000_000, "[1, 1e9]")  # env steps of SAC expert training on the true reward
    num_demos: Optional[int] = ranged(None, "[1, 1e5]")  # expert episodes to record (reset seeds 0, 1, ...; default 64)
    eval_every: int = ranged(10_000, "[0, 1e9]")  # demos by the best actor of evaluations this often (0: the last)
    eval_episodes: int = ranged(5, "[1, 1000]")  # deterministic episodes per expert evaluation (the reference: 5)
    target_return: Optional[float] = ranged(None, "[-1e9, 1e9]")  # stop once an evaluation's mean reaches it
    actor: Optional[str] = None  # an expert_actor.pt (from an expert cache) records the demos: no SAC training
    only: bool = False  # stop after the expert phase (builds the cache that hype_irl_mujoco.py also reads)


@dataclass
class SACArgs:
    buffer_size: int = ranged(1_000_000, "[1, 1e9]")  # replay memory size
    gamma: float = ranged(0.99, "[0, 1)")  # discount factor, in [0, 1)
    tau: float = ranged(0.005, "(0, 1]")  # target smoothing coefficient, in (0, 1]
    batch_size: int = ranged(256, "[1, 65536]")  # batch size of the SAC updates
    learning_starts: int = ranged(5000, "[0, 1e9]")  # env steps of uniform random actions (each phase) before updates
    policy_lr: float = ranged(3e-4, "(0, 1]")  # learning rate of the policy network optimizer
    q_lr: float = ranged(1e-3, "(0, 1]")  # learning rate of the Q network (and entropy coefficient) optimizers
    policy_frequency: int = ranged(2, "[1, 1000]")  # that many policy updates every that many steps (TD3's delay)
    target_network_frequency: int = ranged(1, "[1, 1e6]")  # the frequency of updates for the target networks
    alpha: float = ranged(0.2, "(0, 100]")  # entropy coefficient (initial value when autotuned)
    autotune: bool = True  # automatic tuning of the entropy coefficient
    hidden_dim: int = ranged(256, "[1, 4096]")  # width of the two hidden layers of actor, critics and discriminator
    compile: bool = False  # torch.compile the SAC update (opt-in)


@dataclass
class DiscArgs:
    lr: float = ranged(8e-4, "(0, 1]")  # lr0: outer iteration k uses lr0 / max(1, k) with a fresh optimizer
    steps: int = ranged(1, "[1, 1e4]")  # discriminator gradient steps per outer iteration
    batch_size: int = ranged(4096, "[1, 1e6]")  # expert and learner (s, a) pairs per discriminator step
    trajectories: int = ranged(4, "[1, 1000]")  # fresh learner trajectories per update (their env steps count)
    gp_weight: float = ranged(10.0, "[0, 1e6]")  # weight of the gradient penalty (0 = off)
    gp_target: float = ranged(0.4, "[0, 1000]")  # target gradient norm of the penalty
    reset: bool = False  # also start those trajectories from expert states (garage does; FILTER's intent is not)


@dataclass
class IRLArgs:
    total_timesteps: int = ranged(1_000_000, "[1, 1e9]")  # learner env steps (discriminator's counted apart)
    train_every: int = ranged(5000, "[1, 1e9]")  # learner env steps per outer iteration (one discriminator update)
    reset_prob: float = ranged(0.5, "[0, 1]")  # chance an episode starts from a random expert state (0 = MM baseline)
    p_tremble: float = ranged(0.01, "[0, 1]")  # chance the learner's action is replaced by a uniform one (also in eval)
    terminal_reward: Literal["min", "none"] = "min"  # min: after a terminal step the batch's lowest reward forever
    stop_at_normalized: Optional[float] = ranged(None, "(0, 10]")  # stop once an eval reaches this fraction of expert


@dataclass
class EvalArgs:
    frequency: int = ranged(50_000, "[1, 1e9]")  # evaluate every this many learner env steps
    episodes: int = ranged(10, "[1, 1e5]")  # deterministic evaluation episodes


@dataclass
class Args:
    exp_name: str = "filter_irl_mujoco"  # the name of this experiment
    seed: int = ranged(1, "[0, 2e9]")  # seed of the experiment
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled, cuda will be enabled when available
    track: bool = False  # if toggled, this experiment will be tracked with Weights and Biases (when installed)
    wandb_project_name: str = "cleanRL"  # the wandb's project name
    wandb_entity: Optional[str] = None  # the entity (team) of wandb's project
    capture_video: bool = False  # an evaluation episode of the final policy (and of --eval-only) as WebM in videos/
    save_model: bool = True  # save the final learner policy to `{run_dir}/policy.pt` (needed by --eval-only)
    run_dir: Optional[str] = None  # run dir (default runs/{env_id}__{exp_name}__{seed}__{unix_time}); resumed if found
    env_id: str = "Hopper-v5"  # gymnasium MuJoCo v5 env id (Hopper, Walker2d, HalfCheetah, Ant, Humanoid, ...)
    torch_threads: int = ranged(0, "[0, 1024]")
    """torch CPU threads (0 = torch's default); use 1 on a CPU shared with other jobs"""
    log_frequency: int = ranged(100, "[1, 1e9]")  # log losses and SPS every this many env steps
    checkpoint_every: int = ranged(25_000, "[1, 1e9]")  # write a checkpoint every this many env steps (and on SIGINT)
    eval_only: Optional[str] = None  # evaluate RUN_DIR/policy.pt into RUN_DIR/evaluations/eval_NNN.json (no training)
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

    def random_action(self, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high).astype(np.float32)


# ---- Environments
def make_env(env_id: str, seed: int, render: bool = False) -> gym.Env:
    """One gymnasium MuJoCo env with its registered TimeLimit (`terminated` is stored as done,
    truncation bootstraps)."""
    size = dict(render_mode="rgb_array", width=VIDEO_SIZE, height=VIDEO_SIZE) if render else {}
    env = gym.make(env_id, **size)
    env.action_space.seed(seed)
    return env


def restore_state(env: gym.Env, qpos, qvel, qacc_warmstart, timestep: int) -> np.ndarray:
    """Exact restore of an expert state on a just-reset env: qpos, qvel AND the solver warm-start
    (contacts drift without it), then mj_forward; the TimeLimit continues from `timestep` (the
    remaining horizon)."""
    model, data = env.unwrapped.model, env.unwrapped.data
    data.qpos[:], data.qvel[:], data.qacc_warmstart[:] = qpos, qvel, qacc_warmstart
    if model.na:
        data.act[:] = 0.0
    mujoco.mj_forward(model, data)
    env.set_wrapper_attr("_elapsed_steps", int(timestep))
    return env.unwrapped._get_obs()


def sample_start(rng: np.random.Generator, reset_prob: float, num_states: int) -> int:
    """Index of the expert state an episode starts from, or -1 for the env's own initial-state
    distribution."""
    if num_states > 0 and rng.random() < reset_prob:
        return int(rng.integers(num_states))
    return -1


def tremble(action: np.ndarray, rng: np.random.Generator, p: float, low, high) -> np.ndarray:
    """Trembling hand: with probability p the whole action is replaced by a uniform random one."""
    if p > 0 and rng.random() < p:
        return rng.uniform(low, high).astype(action.dtype)
    return action


class LearnerEnv:
    """The learner's env: an episode starts from a uniformly chosen expert state with probability
    `reset_prob`; actions pass through the trembling hand. The true reward it returns is for
    LOGGING only (never in the buffer). With reset_prob and p_tremble 0 it is the plain env: the
    expert phase uses it so that its checkpoints hold the episode in progress too."""

    def __init__(self, env: gym.Env, demos: dict, reset_prob: float, p_tremble: float, rng):
        self.env, self.demos, self.rng = env, demos, rng
        self.reset_prob, self.p_tremble = reset_prob, p_tremble
        self.num_states = len(demos["observations"]) if all(k in demos for k in STATE_KEYS) else 0
        self.low, self.high = env.action_space.low, env.action_space.high

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        i = sample_start(self.rng, self.reset_prob, self.num_states)
        self.from_expert = i >= 0
        if self.from_expert:
            restore_state(self.env, *(self.demos[k][i] for k in (*STATE_KEYS, "timesteps")))
            # The recorded observation, not one recomputed from the state: Ant/Humanoid
            # observations hold contact forces that gymnasium reads after mj_step, i.e. at the
            # PREVIOUS state; every later one is exact.
            obs = self.demos["observations"][i].astype(np.float64)
        return obs

    def step(self, action: np.ndarray):
        action = tremble(action, self.rng, self.p_tremble, self.low, self.high)
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        return action, next_obs, reward, terminated, truncated

    def episode(self, obs, ret: float, length: int) -> dict:
        """The episode in progress, for a checkpoint (tensors: checkpoints load with weights_only)."""
        data, t = self.env.unwrapped.data, torch.as_tensor
        sim = dict(qpos=t(data.qpos.copy()), qvel=t(data.qvel.copy()), act=t(data.act.copy()), time=float(data.time))
        sim.update(qacc_warmstart=t(data.qacc_warmstart.copy()), elapsed=self.env.get_wrapper_attr("_elapsed_steps"))
        return dict(sim=sim, obs=t(np.array(obs)), ret=ret, length=length, from_expert=self.from_expert)

    def resume(self, saved: dict) -> tuple[np.ndarray, float, int]:
        """Continue a checkpointed episode exactly where it was: the simulator state (and the solver's warm-start),
        the TimeLimit's count, the observation. The caller restores the env's RNG state afterwards."""
        self.env.reset()
        data, sim = self.env.unwrapped.data, saved["sim"]
        for key in ("qpos", "qvel", "qacc_warmstart", "act"):
            getattr(data, key)[:] = sim[key].numpy()
        data.time = sim["time"]
        mujoco.mj_forward(self.env.unwrapped.model, data)
        self.env.set_wrapper_attr("_elapsed_steps", sim["elapsed"])
        self.from_expert = saved["from_expert"]
        return saved["obs"].numpy(), saved["ret"], saved["length"]


def start_or_continue(env: LearnerEnv, progress: dict, seed: int, ckpt, np_rng, envs: list):
    """(obs, return, length) of the episode a phase starts in: the checkpointed one continued
    exactly (its simulator state, then every RNG as saved), or a new one (reset seed
    `seed + episodes`)."""
    if progress.get("episode"):
        obs, ret, length = env.resume(progress.pop("episode"))
        set_rng_states(ckpt["rng"], np_rng, envs)
        return obs, ret, length
    return env.reset(seed=seed + progress["episodes"]), 0.0, 0


# ---- Networks
class Actor(nn.Module):
    """SAC actor: MLP obs->h->h ReLU, mean and log_std heads, tanh squash to the action bounds
    (CleanRL's layout)."""

    def __init__(self, obs_dim: int, act_dim: int, low, high, hidden: int = 256):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(obs_dim, hidden), nn.Linear(hidden, hidden)
        self.fc_mean, self.fc_logstd = nn.Linear(hidden, act_dim), nn.Linear(hidden, act_dim)
        scale, bias = (high - low) / 2.0, (high + low) / 2.0
        self.register_buffer("action_scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("action_bias", torch.as_tensor(bias, dtype=torch.float32))
        self.env_id = self.script = ""  # set by load_policy

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        log_std = torch.tanh(self.fc_logstd(h))
        return self.fc_mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action, its log-probability, deterministic action)."""
        mean, log_std = self(x)
        eps = torch.randn_like(mean)
        y = torch.tanh(mean + log_std.exp() * eps)
        log_prob = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = (log_prob - torch.log(self.action_scale * (1 - y.pow(2)) + 1e-6)).sum(-1)
        deterministic = torch.tanh(mean) * self.action_scale + self.action_bias
        return y * self.action_scale + self.action_bias, log_prob, deterministic

    def act(self, obs: np.ndarray) -> np.ndarray:
        """A batch of observations (numpy) -> the batch of deterministic actions (numpy)."""
        with torch.no_grad():
            device = self.action_scale.device
            x = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=device)
            return self.get_action(x)[2].cpu().numpy()


class TwinQ(nn.Module):
    """Both Q-networks (s, a) -> h -> h -> 1 as stacked weights evaluated with batched matmuls:
    one kernel per layer for the pair instead of one per network (the CPU update is
    latency-bound on small batches)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, n: int = 2):
        super().__init__()
        sizes = [obs_dim + act_dim, hidden, hidden, 1]
        self.weights, self.biases, self.n = nn.ParameterList(), nn.ParameterList(), n
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init, per member
            weight = torch.empty(n, fan_in, fan_out).uniform_(-bound, bound)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.empty(n, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Q-values of shape (n, B)."""
        h = torch.cat([obs, act], -1).unsqueeze(0).expand(self.n, -1, -1)
        h = torch.relu(torch.baddbmm(self.biases[0], h, self.weights[0]))
        h = torch.relu(torch.baddbmm(self.biases[1], h, self.weights[1]))
        # width-1 output as multiply-sum: the batched matmul's backward (an outer product) is slow
        # on CPU (with fused Adam: together 18-22 % of the IRL phase's SPS, measured in
        # benchmarks/results/readability_before_after.md)
        return (h * self.weights[2].transpose(1, 2)).sum(-1) + self.biases[2].squeeze(-1)


class Discriminator(nn.Module):
    """f(s, a): MLP 256-256 ReLU -> scalar, orthogonal weights (as the reference).
    The learner's reward is -f."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()
        layers = [nn.Linear(obs_dim + act_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden)]
        self.net = nn.Sequential(*layers, nn.ReLU(), nn.Linear(hidden, 1))
        for layer in self.net[::2]:
            nn.init.orthogonal_(layer.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


# ---- The math
def gradient_penalty(f, x_expert, x_learner, alpha: torch.Tensor, target_norm: float = 0.4):
    """E[(||grad f(x_hat)||_2 - target_norm)^2] at x_hat = alpha*x_expert + (1-alpha)*x_learner
    (alpha: (B, 1))."""
    x_hat = (alpha * x_expert + (1 - alpha) * x_learner).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(x_hat).sum(), x_hat, create_graph=True)
    return (grad.norm(2, dim=-1) - target_norm).pow(2).mean()


def discriminator_loss(f, x_expert, x_learner, alpha, gp_weight=10.0, gp_target=0.4):
    """IPM loss E_expert[f] - E_learner[f] + gp_weight * penalty; returns (loss, ipm term, penalty).
    Minimising it makes f low on expert pairs and high on learner pairs, so -f rewards
    expert-like behaviour."""
    ipm = f(x_expert).mean() - f(x_learner).mean()
    gp = gradient_penalty(f, x_expert, x_learner, alpha, gp_target)
    return ipm + gp_weight * gp, ipm, gp


def disc_learning_rate(lr0: float, k: int) -> float:
    """Harmonic decay of the discriminator's learning rate: lr0 at k = 0 and 1, lr0 / k after."""
    return lr0 / max(1, k)


def relabel_rewards(disc: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The learner's reward under the CURRENT discriminator: -f(s, a) (no gradient into f)."""
    with torch.no_grad():
        return -disc(torch.cat([obs, actions], -1))


def soft_q_target(rewards, dones, next_q, next_log_prob, alpha, gamma, absorbing_reward=None):
    """r + gamma * (1 - d) * (Q'(s', a') - alpha * log pi(a'|s')). With `absorbing_reward`, a
    terminal transition instead enters an absorbing state that earns that reward forever:
    + gamma * d * r_abs / (1 - gamma)."""
    target = rewards + gamma * (1 - dones) * (next_q - alpha * next_log_prob)
    if absorbing_reward is not None:
        target = target + gamma * dones * absorbing_reward / (1 - gamma)
    return target


# ---- SAC
class ReplayBuffer:
    """Circular (s, a, s', terminated) buffer on the device; `with_rewards=False` (the IRL
    learner) stores NO reward."""

    def __init__(self, obs_dim: int, act_dim: int, size: int, device, with_rewards: bool):
        self.size, self.ptr, self.full, self.device = size, 0, False, device
        self.obs = torch.zeros(size, obs_dim, device=device)
        self.next_obs = torch.zeros(size, obs_dim, device=device)
        self.actions = torch.zeros(size, act_dim, device=device)
        self.dones = torch.zeros(size, device=device)
        self.rewards = torch.zeros(size, device=device) if with_rewards else None
        self.fields = ("obs", "next_obs", "actions", "dones")
        self.fields += ("rewards",) if with_rewards else ()

    def __len__(self) -> int:
        return self.size if self.full else self.ptr

    def add(self, obs, action, next_obs, done: bool, reward: Optional[float] = None) -> None:
        i = self.ptr
        self.obs[i] = torch.as_tensor(obs, device=self.device)
        self.next_obs[i] = torch.as_tensor(next_obs, device=self.device)
        self.actions[i] = torch.as_tensor(action, device=self.device)
        self.dones[i] = float(done)
        if self.rewards is not None:
            self.rewards[i] = float(reward)
        self.ptr = (i + 1) % self.size
        self.full = self.full or self.ptr == 0

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(len(self), (batch_size,), device=self.device)
        out = (self.obs[idx], self.actions[idx], self.next_obs[idx], self.dones[idx])
        return out + ((self.rewards[idx],) if self.rewards is not None else ())

    def state_dict(self) -> dict:
        # copies: torch.save of a view writes its whole storage
        copy = {k: getattr(self, k)[: len(self)].to("cpu", copy=True) for k in self.fields}
        return {"ptr": self.ptr, "full": self.full, **copy}

    def load_state_dict(self, state: dict) -> None:
        self.ptr, self.full = state["ptr"], state["full"]
        for k in self.fields:
            getattr(self, k)[: len(state[k])] = state[k].to(self.device)


def buffer_rows(cfg: SACArgs, budget: int, ckpt: Optional[dict]) -> int:
    """Replay rows to allocate: the phase's budget (capped by --sac.buffer-size), or what a
    checkpoint holds."""
    return min(cfg.buffer_size, max(budget, len(ckpt["rb"]["obs"]) if ckpt else 0))


class SAC:
    """CleanRL's SAC (sac_continuous_action.py), twin Q as one batched module; updates return
    tensors (no sync)."""

    PARTS = ("actor", "qf", "qf_target", "q_optimizer", "actor_optimizer", "alpha_optimizer")

    def __init__(self, info: EnvInfo, cfg: SACArgs, device: torch.device):
        self.cfg = cfg
        obs_dim, act_dim = info.obs_dim, info.act_dim
        self.actor = Actor(obs_dim, act_dim, info.low, info.high, cfg.hidden_dim).to(device)
        self.qf = TwinQ(obs_dim, act_dim, cfg.hidden_dim).to(device)
        self.qf_target = TwinQ(obs_dim, act_dim, cfg.hidden_dim).to(device)
        self.qf_target.load_state_dict(self.qf.state_dict())
        self.qf_target.requires_grad_(False)
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=cfg.q_lr, fused=True)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), cfg.policy_lr, fused=True)
        self.target_entropy = -float(act_dim)
        self.log_alpha = torch.full((1,), math.log(cfg.alpha), device=device)
        self.log_alpha.requires_grad_(cfg.autotune)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.q_lr, fused=True)
        maybe_compile = torch.compile if cfg.compile else (lambda fn: fn)
        self.update_critic = maybe_compile(self._update_critic)
        self.update_actor = maybe_compile(self._update_actor)

    def _update_critic(self, obs, actions, next_obs, dones, rewards, absorbing: bool):
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_log_prob, _ = self.actor.get_action(next_obs)
            next_q = self.qf_target(next_obs, next_actions).min(0).values
            r_abs = rewards.min() if absorbing else None
            gamma = self.cfg.gamma
            target = soft_q_target(rewards, dones, next_q, next_log_prob, alpha, gamma, r_abs)
        q = self.qf(obs, actions)
        qf_loss = (q - target).pow(2).mean(1).sum()  # qf1_loss + qf2_loss, as CleanRL
        self.q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.q_optimizer.step()
        return qf_loss, q.detach().mean(1)

    def _update_actor(self, obs):
        alpha = self.log_alpha.detach().exp()
        actions, log_prob, _ = self.actor.get_action(obs)
        self.qf.requires_grad_(False)  # gradients through the critic to the actions only
        actor_loss = (alpha * log_prob - self.qf(obs, actions).min(0).values).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        self.qf.requires_grad_(True)
        alpha_loss = torch.zeros(())
        if self.cfg.autotune:
            alpha_loss = (-self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
        return actor_loss, alpha_loss

    def update_target(self) -> None:
        with torch.no_grad():
            for target, source in zip(self.qf_target.parameters(), self.qf.parameters()):
                target.lerp_(source, self.cfg.tau)

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.log_alpha.device)[None]
            sample, _, mean = self.actor.get_action(x)
        return (mean if deterministic else sample)[0].cpu().numpy()

    def state_dict(self) -> dict:
        state = {k: getattr(self, k).state_dict() for k in self.PARTS}
        return {**state, "log_alpha": self.log_alpha.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        for k in self.PARTS:
            getattr(self, k).load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


def sac_train_step(agent: SAC, rb: ReplayBuffer, step: int, reward_fn=None, absorbing=False):
    """One SAC step: a critic update on a sampled batch (rewards from the buffer, or for the IRL
    learner from `reward_fn(obs, actions)`), delayed actor/alpha updates, target lerp. Returns
    the loss tensors (not synced)."""
    cfg = agent.cfg
    batch = rb.sample(cfg.batch_size)
    obs, actions, next_obs, dones = batch[:4]
    rewards = batch[4] if reward_fn is None else reward_fn(obs, actions)
    qf_loss, q_mean = agent.update_critic(obs, actions, next_obs, dones, rewards, absorbing)
    out = {"qf_loss": qf_loss, "qf1_values": q_mean[0], "qf2_values": q_mean[1]}
    out["rewards"] = rewards.mean()
    if step % cfg.policy_frequency == 0:
        for _ in range(cfg.policy_frequency):  # same batch each time, as CleanRL
            out["actor_loss"], out["alpha_loss"] = agent.update_actor(obs)
    if step % cfg.target_network_frequency == 0:
        agent.update_target()
    return out


# ---- Progress, signals and logging
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
    if not sys.stderr.isatty():
        return LogLines(total, initial, desc)
    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, mininterval=2)


class UsageError(Exception):
    """Bad input: main prints the one-line message and exits 2."""


class NonFiniteLoss(Exception):
    """A loss became NaN or infinite: main prints the phase and step and exits 3."""


class Interrupted(Exception):
    """SIGINT/SIGTERM: the phase saved its checkpoint; main exits 130."""


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


def pick_device(args: Args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


class SPSMeter:
    """Steps per second after warm-up (from the first update on), with the time spent in evaluation excluded."""

    t0, s0, paused_s = None, 0, 0.0

    def start(self, step: int) -> None:
        if self.t0 is None:
            self.t0, self.s0 = time.perf_counter(), step

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        yield
        self.paused_s += time.perf_counter() - t

    def sps(self, step: int) -> Optional[float]:
        if self.t0 is not None and step > self.s0:
            return (step - self.s0) / max(1e-9, time.perf_counter() - self.t0 - self.paused_s)


def check_finite(losses: dict, phase: str, step: int) -> dict[str, float]:
    """The losses as floats; NonFiniteLoss (exit 3) on NaN or inf instead of training on it."""
    values = {k: float(v.detach()) for k, v in losses.items()}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise NonFiniteLoss(f"{phase}: non-finite {', '.join(bad)} at step {step}")
    return values


def log_losses(writer, phase: str, losses: dict, agent: SAC, step: int, sps, disc_env_steps=0):
    """The expert's losses under expert/*; the learner's under CleanRL's tags, its relabelled
    reward under irl/."""
    values = check_finite(losses, phase, step)
    values["alpha"] = float(agent.log_alpha.detach().exp())
    if phase == "expert":
        tags = {f"expert/{k}": v for k, v in values.items()} | {"expert/SPS": sps}
    else:
        rename = {"rewards": "irl/relabelled_reward"}
        tags = {rename.get(k, f"losses/{k}"): v for k, v in values.items()}
        tags["charts/learning_rate"] = agent.cfg.policy_lr
        tags["irl/total_env_steps"] = step + disc_env_steps
        tags["charts/SPS"] = sps
    for tag, value in tags.items():
        if value is not None:  # no SPS before the first update
            writer.add_scalar(tag, value, step)


# ---- Phases
def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, p_tremble: float, video=None):
    """Deterministic episodes with the trembling hand of training (as the reference);
    `video`: a path to record the first one to."""
    returns, frames = [], []
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        env = make_env(env_id, seed, render=video is not None and i == 0)
        low, high = env.action_space.low, env.action_space.high
        obs, _ = env.reset(seed=seed + i)
        ret, done = 0.0, False
        while not done:
            check_stop()
            action = tremble(actor.act(obs[None])[0], rng, p_tremble, low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            ret, done = ret + float(reward), terminated or truncated
            if env.render_mode:
                frames.append(env.render())
        returns.append(ret)
        env.close()
    if video is not None:
        write_video(video, frames, fps=env.metadata.get("render_fps", 30))
    return returns


def train_expert(args: Args, info: EnvInfo, ckpt, run_dir: Path, writer) -> tuple[SAC, list, Optional[list], int]:
    """Expert phase: CleanRL SAC on the TRUE reward for `expert.timesteps`, resumable from
    checkpoints/expert.pt. Every `expert.eval_every` steps the actor plays `expert.eval_episodes`
    deterministic episodes (the same reset seeds each time) and the best one is kept, as the
    reference records its demos with SB3's EvalCallback best_model; once the best reaches
    `expert.target_return` (if set) training stops there. Returns the agent (its actor the best
    evaluated one), its curve [(step, episodic return)], [best mean, its step] and the steps trained."""
    env, device = make_env(args.env_id, args.seed), pick_device(args)
    agent = SAC(info, args.sac, device)
    best = copy.deepcopy(agent.actor)  # the best evaluated actor so far
    every, total, target = args.expert.eval_every, args.expert.timesteps, args.expert.target_return
    np_rng = np.random.default_rng(args.seed)
    expert_env = LearnerEnv(env, {}, 0.0, 0.0, np_rng)  # no expert states, no trembling: the env
    rows = buffer_rows(args.sac, args.expert.timesteps, ckpt)
    rb = ReplayBuffer(info.obs_dim, info.act_dim, rows, device, with_rewards=True)
    progress = {"step": 0, "episodes": 0, "curve": [], "evaluated": 0, "best": None}
    if ckpt:
        progress = restore_checkpoint(ckpt, "expert phase", np_rng, [env], agent=agent, rb=rb, best=best)
    obs, ret, length = start_or_continue(expert_env, progress, args.seed, ckpt, np_rng, [env])
    where = (run_dir / "checkpoints" / "expert.pt", "expert_checkpoint", np_rng, [env], progress)
    step, meter = progress["step"], SPSMeter()

    def checkpoint() -> None:  # everything, every RNG, and the episode in progress
        save_checkpoint(*where, agent=agent, rb=rb, best=best, episode=expert_env.episode(obs, ret, length))

    def evaluate_expert() -> None:  # at a multiple of `every` not evaluated yet (a stop inside: again on resume)
        if not (every and step % every == 0 and progress["evaluated"] < step):
            return
        with meter.paused():  # the same reset seeds every time: one yardstick for all evaluations
            returns = evaluate(agent.actor, args.env_id, args.expert.eval_episodes, args.seed + 50_000, 0.0)
        mean = float(np.mean(returns))
        writer.add_scalar("expert/eval_return", mean, step)
        if progress["best"] is None or mean > progress["best"][0]:
            progress["best"] = [mean, step]
            best.load_state_dict(agent.actor.state_dict())
        progress["evaluated"] = step

    stop = saved_on_stop("expert phase", progress, checkpoint)
    with progress_bar(total, step, "expert SAC") as bar, stop:
        while step < total:
            if STOP.is_set():
                checkpoint()
                raise Interrupted("expert phase", step)
            evaluate_expert()
            if target is not None and progress["best"] is not None and progress["best"][0] >= target:
                break  # good enough: its demos now, not after the remaining steps
            explore = step < args.sac.learning_starts  # uniform random actions first
            action = info.random_action(np_rng) if explore else agent.act(obs)
            _, next_obs, reward, terminated, truncated = expert_env.step(action)
            rb.add(obs, action, next_obs, terminated, reward)
            ret, length, obs = ret + float(reward), length + 1, next_obs
            if terminated or truncated:
                writer.add_scalar("expert/episodic_return", ret, step)
                writer.add_scalar("expert/episodic_length", length, step)
                bar.set_postfix(ret=f"{ret:.0f}")
                progress["episodes"] += 1
                progress["curve"].append((step, ret))
                obs, ret, length = expert_env.reset(), 0.0, 0
            progress["step"] = step = step + 1
            if step > args.sac.learning_starts:
                meter.start(step - 1)
                losses = sac_train_step(agent, rb, step)
                if step % args.log_frequency == 0:
                    log_losses(writer, "expert", losses, agent, step, meter.sps(step))
            if step % args.checkpoint_every == 0:
                checkpoint()
                plot_curves(run_dir, args, [], float("nan"), progress["curve"])
            bar.update(1)
        evaluate_expert()  # the last step's
    checkpoint()
    env.close()
    if progress["best"] is not None:
        agent.actor.load_state_dict(best.state_dict())
    return agent, progress["curve"], progress["best"], step


def collect_demos(agent, env_id: str, num_demos: int) -> dict[str, np.ndarray]:
    """Roll out `num_demos` deterministic complete episodes with reset seeds 0, 1, 2, ...,
    recording the MuJoCo state (qpos, qvel, qacc_warmstart) BEFORE each step (the demos.npz
    format of docs/filter_irl_mujoco.md)."""
    env = make_env(env_id, 0)
    low, high = env.action_space.low, env.action_space.high
    keys = ("observations", "actions", "next_observations", "rewards", "terminals", "timeouts")
    keys += ("episode_ids", "episode_starts", "timesteps", *STATE_KEYS)
    rec: dict[str, list] = {k: [] for k in keys}
    returns, data = [], env.unwrapped.data
    for ep in range(num_demos):
        obs, _ = env.reset(seed=ep)
        t, ret, done = 0, 0.0, False
        while not done:
            check_stop()
            state = (data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy())
            action = np.clip(agent.act(obs, deterministic=True), low, high)
            next_obs, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
            row = (obs, action, next_obs, reward, terminated, truncated, ep, t == 0, t, *state)
            for k, v in zip(rec, row):
                rec[k].append(v)
            obs, t, ret, done = next_obs, t + 1, ret + float(reward), terminated or truncated
        returns.append(ret)
    env.close()
    demos = {k: np.asarray(v, dtype=DEMO_FORMAT[k][0]) for k, v in rec.items()}
    demos["returns"] = np.asarray(returns, np.float64)
    demos["seeds"] = np.arange(num_demos, dtype=np.int64)
    demos["env_id"] = np.array(env_id)
    return demos


def collect_learner_pairs(agent: SAC, env: LearnerEnv, num_traj: int) -> tuple[np.ndarray, int]:
    """Fresh complete trajectories of the current (stochastic) policy: their (s, a) pairs and
    env steps."""
    pairs = []
    for _ in range(num_traj):
        obs, done = env.reset(), False
        while not done:
            check_stop()
            action, next_obs, _, terminated, truncated = env.step(agent.act(obs))
            pairs.append(np.concatenate([obs, action]).astype(np.float32))
            obs, done = next_obs, terminated or truncated
    return np.stack(pairs), len(pairs)


def update_discriminator(disc, expert_pairs, learner_pairs, k: int, cfg: DiscArgs) -> dict:
    """Outer iteration k: a FRESH Adam at lr0 / max(1, k) (the reference re-creates its OAdam
    each iteration, so no optimiser state carries over), then `steps` steps on `batch_size`
    expert vs learner pairs drawn with replacement."""
    lr = disc_learning_rate(cfg.lr, k)
    optimizer = torch.optim.Adam(disc.parameters(), lr=lr, betas=(0.9, 0.999))
    device, n = expert_pairs.device, cfg.batch_size
    for _ in range(cfg.steps):
        check_stop()  # (the caller undoes the whole outer iteration)
        xe = expert_pairs[torch.randint(len(expert_pairs), (n,), device=device)]
        xl = learner_pairs[torch.randint(len(learner_pairs), (n,), device=device)]
        alpha = torch.rand(n, 1, device=device)
        loss, ipm, gp = discriminator_loss(disc, xe, xl, alpha, cfg.gp_weight, cfg.gp_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    losses = {"disc_loss": loss, "ipm": ipm, "gradient_penalty": gp}
    return {**check_finite(losses, "discriminator", k), "disc_learning_rate": lr}


def outer_iteration(agent, disc, env: LearnerEnv, expert_pairs, progress: dict, cfg: DiscArgs):
    """Outer iteration k = progress["k"]: a discriminator update on fresh learner trajectories vs
    the expert's pairs; counts their env steps in `progress` and returns the stats to log."""
    k = progress["k"]
    pairs, n = collect_learner_pairs(agent, env, cfg.trajectories)
    progress["disc_env_steps"] += n
    pairs = torch.as_tensor(pairs, device=expert_pairs.device)
    stats = update_discriminator(disc, expert_pairs, pairs, k, cfg)
    progress["k"] = k + 1
    return {**stats, "outer_iteration": k, "disc_env_steps": progress["disc_env_steps"]}


def evaluate_learner(agent: SAC, args: Args, progress: dict, expert_return: float, writer) -> dict:
    """Evaluate the learner, append the result to progress["history"] and log it."""
    seed, episodes = args.seed + 10_000, args.eval.episodes
    rets = evaluate(agent.actor, args.env_id, episodes, seed, args.irl.p_tremble)
    mean, step = float(np.mean(rets)), progress["step"]
    total = step + progress["disc_env_steps"]
    normalized = float(mean / expert_return) if expert_return != 0 else float("nan")
    entry = dict(policy_steps=step, total_env_steps=total, mean=mean, std=float(np.std(rets)))
    entry.update(normalized=normalized, returns=rets)
    progress["history"].append(entry)
    writer.add_scalar("eval/episodic_return", mean, step)
    writer.add_scalar("eval/normalized_return", normalized, step)
    writer.add_scalar("eval/episodic_return_vs_total_env_steps", mean, total)
    return entry


def evaluate_during_training(agent, args, progress, expert_return, writer, run_dir, expert_curve, bar, meter) -> float:
    """The periodic evaluation (its time is not training time) and the plot; returns the normalized return."""
    with meter.paused():
        entry = evaluate_learner(agent, args, progress, expert_return, writer)
        plot_curves(run_dir, args, progress["history"], expert_return, expert_curve)
    progress["next_eval"] += args.eval.frequency
    bar.write(f"step {progress['step']}: eval return {entry['mean']:.1f} ({entry['normalized']:.2f} of expert)")
    return entry["normalized"]


def log_episode(writer, bar, from_expert: bool, ret: float, length: int, step: int) -> None:
    """A finished learner episode's true return; one started from an expert state is partial, logged apart."""
    if from_expert:
        writer.add_scalar("irl/reset_episodic_return", ret, step)
    else:
        writer.add_scalar("charts/episodic_return", ret, step)
        writer.add_scalar("charts/episodic_length", length, step)
        bar.set_postfix(ret=f"{ret:.0f}")


def train_irl(args, info, demos, ckpt, run_dir, writer, expert_curve=(), env_fn=make_env):
    """IRL phase: outer iterations of one discriminator update, then `train_every` SAC steps on
    rewards relabelled by the current discriminator -> (agent, progress). `env_fn`: tests."""
    envs = [env_fn(args.env_id, args.seed), env_fn(args.env_id, args.seed + 1)]
    np_rng, cfg = np.random.default_rng(args.seed), args.irl
    learner_env = LearnerEnv(envs[0], demos, cfg.reset_prob, cfg.p_tremble, np_rng)
    disc_reset_prob = cfg.reset_prob if args.disc.reset else 0.0
    disc_env = LearnerEnv(envs[1], demos, disc_reset_prob, cfg.p_tremble, np_rng)
    envs[1].reset(seed=args.seed + 1)  # seeds the discriminator env's RNG; resets continue it
    device = pick_device(args)
    agent = SAC(info, args.sac, device)
    disc = Discriminator(info.obs_dim, info.act_dim, args.sac.hidden_dim).to(device)
    expert_pairs = np.concatenate([demos["observations"], demos["actions"]], 1)
    expert_pairs = torch.as_tensor(expert_pairs, device=device)
    expert_return = float(np.mean(demos["returns"]))
    rows = buffer_rows(args.sac, cfg.total_timesteps, ckpt)
    rb = ReplayBuffer(info.obs_dim, info.act_dim, rows, device, with_rewards=False)
    progress = dict(step=0, disc_env_steps=0, k=0, episodes=0, history=[])
    progress["next_eval"] = args.eval.frequency
    if ckpt:
        progress = restore_checkpoint(ckpt, "IRL phase", np_rng, envs, agent=agent, rb=rb, disc=disc)
    where = (run_dir / "checkpoints" / "irl.pt", "irl_checkpoint", np_rng, envs, progress)
    reward_fn = partial(relabel_rewards, disc)  # a batch's rewards: -f(s, a) under the current f
    obs, ret, length = start_or_continue(learner_env, progress, args.seed, ckpt, np_rng, envs)
    step, meter = progress["step"], SPSMeter()

    def checkpoint() -> None:  # everything, every RNG, and the episode in progress
        save_checkpoint(*where, agent=agent, rb=rb, disc=disc, episode=learner_env.episode(obs, ret, length))

    desc = f"IRL (reset {cfg.reset_prob})"
    stop = partial(saved_on_stop, "IRL phase", progress, checkpoint)
    evaluation = (agent, args, progress, expert_return, writer, run_dir, expert_curve)
    with progress_bar(cfg.total_timesteps, step, desc) as bar, stop():
        done = False
        if step >= progress["next_eval"]:  # a signal stopped this step's evaluation: it comes first
            with undone_on_stop(progress, np_rng, envs):  # (the policy samples: torch's RNG moves)
                done = evaluate_during_training(*evaluation, bar, meter) >= (cfg.stop_at_normalized or math.inf)
        while step < cfg.total_timesteps and not done:
            if STOP.is_set():
                checkpoint()
                raise Interrupted("IRL phase", step)
            if step % cfg.train_every == 0 and progress["k"] <= step // cfg.train_every:
                with undone_on_stop(progress, np_rng, envs, disc):  # a stopped one is redone whole on resume
                    stats = outer_iteration(agent, disc, disc_env, expert_pairs, progress, args.disc)
                for name, value in stats.items():
                    writer.add_scalar(f"irl/{name}", value, step)
            explore = step < args.sac.learning_starts  # uniform random actions first
            action = info.random_action(np_rng) if explore else agent.act(obs)
            action, next_obs, env_reward, terminated, truncated = learner_env.step(action)
            rb.add(obs, action, next_obs, terminated)  # no reward: the discriminator gives it
            ret, length, obs = ret + float(env_reward), length + 1, next_obs  # logged only
            if terminated or truncated:
                log_episode(writer, bar, learner_env.from_expert, ret, length, step)
                progress["episodes"] += 1
                obs, ret, length = learner_env.reset(), 0.0, 0
            progress["step"] = step = step + 1
            if step > args.sac.learning_starts:
                meter.start(step - 1)
                losses = sac_train_step(agent, rb, step, reward_fn, cfg.terminal_reward == "min")
                if step % args.log_frequency == 0:
                    sps, disc_steps = meter.sps(step), progress["disc_env_steps"]
                    log_losses(writer, "IRL learner", losses, agent, step, sps, disc_steps)
            if step >= progress["next_eval"]:
                with undone_on_stop(progress, np_rng, envs):  # (the policy samples: torch's RNG moves)
                    normalized = evaluate_during_training(*evaluation, bar, meter)
                if cfg.stop_at_normalized is not None and normalized >= cfg.stop_at_normalized:
                    break
            if step % args.checkpoint_every == 0:
                checkpoint()
            bar.update(1)
    if not progress["history"] or progress["history"][-1]["policy_steps"] != progress["step"]:
        with stop(), undone_on_stop(progress, np_rng, envs):
            evaluate_learner(agent, args, progress, expert_return, writer)
    progress["SPS"] = meter.sps(progress["step"])
    plot_curves(run_dir, args, progress["history"], expert_return, expert_curve)
    checkpoint()
    for env in envs:
        env.close()
    return agent, progress


def save_policy(path: Path, actor: Actor, args: Args, info: EnvInfo) -> None:
    config = dict(obs_dim=info.obs_dim, act_dim=info.act_dim, hidden=args.sac.hidden_dim)
    config.update(low=info.low.tolist(), high=info.high.tolist())
    state = {k: v.cpu() for k, v in actor.state_dict().items()}
    saved = {"script": SCRIPT, "env_id": args.env_id, "network": "Actor", "config": config}
    save(path, "policy", **saved, state_dict=state)


def irl_results(args: Args, demos: dict, progress: dict) -> dict:
    """results.json: the final evaluation, budget and env-step counts, SPS, evaluation history."""
    final, history, steps = progress["history"][-1], progress["history"], progress["step"]
    disc_steps, irl = progress["disc_env_steps"], args.irl
    method = "FILTER" if irl.reset_prob > 0 else "MM"
    results = dict(env_id=args.env_id, method=method, seed=args.seed, reset_prob=irl.reset_prob)
    results.update(p_tremble=irl.p_tremble, eval_episodes=args.eval.episodes, final_eval=final)
    results.update(eval_mean=final["mean"], eval_std=final["std"], eval_returns=final["returns"])
    expert_return = float(np.mean(demos["returns"]))
    results.update(normalized_return=final["normalized"], expert_return=expert_return)
    results.update(best_eval_mean=max(h["mean"] for h in history), num_demos=len(demos["returns"]))
    results.update(policy_env_steps=steps, disc_env_steps=disc_steps, outer_iterations=progress["k"])
    results.update(total_env_steps=steps + disc_steps, SPS=progress["SPS"], history=history)
    return results


def run_pipeline(args: Args, run_dir: Path, info: EnvInfo, demos, checkpoints: dict, writer):
    """Expert phase (unless demos were given or cached), IRL phase, policy.pt, results.json."""
    expert_curve = []
    if demos is None and "expert_actor" in checkpoints:  # --expert.actor: a trained expert records the demos
        saved = checkpoints["expert_actor"]
        expert = SAC(info, dataclasses.replace(args.sac, hidden_dim=saved["hidden"]), pick_device(args))
        expert.actor.load_state_dict(saved["actor"])
        best, steps = saved.get("chosen_by_evaluation"), saved["total_timesteps"]  # (None: a file without it)
        print(f"expert: recording the demos with {args.expert.actor} ({steps:,} SAC steps)")
    elif demos is None:  # train the expert on the true reward; its best actor records the demos
        expert, expert_curve, best, steps = train_expert(args, info, checkpoints.get("expert"), run_dir, writer)
    if demos is None:
        with saved_on_stop("expert demo collection", {"step": 0}):  # (the expert's checkpoint is saved)
            demos = collect_demos(expert, args.env_id, args.expert.num_demos or 64)
        demos = write_expert_cache(args, expert, demos, best, steps)
    if args.expert.only:
        return
    ckpt = checkpoints.get("irl")
    agent, progress = train_irl(args, info, demos, ckpt, run_dir, writer, expert_curve)
    results = irl_results(args, demos, progress)
    if args.save_model:
        save_policy(run_dir / "policy.pt", agent.actor, args, info)
    if args.capture_video:
        video = run_dir / "videos" / "final.webm"
        evaluate(agent.actor, args.env_id, 1, args.seed + 10_000, args.irl.p_tremble, video)
    save(run_dir / "results.json", "results", **results)
    mean, std, normalized = results["eval_mean"], results["eval_std"], results["normalized_return"]
    print(f"final eval return {mean:.1f} +- {std:.1f} ({normalized:.2f} of expert)")


# ---- run management ----
# Everything below is plumbing a reader of the algorithm can skip: the command line and exit codes,
# saving and loading, plots, video, the expert cache, validation.
MINARI_PREFIX = "minari:"
RETIRED_FLAGS = {  # an old spelling (or a sibling's) -> the flag its one-line hint names (docs/CONTRACT.md)
    "--threads": "--torch-threads",
    "--checkpoint-frequency": "--checkpoint-every",
    "--expert.expert-path": "--expert.path",
}


def main(argv: Optional[list[str] | Args] = None) -> None:
    """Parse (or take) and validate everything, run the pipeline; one exit code per outcome."""
    try:
        args = argv if isinstance(argv, Args) else parse_args(argv)
        if args.eval_only:
            return evaluate_saved_policy(args)
        run_dir, info, demos, checkpoints = validate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except Interrupted:  # only --eval-only gets here: its evaluation file is written whole or not at all
        print(
            "interrupted during --eval-only: no evaluation written; the same command starts it again", file=sys.stderr
        )
        raise SystemExit(130)
    if info is None:
        print(f"{run_dir} already holds a finished run (results.json); nothing to do")
        return
    writer = start_run(args, run_dir)
    try:
        run_pipeline(args, run_dir, info, demos, checkpoints, writer)
    except NonFiniteLoss as e:
        finish_run(run_dir, writer, f"error: {e}; lower the learning rates or check the demos")
        raise SystemExit(3)
    except Interrupted as e:
        phase, step = e.args
        where = f"in the {phase} at step {step}" if phase else "while recording the final video"
        saved = f"interrupted {where}: checkpoint saved"
        finish_run(run_dir, writer, f"{saved}; resume with: {resume_command(run_dir, argv)}")
        raise SystemExit(130)
    finish_run(run_dir, writer)


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


# ---- the one save and the one load, checkpoints and RNG state
VERSION = 1  # of the .pt files `save` writes; `load` refuses any other
KINDS = {  # kind of .pt file: (the keys load requires, how to fix a bad one)
    "policy": (("script", "env_id", "network", "config", "state_dict"), "re-run the training to rewrite it"),
    "expert_checkpoint": (("agent", "rb", "best", "progress", "rng"), "delete it to redo that phase"),
    "irl_checkpoint": (("agent", "rb", "progress", "rng", "disc"), "delete it to redo that phase"),
    "expert_actor": (
        ("actor", "env_id", "obs_dim", "act_dim", "hidden", "total_timesteps"),
        "pass the expert_actor.pt of an expert cache",
    ),
}


def save(path: Path, kind: str, **payload) -> None:
    """Atomic write: the fixed `name.tmp` beside `path`, then os.replace (start_run removes stale ones). A .pt file
    holds {"kind", "version", **payload} for `load` to check; .json (plain records), .npz (the demos format shared
    with hype_irl_mujoco.py) and .png (payload `figure`) hold the payload alone."""
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
        torch.save({"kind": kind, "version": VERSION, **payload}, tmp)
    os.replace(tmp, path)


def load(path: Path, kind: str) -> dict:
    """Read back a file `save` wrote, checked: a JSON object, or a .pt file of this kind and VERSION with its keys.
    Anything else (truncated, random bytes, another script's file) is a one-line UsageError naming the file."""
    keys, fix = KINDS.get(kind, ((), "delete it (or the run dir) and re-run"))
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, random bytes, not a file we wrote
        raise UsageError(f"{path} is unreadable ({type(e).__name__}); {fix}")
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a {kind} record; {fix}")
    stored = (kind, VERSION) if path.suffix == ".json" else (data.get("kind"), data.get("version"))
    if stored != (kind, VERSION) or any(k not in data for k in keys):
        raise UsageError(f"{path} is not a {SCRIPT} file of kind {kind!r}, version {VERSION}; {fix}")
    return data


def rng_states(np_rng, envs: list) -> dict:
    rng = {"python": random.getstate(), "numpy": np_rng.bit_generator.state, "torch": torch.get_rng_state()}
    rng["cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    rng["envs"] = [env.unwrapped.np_random.bit_generator.state for env in envs]
    return rng


def set_rng_states(rng: dict, np_rng, envs: list) -> None:
    random.setstate(rng["python"])
    np_rng.bit_generator.state = rng["numpy"]
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    for env, state in zip(envs, rng["envs"]):
        env.unwrapped.np_random.bit_generator.state = state


def save_checkpoint(path: Path, kind: str, np_rng, envs: list, progress: dict, episode=None, **parts) -> None:
    """save() of the parts' state dicts (agent, replay, discriminator), the progress counters (with the episode in
    progress, when given) and every RNG."""
    states = {name: part.state_dict() for name, part in parts.items()}
    progress = {**progress, "episode": episode} if episode is not None else progress
    save(path, kind, **states, progress=progress, rng=rng_states(np_rng, envs))


def restore_checkpoint(ckpt: dict, phase: str, np_rng, envs: list, **parts) -> dict:
    """Load a validated checkpoint into the phase's parts and RNGs and say where the phase resumes; returns its
    progress counters."""
    for name, part in parts.items():
        part.load_state_dict(ckpt[name])
    set_rng_states(ckpt["rng"], np_rng, envs)
    progress = dict(ckpt["progress"])
    iteration = f" (outer iteration {progress['k']})" if "k" in progress else ""
    print(f"{phase}: resuming at step {progress['step']}{iteration}", file=sys.stderr)
    return progress


@contextlib.contextmanager
def undone_on_stop(progress: dict, np_rng, envs: list, *parts):
    """A signal inside the block puts the parts, the counters and every RNG back as they were when it started, so
    the checkpoint the phase then saves redoes the whole block on resume, exactly."""
    rng, counters = rng_states(np_rng, envs), copy.deepcopy(progress)
    states = [copy.deepcopy(part.state_dict()) for part in parts]
    try:
        yield
    except Interrupted:
        set_rng_states(rng, np_rng, envs)
        progress.update(counters)
        for part, state in zip(parts, states):
            part.load_state_dict(state)
        raise


# ---- plots, video, the saved policy (docs/CONTRACT.md) and its evaluation
def plot_curves(run_dir: Path, args: Args, history: list, expert_return: float, expert_curve=()) -> None:
    """run_dir/learning_curve.png: the expert phase (training returns, or the cached demos' mean) and the IRL phase
    (deterministic evaluations vs policy and vs all env steps, the latest marked) in separate panels."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, nothing to close

    fig = Figure(figsize=(11, 4), dpi=90)
    ax_e, ax_i = fig.subplots(1, 2)
    if len(expert_curve):
        ax_e.plot(*zip(*expert_curve), lw=0.8, label="SAC on the true reward (episodes)")
    if math.isfinite(expert_return):
        ax_e.axhline(expert_return, color="k", ls=":", label="demos' mean return")
    ax_e.set(title="expert phase", xlabel="env steps", ylabel="true return")
    if history:
        steps, means = [h["policy_steps"] for h in history], [h["mean"] for h in history]
        ax_i.plot(steps, means, marker="o", label="learner (policy env steps)")
        ax_i.plot([h["total_env_steps"] for h in history], means, ls="--", alpha=0.6, label="incl. discriminator steps")
        ax_i.plot(steps[-1:], means[-1:], marker="*", ms=14, color="C3", ls="", label=f"latest: {means[-1]:.0f}")
        ax_i.axhline(expert_return, color="k", ls=":", label="expert demos")
    ax_i.set(title="IRL phase: deterministic evaluation", xlabel="env steps", ylabel="true return")
    for ax in (ax_e, ax_i):
        ax.legend(fontsize=8) if ax.get_legend_handles_labels()[0] else None
    method = "FILTER" if args.irl.reset_prob > 0 else "MM"
    fig.suptitle(f"{args.env_id}: {method} (reset {args.irl.reset_prob}), seed {args.seed}")
    fig.tight_layout()
    save(run_dir / "learning_curve.png", "plot", figure=fig)


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
    """policy.pt -> the Actor in eval mode, with `.act(obs)` (deterministic actions), `.env_id`."""
    saved = load(Path(path), "policy")
    config = saved["config"]
    low, high = np.array(config["low"]), np.array(config["high"])
    actor = Actor(config["obs_dim"], config["act_dim"], low, high, config["hidden"])
    actor.load_state_dict(saved["state_dict"])
    actor.env_id, actor.script = saved["env_id"], saved["script"]
    return actor.to(device).eval()


def make_policy_envs(policy: Actor, num_envs: int) -> gym.vector.VectorEnv:
    """The envs the policy was trained on, made as in training (the registered MuJoCo env with
    its TimeLimit)."""
    return gym.vector.SyncVectorEnv([lambda: gym.make(policy.env_id) for _ in range(num_envs)])


def evaluate_saved_policy(args: Args) -> None:
    """--eval-only RUN_DIR: evaluate RUN_DIR/policy.pt, write RUN_DIR/evaluations/eval_NNN.json (never overwritten)."""
    run_dir = Path(args.eval_only)
    path = run_dir / "policy.pt"
    if not path.is_file():
        raise UsageError(f"{path} does not exist; pass the run dir of a finished run (with policy.pt) to --eval-only")
    check_args(args)
    try:
        policy = load_policy(path)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # a policy.pt of other networks
        raise UsageError(f"{path} is not a readable policy.pt ({type(e).__name__}); re-run the training to rewrite it")
    if policy.script != SCRIPT:
        raise UsageError(f"{path} was written by {policy.script}; evaluate it with that script")
    if args.capture_video:
        check_rendering(policy.env_id)
    check_writable(run_dir / "evaluations", "--eval-only")
    number = 1 + max([int(p.stem[5:]) for p in run_dir.glob("evaluations/eval_[0-9][0-9][0-9].json")], default=0)
    out, seed = run_dir / "evaluations" / f"eval_{number:03d}.json", args.seed + 20_000
    video = run_dir / "videos" / f"eval_{number:03d}.webm" if args.capture_video else None
    answer_signals()  # a signal stops the episodes (or the video) within a step: nothing is written
    print(f"evaluating {path}: {args.eval.episodes} episodes", flush=True)
    rets = evaluate(policy, policy.env_id, args.eval.episodes, seed, args.irl.p_tremble, video)
    record = dict(env_id=policy.env_id, mean=float(np.mean(rets)), std=float(np.std(rets)), returns=rets)
    record.update(episodes=args.eval.episodes, seed=seed, p_tremble=args.irl.p_tremble)
    save(out, "evaluation", **record)
    print(f"eval return {record['mean']:.1f} +- {record['std']:.1f} over {len(rets)} episodes -> {out}")


# ---- expert data: the shared cache, user files and Minari datasets
def write_expert_cache(args: Args, agent: SAC, demos: dict, best: Optional[list], steps: int) -> dict:
    """Write demos.npz, expert_actor.pt and expert_meta.json (with the evaluation that chose the actor, [mean,
    step], or None for the last actor, and the SAC steps trained); a cache another run finished first is kept."""
    cache = Path(args.expert.experts_dir) / args.env_id
    if (cache / "demos.npz").exists():  # another run (or hype_irl_mujoco.py) finished first: never overwrite
        print(f"expert: {cache}/demos.npz appeared meanwhile; using it", file=sys.stderr)
        with np.load(cache / "demos.npz") as z:
            return {k: z[k] for k in z.files}
    save(cache / "demos.npz", "demos", **demos)
    returns = demos["returns"]
    actor = {"actor": {k: v.cpu() for k, v in agent.actor.state_dict().items()}, "env_id": args.env_id}
    hidden = agent.actor.fc1.out_features  # a saved expert's (--expert.actor) may differ from --sac.hidden-dim
    actor.update(obs_dim=demos["observations"].shape[1], act_dim=demos["actions"].shape[1], hidden=hidden)
    actor.update(total_timesteps=steps, mean_return=float(returns.mean()), chosen_by_evaluation=best)
    save(cache / "expert_actor.pt", "expert_actor", **actor)
    meta = dict(env_id=args.env_id, expert_timesteps=steps, num_demos=len(returns), seed=args.seed)
    meta.update(return_mean=float(returns.mean()), return_std=float(returns.std()), script=SCRIPT)
    chosen = dict(eval_every=args.expert.eval_every, eval_episodes=args.expert.eval_episodes)
    chosen.update(target_return=args.expert.target_return)
    if args.expert.actor:  # not trained here: how it was chosen is in the meta of the cache it came from
        chosen = dict.fromkeys(chosen)
    meta.update(chosen_by_evaluation=best, **chosen, recorded_by_actor=args.expert.actor)
    meta["date"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    save(cache / "expert_meta.json", "expert_meta", **meta)
    print(f"expert: {len(returns)} demos, return {meta['return_mean']:.1f} +- {meta['return_std']:.1f}")
    return demos


def check_expert_actor(path: Path, env_id: str, info: EnvInfo) -> dict:
    """The --expert.actor file, loaded and checked against the env: one UsageError naming the mismatch."""
    if not path.is_file():
        raise UsageError(f"--expert.actor {path} does not exist; pass the expert_actor.pt of an expert cache")
    saved = load(path, "expert_actor")
    if saved["env_id"] != env_id:
        raise UsageError(f"{path} holds an expert of {saved['env_id']}, not {env_id}; pass a matching --expert.actor")
    if (saved["obs_dim"], saved["act_dim"]) != (info.obs_dim, info.act_dim):
        raise UsageError(f"{path} has the sizes of another version of {env_id}; pass a matching --expert.actor")
    try:
        Actor(info.obs_dim, info.act_dim, info.low, info.high, saved["hidden"]).load_state_dict(saved["actor"])
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UsageError(f"{path} holds no actor of its stated sizes ({type(e).__name__}); pass another file")
    return saved


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
    columns = {  # key: its per-episode parts
        "observations": [ep.observations[:-1] for ep in episodes],
        "next_observations": [ep.observations[1:] for ep in episodes],
        "actions": [ep.actions for ep in episodes],
        "rewards": [ep.rewards for ep in episodes],
        "terminals": [ep.terminations for ep in episodes],
        "timeouts": [ep.truncations for ep in episodes],
        "episode_ids": [np.full(n, i) for i, n in enumerate(lengths)],
        "episode_starts": [np.arange(n) == 0 for n in lengths],
        "timesteps": [np.arange(n) for n in lengths],
    }
    demos = {k: np.concatenate(parts or [np.zeros(0)]).astype(DEMO_FORMAT[k][0]) for k, parts in columns.items()}
    demos["returns"] = np.array([float(np.sum(ep.rewards)) for ep in episodes], np.float64)
    demos["env_id"] = np.array(spec.id if spec is not None else "")
    for k in ("observations", "next_observations", "actions"):  # (0,) from an empty dataset: keep 2-d for the checks
        demos[k] = demos[k].reshape(len(demos["rewards"]), -1)
    return demos


def load_demos(path, env_id: str, sizes: dict, reset_prob: float) -> dict[str, np.ndarray]:
    """Load a demos.npz or a minari:ID dataset and check every key against the format and the env (`sizes`: obs,
    act, nq, nv); every failure is a one-line UsageError naming the file and the key."""
    if str(path).startswith(MINARI_PREFIX):
        demos = minari_demos(str(path)[len(MINARI_PREFIX) :])
    else:
        try:
            with np.load(path, allow_pickle=False) as z:
                demos = {k: z[k] for k in z.files}
        except Exception as e:  # corrupt, truncated or not an npz
            raise UsageError(f"cannot read expert data {path} ({type(e).__name__}); delete it or pass another file")
    missing = [k for k in list(DEMO_FORMAT) + ["env_id"] if k not in demos and k not in OPTIONAL_DEMO_KEYS]
    if missing:
        raise UsageError(f"{path} lacks keys {', '.join(missing)}; see the expert-data format in docs/{SCRIPT[:-3]}.md")
    if demos["env_id"].shape != () or demos["env_id"].dtype.kind != "U":
        raise UsageError(f"{path}: key env_id must be a 0-d string array naming the env")
    if str(demos["env_id"]) != env_id:
        raise UsageError(f"{path} holds demos of {demos['env_id']} (key env_id), not {env_id}; pass matching demos")
    check_demo_arrays(demos, path, sizes)
    ids, n = demos["episode_ids"], len(demos["observations"])
    first, last = np.r_[True, ids[1:] != ids[:-1]], np.r_[ids[1:] != ids[:-1], True]
    counts = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))  # 0, 1, ... in each episode
    demos.setdefault("timesteps", counts)  # derivable from episode_starts
    inside = ~last[:-1]
    continues = np.allclose(demos["next_observations"][:-1][inside], demos["observations"][1:][inside], 1e-5, 1e-6)
    sums = np.bincount(ids, weights=demos["rewards"].astype(np.float64), minlength=len(demos["returns"]))
    ordered = np.all(ids[1:] >= ids[:-1]) and np.array_equal(np.unique(ids), np.arange(len(demos["returns"])))
    rules = [  # key, holds, what it must be
        ("episode_ids", ordered, "must number the episodes 0..E-1 in order (E = len(returns))"),
        ("episode_starts", np.array_equal(demos["episode_starts"].astype(bool), first), "disagrees with episode_ids"),
        ("timesteps", np.array_equal(demos["timesteps"], counts), "must count 0, 1, ... inside each episode"),
        ("next_observations", continues, "must equal the next transition's observation inside an episode"),
        (
            "terminals",
            not np.any(demos["terminals"].astype(bool) & ~last),
            "marks a step that does not end its episode",
        ),
        ("returns", np.allclose(sums, demos["returns"], rtol=1e-4, atol=1e-2), "must be the episodes' reward sums"),
    ]
    for key, holds, message in rules:
        if not holds:
            raise UsageError(f"{path}: key {key} {message}")
    if reset_prob > 0 and any(k not in demos for k in STATE_KEYS):
        raise UsageError(
            f"{path} has no qpos/qvel/qacc_warmstart, so expert resets are impossible; pass --irl.reset-prob 0"
        )
    return demos


def check_demo_arrays(demos: dict, path, sizes: dict) -> None:
    """Dtype kind, shape and finiteness of every demos key (N transitions, E episodes, the env's widths)."""
    per_step = [demos[k] for k, (_, shape) in DEMO_FORMAT.items() if k in demos and shape[0] == "N"]
    lengths = [len(a) if a.ndim else -1 for a in per_step]
    n = max(set(lengths), key=lengths.count)  # the length most keys agree on: the odd key out is named
    ids = demos["episode_ids"]
    episodes = len(np.unique(ids)) if ids.ndim == 1 and ids.dtype.kind in "iu" else len(demos["returns"])
    if n < 1 or episodes < 1:
        raise UsageError(f"{path} holds no complete expert episode; record at least one episode")
    dims, kinds = {"N": n, "E": episodes, **sizes}, {np.float32: "fiu", np.float64: "fiu", np.int64: "iu", bool: "biu"}
    for key, (dtype, shape) in DEMO_FORMAT.items():
        if key not in demos:
            continue
        a, expected = demos[key], tuple(dims[d] for d in shape)
        not_binary = a.dtype.kind in "iu" and dtype is bool and not np.isin(a, (0, 1)).all()
        if a.dtype.kind not in kinds[dtype] or not_binary:
            raise UsageError(f"{path}: key {key} has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if a.shape != expected:
            raise UsageError(f"{path}: key {key} has shape {a.shape}, expected {expected} for {sizes['env']}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UsageError(f"{path}: key {key} holds NaN or infinite values")


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
    paths["--expert.actor"] = args.expert.actor
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
        if interval is None and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise UsageError(f"{flag} has no range (a bug in {SCRIPT}: declare it with ranged())")
        if interval and value is not None:
            lo, hi = (float(x) for x in interval[1:-1].split(","))
            above = lo < value if interval[0] == "(" else lo <= value
            if not (above and (value < hi if interval[-1] == ")" else value <= hi)):
                raise UsageError(f"{flag} must lie in {interval}, not {value}")
    if not args.exp_name or "/" in args.exp_name:
        raise UsageError("--exp-name must be a non-empty name without '/'")
    check_paths(args)
    if not args.expert.only and args.sac.learning_starts >= args.irl.total_timesteps:
        raise UsageError("--sac.learning-starts must be below --irl.total-timesteps, or the learner never learns")
    if args.expert.target_return is not None and args.expert.eval_every == 0:
        raise UsageError("--expert.target-return needs evaluations: set --expert.eval-every above 0")
    if args.track and importlib.util.find_spec("wandb") is None:
        raise UsageError("--track needs wandb: pip install wandb (or drop --track)")
    if args.capture_video and importlib.util.find_spec("cv2") is None:
        raise UsageError("--capture-video needs opencv-python: pip install opencv-python")


def check_env_id(env_id: str) -> tuple[EnvInfo, dict]:
    """A MuJoCo v5 env id (other families, retired versions, near misses get a suggestion) -> the env's sizes."""
    if env_id.startswith("ALE/") or "NoFrameskip" in env_id:
        raise UsageError(f"{env_id} is an Atari env; this script takes MuJoCo envs such as Hopper-v5 (--env-id)")
    mujoco_ids = [k for k, s in gym.registry.items() if "mujoco" in str(s.entry_point)]
    current = [k for k in mujoco_ids if k.endswith("-v5")]
    if env_id not in gym.registry:
        lower = {k.lower(): k for k in current}
        close = difflib.get_close_matches(env_id.lower(), list(lower), n=3, cutoff=0.6)
        guess = ", ".join(lower[c] for c in close) or "Hopper-v5"
        raise UsageError(f"unknown env id {env_id!r}; did you mean {guess}? (--env-id)")
    if env_id not in mujoco_ids:
        raise UsageError(f"{env_id} is not a MuJoCo env; pass a MuJoCo v5 env such as Hopper-v5 (--env-id)")
    if env_id not in current:
        newer = env_id.rsplit("-v", 1)[0] + "-v5"
        raise UsageError(f"{env_id} is a retired version; use {newer if newer in current else 'a -v5 env'} (--env-id)")
    try:
        env = gym.make(env_id)
    except Exception as e:  # e.g. a broken MuJoCo install
        raise UsageError(f"cannot create {env_id} ({type(e).__name__}: {e}); check the gymnasium[mujoco] install")
    space, model = env.action_space, env.unwrapped.model
    info = EnvInfo(env.observation_space.shape[0], space.shape[0], space.low, space.high)
    env.close()
    return info, {"obs": info.obs_dim, "act": info.act_dim, "nq": model.nq, "nv": model.nv, "env": env_id}


def check_rendering(env_id: str) -> None:
    """--capture-video: MuJoCo must be able to render off-screen (EGL unless MUJOCO_GL says otherwise)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        env = gym.make(env_id, render_mode="rgb_array", width=VIDEO_SIZE, height=VIDEO_SIZE)
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as e:
        raise UsageError(f"--capture-video: MuJoCo cannot render here ({type(e).__name__}); set MUJOCO_GL=egl/osmesa")


def check_writable(path: Path, flag_name: str) -> None:
    """The nearest existing ancestor must be a directory we can create something in (nothing is left behind)."""
    parent = next((p for p in (path, *path.parents) if p.exists()), path)
    try:  # a file there raises NotADirectoryError
        tempfile.TemporaryDirectory(dir=parent).cleanup()
    except OSError:
        raise UsageError(f"{flag_name} {path} is not writable here; pass a path you can write")


def load_checkpoint(path: Path, args: Args, info: EnvInfo, kind: str) -> Optional[dict]:
    """A phase's checkpoint, loaded and checked against this run's networks; None when there is none."""
    if not path.exists():
        return None
    ckpt, why = load(path, kind), ""
    try:
        SAC(info, args.sac, torch.device("cpu")).load_state_dict(ckpt["agent"])
        if kind == "irl_checkpoint":
            Discriminator(info.obs_dim, info.act_dim, args.sac.hidden_dim).load_state_dict(ckpt["disc"])
        rb, step = ckpt["rb"], ckpt["progress"]["step"]
        widths = (rb["obs"].shape[1], rb["next_obs"].shape[1], rb["actions"].shape[1])
        rows = {len(rb[k]) for k in ("obs", "next_obs", "actions", "dones")}
        fits = widths == (info.obs_dim, info.obs_dim, info.act_dim) and len(rows) == 1
        fits = fits and isinstance(step, int) and len(ckpt["rng"]["envs"]) > 0
    except Exception as e:  # another configuration's networks, or a structure that is not ours
        fits, why = False, f" ({type(e).__name__})"
    if not fits:
        raise UsageError(f"{path} is corrupt or from another configuration{why}; delete it to redo that phase")
    return ckpt


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
        other = saved.get("script") or "another script"
        raise UsageError(f"{args.run_dir} is a run dir of {other}, not {SCRIPT}; pass another --run-dir")
    default = tyro_cli(as_argv(saved["args"]), None, f"{saved_path} holds settings this script cannot read")
    args = tyro_cli(argv, default)
    if args.env_id != saved.get("env_id"):
        other = f"holds a {saved.get('env_id')} run, not {args.env_id}"
        raise UsageError(f"run dir {args.run_dir} {other}; pass another --run-dir")
    return args


def validate(args: Args) -> tuple[Path, Optional[EnvInfo], Optional[dict], dict]:
    """Check every input before anything is written; return the run dir and what was loaded: the env's sizes (None:
    the run is finished), the demos (None: the expert phase makes them) and the phases' checkpoints."""
    check_args(args)
    info, sizes = check_env_id(args.env_id)
    row_bytes = 4 * (2 * info.obs_dim + info.act_dim + 2)
    rows = min(args.sac.buffer_size, max(args.expert.timesteps, args.irl.total_timesteps))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else float("inf")
    if rows * row_bytes > memory / 2:
        need = f"a replay buffer of {rows} rows needs {rows * row_bytes / 2**30:.1f} GiB"
        raise UsageError(f"{need}, over half this machine's memory; lower --sac.buffer-size")
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
    demos = load_demos(path, args.env_id, sizes, 0 if args.expert.only else args.irl.reset_prob) if path else None
    if demos is not None and args.expert.num_demos not in (None, len(demos["returns"])):  # never a silent mismatch
        n, flag = len(demos["returns"]), f"--expert.num-demos {args.expert.num_demos}"
        raise UsageError(
            f"{path} holds {n} expert episodes, not {flag}: pass another --expert.experts-dir or drop the flag"
        )
    checkpoints = {}
    if args.expert.actor and args.expert.path:
        raise UsageError("--expert.actor records demos and --expert.path gives them: drop one of the two")
    if args.expert.actor and demos is None:  # (loaded here: `checkpoints` holds everything the pipeline reads)
        checkpoints["expert_actor"] = check_expert_actor(Path(args.expert.actor), args.env_id, info)
    if demos is None:
        check_writable(cache.parent, "--expert.experts-dir")
    if demos is None and not args.expert.actor:  # (with a cache, as every expert flag, --expert.actor is unused)
        if args.sac.learning_starts >= args.expert.timesteps:
            raise UsageError("--sac.learning-starts must be below --expert.timesteps, or the expert never learns")
        checkpoints["expert"] = load_checkpoint(run_dir / "checkpoints" / "expert.pt", args, info, "expert_checkpoint")
    if not args.expert.only:
        checkpoints["irl"] = load_checkpoint(run_dir / "checkpoints" / "irl.pt", args, info, "irl_checkpoint")
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
def start_run(args: Args, run_dir: Path):
    """Seeds, threads, args.json, TensorBoard (and wandb), signal handlers; returns the SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    # glibc keeps freed memory instead of re-faulting fresh pages for every update's tensors (up to 16 % of a SAC
    # update on the 2-core VM, see the docs' speed section); no glibc (macOS, musl): nothing to tune
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MB (glibc's maximum) come from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not give the heap's top back while less than 1 GB is free
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*run_dir.rglob("*.tmp"), *run_dir.rglob("*.tmp.webm")]:  # left by a killed write
        stale.unlink()
    save(run_dir / "args.json", "args", script=SCRIPT, env_id=args.env_id, args=dataclasses.asdict(args))
    if args.track:
        import wandb

        names = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_dir.name)
        wandb.init(**names, sync_tensorboard=True, config=dataclasses.asdict(args), save_code=True)
    writer = SummaryWriter(str(run_dir))
    rows = [f"|{name}|{value}|" for name, value, _ in flat_fields(args)]
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(rows))
    answer_signals()
    print(f"run directory: {run_dir}")
    return writer


def answer_signals() -> None:
    """SIGINT/SIGTERM set STOP; the loops notice it within a step (training saves its checkpoint first)."""
    STOP.clear()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: STOP.set())


def finish_run(run_dir: Path, writer, message: Optional[str] = None) -> None:
    writer.close()
    if message:
        print(message, file=sys.stderr)
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
