"""FILTER: inverse reinforcement learning with resets to expert states, on MuJoCo (single file).

Moment-matching inverse RL alternates a discriminator f(s, a), trained as an integral-probability-metric
(Wasserstein-style) critic with a gradient penalty, and a SAC learner trained on the reward -f(s, a).
FILTER starts half of the learner's episodes from uniformly chosen states of the expert's demonstrations
(exact MuJoCo state restore, remaining horizon), so the policy step needs no global exploration;
``--reset-prob 0`` is the plain moment-matching (MM) baseline.

Paper: Gokul Swamy, Sanjiban Choudhury, J. Andrew Bagnell, Zhiwei Steven Wu (2023), "Inverse Reinforcement
Learning without Reinforcement Learning", ICML 2023 (arXiv 2303.14623).
Defaults follow the official code (gkswamy98/fast_irl) and its MuJoCo re-implementation in jren03/garage
(discriminator 256-256, IPM loss + 10 x gradient penalty toward norm 0.4, 4,096 vs 4,096 pairs from 4 fresh
learner trajectories, one step per outer iteration at lr 8e-4 / k, reset probability 0.5, trembling hand 0.01).
Deliberate differences (see docs/filter_irl_mujoco.md): the SAC learner follows CleanRL's
``sac_continuous_action.py`` and runs continuously across outer iterations (the reference restarts SB3's
``learn()`` and its LR schedule every iteration); resets restore qpos/qvel/qacc_warmstart exactly instead of
replaying expert actions from the reset seed; discriminator samples come from the true start distribution
(``--disc-reset`` to include resets); the discriminator step happens at the START of each outer iteration;
terminal transitions enter an absorbing state that earns the batch's worst relabelled reward (``--terminal-reward``);
and the env steps spent collecting discriminator samples are counted and reported.

Usage:
    python filter_irl_mujoco.py --env-id Hopper-v5                      # expert phase (cached), then FILTER
    python filter_irl_mujoco.py --env-id Hopper-v5 --reset-prob 0       # MM baseline on the same demos
    # quick (minutes on a laptop CPU): a tiny expert, a short IRL run
    python filter_irl_mujoco.py --env-id InvertedPendulum-v5 --expert-timesteps 10000 --total-timesteps 10000 \
        --train-every 1000 --eval-frequency 2000
    python filter_irl_mujoco.py --run-dir runs/X                          # resume an interrupted run
    python filter_irl_mujoco.py --env-id Hopper-v5 --expert-only          # only build experts/Hopper-v5/
    python filter_irl_mujoco.py --env-id Hopper-v5 --eval-only runs/X     # evaluate a run's saved actor

Run directory: ``args.json``, TensorBoard events (expert phase under ``expert/*``; IRL under ``charts/*``,
``losses/*``, ``irl/*``, ``eval/*``), ``checkpoints/{expert,irl}.pt`` (model, optimisers, discriminator, replay
buffer, RNG states, counters), ``actor.pt``, ``results.json`` (final evaluation, budget, env-step counts, SPS,
curve) and ``learning_curve.png``.

Expert data format
------------------
Cache: ``--experts-dir`` (default ``experts/``), files under ``{experts_dir}/{env_id}/``: ``demos.npz``,
``expert_actor.pt`` (``{"actor": state_dict, "obs_dim", "act_dim", "hidden": 256, "env_id", "total_timesteps",
"mean_return"}``: MLP obs->256->256 ReLU -> mean and log_std heads, tanh squash, action = tanh(mean)*scale+bias)
and ``expert_meta.json`` (env_id, expert_timesteps, num_demos, return_mean, return_std, seed, date, script), all
written atomically. If ``demos.npz`` exists it is reused (shapes validated); otherwise a SAC expert is trained on
the true reward (``--expert-timesteps``) and ``--num-demos`` deterministic complete episodes are rolled out with
reset seeds 0, 1, 2, ... (any length kept). ``demos.npz`` keys (N transitions, E episodes):
``observations`` f32 (N, obs_dim); ``actions`` f32 (N, act_dim), clipped to the bounds; ``next_observations``
f32 (N, obs_dim); ``rewards`` f32 (N,) true reward, stored for reference and NEVER used for learning;
``terminals`` bool (N,) (env ``terminated``); ``timeouts`` bool (N,) (env ``truncated``); ``episode_ids`` i64 (N,)
in 0..E-1; ``episode_starts`` bool (N,); ``timesteps`` i64 (N,) index inside the episode; ``returns`` f64 (E,);
``seeds`` i64 (E,); ``qpos`` f64 (N, nq), ``qvel`` f64 (N, nv), ``qacc_warmstart`` f64 (N, nv): the MuJoCo state
BEFORE the transition, so restoring it (plus ``mj_forward``) and replaying ``actions[i]`` reproduces
``next_observations[i]`` exactly; ``env_id`` 0-d str array. Optional keys: qpos, qvel, qacc_warmstart, seeds,
timesteps (without the first three, ``--reset-prob`` must be 0).
``--expert-path minari:DATASET_ID`` reads a downloaded Minari dataset (``minari download DATASET_ID``) into the same
keys: observations/next_observations from each episode's T+1 observations, terminals/timeouts from its
terminations/truncations, returns from its rewards; Minari stores no MuJoCo state, so it serves MM and HyPE only.
"""


import ctypes
import dataclasses
import datetime as dt
import difflib
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

SUPPORTED_ENVS = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5")
REQUIRED_DEMO_KEYS = (
    "observations", "actions", "next_observations", "rewards", "terminals", "timeouts",
    "episode_ids", "episode_starts", "returns", "env_id",
)  # fmt: skip
STATE_KEYS = ("qpos", "qvel", "qacc_warmstart")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be enabled when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (when installed)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """unused here (kept for CleanRL compatibility); evaluation returns are logged instead"""
    save_model: bool = True
    """save the final learner actor to `{run_dir}/actor.pt`"""
    run_dir: Optional[str] = None
    """run directory (default runs/{env_id}__{exp_name}__{seed}__{unix_time}); an existing one is resumed"""

    # Environment
    env_id: str = "Hopper-v5"
    """MuJoCo env id: Hopper/Walker2d/HalfCheetah/Ant/Humanoid-v5 (exact resets checked on all five; learning
    runs only on Hopper-v5 and InvertedPendulum-v5)"""
    p_tremble: float = 0.01
    """trembling hand: probability of replacing the learner's action by a uniform one (training and evaluation)"""

    # Expert phase (SAC on the true reward) and demonstrations
    experts_dir: str = "experts"
    """cache of experts and demos, keyed by env id: {experts_dir}/{env_id}/demos.npz"""
    expert_path: Optional[str] = None
    """use this demos.npz instead of the cache (see "Expert data format"), or a local Minari dataset:
    minari:DATASET_ID (e.g. minari:mujoco/hopper/expert-v0; needs `pip install "minari[hdf5]"`; no MuJoCo states,
    so --reset-prob 0 only)"""
    expert_timesteps: int = 1_000_000
    """env steps of SAC expert training when no demos exist"""
    num_demos: int = 64
    """number of deterministic expert episodes to record (reset seeds 0, 1, 2, ...)"""
    expert_only: bool = False
    """stop after the expert phase (builds the cache that hype_irl_mujoco.py also reads)"""

    # SAC (learner and expert), CleanRL defaults
    total_timesteps: int = 1_000_000
    """learner env steps in the IRL phase (discriminator-collection steps are counted separately)"""
    buffer_size: int = 1_000_000
    """replay memory size"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """batch size of the SAC updates"""
    learning_starts: int = 5000
    """env steps with uniform random actions before SAC updates start (each phase)"""
    policy_lr: float = 3e-4
    """learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """learning rate of the Q network optimizer"""
    policy_frequency: int = 2
    """the policy is updated `policy_frequency` times every `policy_frequency` steps (delayed, as TD3)"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks"""
    alpha: float = 0.2
    """entropy coefficient (initial value when autotuned)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""
    hidden_dim: int = 256
    """width of the two hidden layers of actor, critics and discriminator"""
    torch_threads: Annotated[int, tyro.conf.arg(aliases=("--threads",))] = 0
    """torch CPU threads (0 = torch's default: all cores, or OMP_NUM_THREADS), as in the other scripts (`--threads`
    is an alias). On a quiet 2-core CPU 2 threads ran the expert phase at 98 SPS vs 67 with 1; on a CPU shared with
    other jobs use 1 (2 threads were ~40x slower there)"""

    # Discriminator (IPM + gradient penalty)
    disc_lr: float = 8e-4
    """discriminator lr0; outer iteration k uses lr0 / max(1, k) with a fresh optimizer"""
    train_every: int = 5000
    """learner env steps per outer iteration (one discriminator update at its start)"""
    disc_steps: int = 1
    """discriminator gradient steps per outer iteration"""
    disc_batch_size: int = 4096
    """expert and learner (s, a) pairs per discriminator step"""
    disc_trajectories: int = 4
    """fresh learner trajectories collected for each discriminator update (their env steps are counted)"""
    gp_weight: float = 10.0
    """weight of the gradient penalty"""
    gp_target: float = 0.4
    """target gradient norm of the penalty"""
    disc_reset: bool = False
    """also reset the discriminator's learner trajectories to expert states (garage does; FILTER's intent is not)"""
    terminal_reward: Literal["min", "none"] = "min"
    """'min': a terminal transition enters an absorbing state earning the batch's lowest relabelled reward forever;
    'none': the episode just ends (reference behaviour)"""

    # FILTER resets
    reset_prob: float = 0.5
    """probability that a learner episode starts from a uniformly chosen expert state (0 = MM baseline)"""

    # Evaluation, logging, checkpoints
    eval_frequency: int = 50_000
    """evaluate every this many learner env steps"""
    eval_episodes: int = 10
    """deterministic evaluation episodes"""
    stop_at_normalized: Optional[float] = None
    """end the IRL phase early once an evaluation reaches this fraction of the expert's mean return (e.g. 0.9)"""
    log_frequency: int = 100
    """log losses and SPS every this many env steps"""
    checkpoint_frequency: int = 25_000
    """write a checkpoint every this many env steps"""
    compile: bool = False
    """torch.compile the SAC update (opt-in)"""
    eval_only: Optional[str] = None
    """evaluate the actor saved in this run dir and print the returns (no training)"""


class UsageError(Exception):
    """A documented bad input: main prints the one-line message and exits 2."""


# ----------------------------------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------------------------------
def check_env_id(env_id: str) -> None:
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        raise UsageError(f"unknown env id {env_id!r}; did you mean {', '.join(close) or 'Hopper-v5'}? (--env-id)")
    env = gym.make(env_id)
    ok = isinstance(env.unwrapped, gym.envs.mujoco.MujocoEnv) and isinstance(env.action_space, gym.spaces.Box)
    env.close()
    if not ok:
        raise UsageError(f"{env_id} is not a continuous-action MuJoCo env; pass e.g. --env-id Hopper-v5")


def make_env(env_id: str, seed: int) -> gym.Env:
    """One gymnasium MuJoCo env (with its registered TimeLimit); `terminated` is stored as done, truncation bootstraps."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    return env


def time_limit(env: gym.Env) -> Optional[gym.wrappers.TimeLimit]:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return env
        env = env.env
    return None


def mujoco_state(env: gym.Env) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data = env.unwrapped.data
    return data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy()


def restore_state(env: gym.Env, qpos: np.ndarray, qvel: np.ndarray, qacc_warmstart: np.ndarray, timestep: int) -> np.ndarray:
    """Exact restore of an expert state on an env that was just reset: qpos, qvel AND the solver warm-start
    (without it contacts drift), then mj_forward; the TimeLimit continues from `timestep` (remaining horizon)."""
    model, data = env.unwrapped.model, env.unwrapped.data
    data.qpos[:] = qpos
    data.qvel[:] = qvel
    data.qacc_warmstart[:] = qacc_warmstart
    if model.na:
        data.act[:] = 0.0
    mujoco.mj_forward(model, data)
    limit = time_limit(env)
    if limit is not None:
        limit._elapsed_steps = int(timestep)
    return env.unwrapped._get_obs()


# ----------------------------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------------------------
class Actor(nn.Module):
    """SAC actor: MLP obs->h->h ReLU, mean and log_std heads, tanh squash to the action bounds (CleanRL layout)."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, hidden: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc_mean = nn.Linear(hidden, act_dim)
        self.fc_logstd = nn.Linear(hidden, act_dim)
        self.register_buffer("action_scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc2(F.relu(self.fc1(x))))
        log_std = torch.tanh(self.fc_logstd(h))
        return self.fc_mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action, its log-probability, deterministic action)."""
        mean, log_std = self(x)
        eps = torch.randn_like(mean)
        y = torch.tanh(mean + log_std.exp() * eps)
        log_prob = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = (log_prob - torch.log(self.action_scale * (1 - y.pow(2)) + 1e-6)).sum(-1)
        return y * self.action_scale + self.action_bias, log_prob, torch.tanh(mean) * self.action_scale + self.action_bias


class BatchedQ(nn.Module):
    """`n` Q-networks (s, a) -> h -> h -> 1 stored as stacked weights and evaluated as ONE batched module
    (2 baddbmm kernels and a multiply-sum instead of 6 Linear calls): the update is latency-bound on small batches."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, n: int = 2):
        super().__init__()
        sizes = [obs_dim + act_dim, hidden, hidden, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init, per member
            self.weights.append(nn.Parameter(torch.empty(n, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, fan_out).uniform_(-bound, bound)))
        self.n = n

    def forward(self, obs: torch.Tensor, act: torch.Tensor, params: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
        """Q-values of shape (n, B). `params` (weights then biases) replaces the module's own, e.g. detached copies."""
        ws, bs = (params[:3], params[3:]) if params is not None else (list(self.weights), list(self.biases))
        h = torch.cat([obs, act], -1).unsqueeze(0).expand(self.n, -1, -1)
        h = F.relu(torch.baddbmm(bs[0], h, ws[0]))
        h = F.relu(torch.baddbmm(bs[1], h, ws[1]))
        # Output width 1: multiply-and-sum instead of a (B, h) x (h, 1) batched matmul, whose backward is an outer
        # product that MKL runs slowly (~8 % of a Q forward + backward on the 2-core CPU).
        return (h * ws[2].transpose(1, 2)).sum(-1) + bs[2].squeeze(-1)

    def param_list(self) -> list[torch.Tensor]:
        return list(self.weights) + list(self.biases)


class Discriminator(nn.Module):
    """f(s, a): MLP 256-256 ReLU -> scalar, orthogonal weights (as the reference). Learner reward is -f."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim + act_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


# ----------------------------------------------------------------------------------------------------------------
# The math, as pure functions
# ----------------------------------------------------------------------------------------------------------------
def gradient_penalty(
    f: Callable[[torch.Tensor], torch.Tensor], x_expert: torch.Tensor, x_learner: torch.Tensor, alpha: torch.Tensor,
    target_norm: float = 0.4,
) -> torch.Tensor:  # fmt: skip
    """E[(||grad f(x_hat)||_2 - target_norm)^2] at x_hat = alpha*x_expert + (1-alpha)*x_learner (alpha: (B, 1))."""
    x_hat = (alpha * x_expert + (1 - alpha) * x_learner).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(x_hat).sum(), x_hat, create_graph=True)
    return (grad.norm(2, dim=-1) - target_norm).pow(2).mean()


def discriminator_loss(
    f: Callable[[torch.Tensor], torch.Tensor], x_expert: torch.Tensor, x_learner: torch.Tensor, alpha: torch.Tensor,
    gp_weight: float = 10.0, gp_target: float = 0.4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """IPM loss E_expert[f] - E_learner[f] + gp_weight * penalty; returns (loss, ipm term, penalty).
    Minimising it makes f low on expert pairs and high on learner pairs, so -f rewards expert-like behaviour."""
    ipm = f(x_expert).mean() - f(x_learner).mean()
    gp = gradient_penalty(f, x_expert, x_learner, alpha, gp_target)
    return ipm + gp_weight * gp, ipm, gp


def disc_learning_rate(lr0: float, k: int) -> float:
    """Harmonic decay of the discriminator's learning rate: lr0 at k = 0 and k = 1, lr0 / k after."""
    return lr0 / max(1, k)


def relabel_rewards(disc: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The learner's reward under the CURRENT discriminator: -f(s, a) (no gradient into f)."""
    with torch.no_grad():
        return -disc(torch.cat([obs, actions], -1))


def soft_q_target(
    rewards: torch.Tensor, dones: torch.Tensor, next_q: torch.Tensor, next_log_prob: torch.Tensor, alpha: torch.Tensor,
    gamma: float, absorbing_reward: Optional[torch.Tensor] = None,
) -> torch.Tensor:  # fmt: skip
    """r + gamma * (1 - d) * (Q'(s', a') - alpha * log pi(a'|s')). With `absorbing_reward`, a terminal
    transition instead enters an absorbing state that earns that reward forever: + gamma * d * r_abs / (1 - gamma)."""
    target = rewards + gamma * (1 - dones) * (next_q - alpha * next_log_prob)
    if absorbing_reward is not None:
        target = target + gamma * dones * absorbing_reward / (1 - gamma)
    return target


def sample_start(rng: np.random.Generator, reset_prob: float, num_states: int) -> int:
    """Index of the expert state an episode starts from, or -1 for the env's own initial-state distribution."""
    if num_states > 0 and rng.random() < reset_prob:
        return int(rng.integers(num_states))
    return -1


def tremble(action: np.ndarray, rng: np.random.Generator, p: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Trembling hand: with probability p the whole action is replaced by a uniform random one."""
    if p > 0 and rng.random() < p:
        return rng.uniform(low, high).astype(action.dtype)
    return action


def normalized_return(ret: float, expert_return: float) -> float:
    """Return as a fraction of the expert's mean demo return (the reference's plots use the raw ratio)."""
    return float(ret / expert_return) if expert_return != 0 else float("nan")


# ----------------------------------------------------------------------------------------------------------------
# Replay buffer and SAC
# ----------------------------------------------------------------------------------------------------------------
class ReplayBuffer:
    """Circular buffer of (s, a, s', terminated) on the device. `with_rewards=False` (the IRL learner) has NO
    reward storage at all: the learner's rewards can only come from relabelling with the discriminator."""

    def __init__(self, obs_dim: int, act_dim: int, size: int, device: torch.device, with_rewards: bool):
        self.size, self.ptr, self.full, self.device = size, 0, False, device
        self.obs = torch.zeros(size, obs_dim, device=device)
        self.next_obs = torch.zeros(size, obs_dim, device=device)
        self.actions = torch.zeros(size, act_dim, device=device)
        self.dones = torch.zeros(size, device=device)
        if with_rewards:
            self.rewards = torch.zeros(size, device=device)

    def __len__(self) -> int:
        return self.size if self.full else self.ptr

    def add(self, obs, action, next_obs, done: bool, reward: Optional[float] = None) -> None:
        i = self.ptr
        self.obs[i] = torch.as_tensor(obs, device=self.device)
        self.next_obs[i] = torch.as_tensor(next_obs, device=self.device)
        self.actions[i] = torch.as_tensor(action, device=self.device)
        self.dones[i] = float(done)
        if hasattr(self, "rewards"):
            self.rewards[i] = float(reward)
        self.ptr = (i + 1) % self.size
        self.full = self.full or self.ptr == 0

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(len(self), (batch_size,), device=self.device)
        out = (self.obs[idx], self.actions[idx], self.next_obs[idx], self.dones[idx])
        return out + ((self.rewards[idx],) if hasattr(self, "rewards") else ())

    def state_dict(self) -> dict:
        n = len(self)
        fields = ("obs", "next_obs", "actions", "dones") + (("rewards",) if hasattr(self, "rewards") else ())
        return {"ptr": self.ptr, "full": self.full, **{k: getattr(self, k)[:n].cpu().clone() for k in fields}}

    def load_state_dict(self, state: dict) -> None:
        self.ptr, self.full = state["ptr"], state["full"]
        for k in ("obs", "next_obs", "actions", "dones", "rewards"):
            if k in state and hasattr(self, k):
                getattr(self, k)[: len(state[k])] = state[k].to(self.device)


class SAC:
    """Soft actor-critic (CleanRL's sac_continuous_action.py): twin Q as one batched module, target nets updated
    by one fused lerp, automatic entropy tuning, fused Adam. `update` returns loss tensors (no host sync)."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, args: Args, device: torch.device):
        self.gamma, self.tau, self.autotune = args.gamma, args.tau, args.autotune
        self.actor = Actor(obs_dim, act_dim, low, high, args.hidden_dim).to(device)
        self.qf = BatchedQ(obs_dim, act_dim, args.hidden_dim).to(device)
        self.qf_target = BatchedQ(obs_dim, act_dim, args.hidden_dim).to(device)
        self.qf_target.load_state_dict(self.qf.state_dict())
        self.qf_target.requires_grad_(False)
        fused = {"fused": True}
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=args.q_lr, **fused)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=args.policy_lr, **fused)
        self.target_entropy = -float(act_dim)
        self.log_alpha = torch.full((1,), math.log(args.alpha), device=device, requires_grad=args.autotune)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=args.q_lr, **fused)
        self.update_critic = torch.compile(self._update_critic) if args.compile else self._update_critic
        self.update_actor = torch.compile(self._update_actor) if args.compile else self._update_actor

    def _update_critic(self, obs, actions, next_obs, dones, rewards, absorbing: bool) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_log_prob, _ = self.actor.get_action(next_obs)
            next_q = self.qf_target(next_obs, next_actions).min(0).values
            r_abs = rewards.min() if absorbing else None
            target = soft_q_target(rewards, dones, next_q, next_log_prob, alpha, self.gamma, r_abs)
        q = self.qf(obs, actions)
        qf_loss = (q - target).pow(2).mean(1).sum()  # qf1_loss + qf2_loss, as CleanRL
        self.q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.q_optimizer.step()
        return qf_loss, q.detach().mean(1)

    def _update_actor(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.log_alpha.detach().exp()
        actions, log_prob, _ = self.actor.get_action(obs)
        frozen = [p.detach() for p in self.qf.param_list()]  # no weight gradients through the critic
        actor_loss = (alpha * log_prob - self.qf(obs, actions, frozen).min(0).values).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        alpha_loss = torch.zeros(())
        if self.autotune:
            alpha_loss = (-self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
        return actor_loss, alpha_loss

    def update_target(self) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(self.qf_target.param_list(), self.qf.param_list(), self.tau)

    def act(self, obs: np.ndarray, device: torch.device, deterministic: bool = False) -> np.ndarray:
        with torch.no_grad():
            sample, _, mean = self.actor.get_action(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
        return (mean if deterministic else sample)[0].cpu().numpy()

    def state_dict(self) -> dict:
        return {
            "actor": self.actor.state_dict(), "qf": self.qf.state_dict(), "qf_target": self.qf_target.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(), "q_optimizer": self.q_optimizer.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(), "alpha_optimizer": self.alpha_optimizer.state_dict(),
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        for k in ("actor", "qf", "qf_target", "q_optimizer", "actor_optimizer", "alpha_optimizer"):
            getattr(self, k).load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


def sac_train_step(
    agent: SAC, rb: ReplayBuffer, step: int, args: Args, reward_fn: Optional[Callable] = None
) -> dict[str, torch.Tensor]:
    """One SAC step: critic update on a sampled batch (rewards from the buffer, or from `reward_fn(obs, actions)`
    for the IRL learner), delayed actor/alpha updates, target lerp. Returns loss tensors (not synced)."""
    batch = rb.sample(args.batch_size)
    obs, actions, next_obs, dones = batch[:4]
    rewards = batch[4] if reward_fn is None else reward_fn(obs, actions)
    absorbing = reward_fn is not None and args.terminal_reward == "min"
    qf_loss, q_mean = agent.update_critic(obs, actions, next_obs, dones, rewards, absorbing)
    out = {"qf_loss": qf_loss, "qf1_values": q_mean[0], "qf2_values": q_mean[1], "rewards": rewards.mean()}
    if step % args.policy_frequency == 0:
        for _ in range(args.policy_frequency):  # same batch each time, as CleanRL
            out["actor_loss"], out["alpha_loss"] = agent.update_actor(obs)
    if step % args.target_network_frequency == 0:
        agent.update_target()
    return out


# ----------------------------------------------------------------------------------------------------------------
# Run-directory plumbing: atomic writes, signals, checkpoints
# ----------------------------------------------------------------------------------------------------------------
class StopFlag:
    """SIGINT/SIGTERM set a flag; the training loops save a checkpoint and exit cleanly at the next step."""

    def __init__(self):
        self.stop = False

    def install(self) -> None:
        def handler(signum, frame):
            self.stop = True

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory instead of handing it back to the OS. By default every large tensor an update
    allocates is freshly mapped and page-faulted again (measured ~8k-20k faults per PPO minibatch, ~80 per SAC step
    on our 2-core VM; up to 16 % of the update time). jemalloc/tcmalloc via LD_PRELOAD do the same job."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl): nothing to tune
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MB (glibc's maximum) come from the heap
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not give the heap's top back while less than 1 GB is free


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def atomic_json(path: Path, obj) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2)))


def atomic_torch_save(path: Path, obj) -> None:
    atomic_write(path, lambda p: torch.save(obj, p))


def rng_state(np_rng: np.random.Generator, envs: list[gym.Env]) -> dict:
    return {
        "python": random.getstate(), "numpy": np_rng.bit_generator.state, "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "envs": [env.unwrapped.np_random.bit_generator.state for env in envs],
    }  # fmt: skip


def set_rng_state(state: dict, np_rng: np.random.Generator, envs: list[gym.Env]) -> None:
    random.setstate(state["python"])
    np_rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for env, s in zip(envs, state["envs"]):
        env.unwrapped.np_random.bit_generator.state = s


def open_checkpoint(
    path: Path, device: torch.device, obs_dim: int, act_dim: int, budget: int, buffer_size: int, with_rewards: bool
) -> tuple[Optional[dict], ReplayBuffer]:
    """A phase's checkpoint (None when starting fresh) and its replay buffer, restored and large enough for the
    saved content (a resumed run may have been given a smaller budget)."""
    ckpt = torch.load(path, map_location=device, weights_only=False) if path.exists() else None
    saved = len(ckpt["rb"]["obs"]) if ckpt else 0
    rb = ReplayBuffer(obs_dim, act_dim, min(buffer_size, max(budget, saved)), device, with_rewards)
    if ckpt:
        rb.load_state_dict(ckpt["rb"])
    return ckpt, rb


def check_finite(losses: dict[str, torch.Tensor], phase: str, step: int) -> dict[str, float]:
    values = {k: float(v.detach()) for k, v in losses.items()}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"{phase}: non-finite {', '.join(bad)} at step {step}; lower the learning rates or check the demos")
    return values


class SPSMeter:
    """Steps per second after warm-up: counted from the first call of `start` (after learning_starts), with the
    time spent in evaluation excluded; not a cumulative average from t = 0."""

    def __init__(self):
        self.t0, self.s0, self.paused = None, 0, 0.0

    def start(self, step: int) -> None:
        if self.t0 is None:
            self.t0, self.s0 = time.perf_counter(), step

    def pause(self, seconds: float) -> None:
        self.paused += seconds

    def sps(self, step: int) -> Optional[float]:
        if self.t0 is None or step <= self.s0:
            return None
        return (step - self.s0) / max(1e-9, time.perf_counter() - self.t0 - self.paused)


# ----------------------------------------------------------------------------------------------------------------
# Expert data: validation, loading, writing
# ----------------------------------------------------------------------------------------------------------------
MINARI_PREFIX = "minari:"


def minari_demos(dataset_id: str) -> dict[str, np.ndarray]:
    """A downloaded Minari dataset in the demos.npz layout (without MuJoCo states); one-line UsageError otherwise."""
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
    cat = lambda xs, dtype: np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)  # noqa: E731
    lengths = [len(ep.rewards) for ep in episodes]
    demos = {
        "observations": cat([ep.observations[:-1] for ep in episodes], np.float32),
        "next_observations": cat([ep.observations[1:] for ep in episodes], np.float32),
        "actions": cat([ep.actions for ep in episodes], np.float32),
        "rewards": cat([ep.rewards for ep in episodes], np.float32),
        "terminals": cat([ep.terminations for ep in episodes], bool),
        "timeouts": cat([ep.truncations for ep in episodes], bool),
        "episode_ids": np.repeat(np.arange(len(episodes), dtype=np.int64), lengths),
        "episode_starts": cat([np.arange(n) == 0 for n in lengths], bool),
        "timesteps": cat([np.arange(n) for n in lengths], np.int64),
        "returns": np.array([float(np.sum(ep.rewards)) for ep in episodes], np.float64),
        "env_id": np.array(spec.id if spec is not None else ""),
    }
    for k in ("observations", "next_observations", "actions"):  # (0,) from an empty dataset: keep 2-d for the checks
        demos[k] = demos[k].reshape(len(demos["rewards"]), -1)
    return demos


def load_demos(path: Path | str, env_id: str, obs_dim: int, act_dim: int, reset_prob: float) -> dict[str, np.ndarray]:
    """Load and validate a demos.npz or a minari:ID dataset (see "Expert data format"); every failure is a one-line
    UsageError."""
    if str(path).startswith(MINARI_PREFIX):
        demos = minari_demos(str(path)[len(MINARI_PREFIX) :])
    else:
        try:
            with np.load(path, allow_pickle=False) as z:
                demos = {k: z[k] for k in z.files}
        except Exception as e:  # corrupt or not an npz
            raise UsageError(f"cannot read expert data {path} ({type(e).__name__}); delete it or pass another --expert-path")
    missing = [k for k in REQUIRED_DEMO_KEYS if k not in demos]
    if missing:
        raise UsageError(f"{path} lacks keys {', '.join(missing)}; see 'Expert data format' in filter_irl_mujoco.py's docstring")
    if str(demos["env_id"]) != env_id:
        raise UsageError(f"{path} holds demos of {demos['env_id']}, not {env_id}; pass matching --env-id or --expert-path")
    o, a = demos["observations"], demos["actions"]
    if o.ndim != 2 or o.shape[1] != obs_dim or demos["next_observations"].shape != o.shape:
        raise UsageError(f"{path}: observation size {o.shape[1:]} does not match {env_id}'s {obs_dim}; pass demos of this env")
    if a.ndim != 2 or a.shape[1] != act_dim or len(a) != len(o):
        raise UsageError(f"{path}: action size {a.shape[1:]} does not match {env_id}'s {act_dim}; pass demos of this env")
    if len(o) == 0 or len(demos["returns"]) < 1:
        raise UsageError(f"{path} holds no complete episode; record at least one episode")
    if "timesteps" not in demos:  # derivable from episode_starts
        starts = np.flatnonzero(demos["episode_starts"])
        idx = np.arange(len(o))
        demos["timesteps"] = idx - starts[np.searchsorted(starts, idx, side="right") - 1]
    if reset_prob > 0 and any(k not in demos for k in STATE_KEYS):
        raise UsageError(f"{path} has no qpos/qvel/qacc_warmstart, so expert resets are impossible; pass --reset-prob 0")
    return demos


def collect_demos(agent: SAC, env_id: str, num_demos: int, device: torch.device) -> dict[str, np.ndarray]:
    """Roll out `num_demos` deterministic complete episodes with reset seeds 0, 1, 2, ... recording the MuJoCo
    state (qpos, qvel, qacc_warmstart) BEFORE each step."""
    env = make_env(env_id, 0)
    low, high = env.action_space.low, env.action_space.high
    rec: dict[str, list] = {k: [] for k in ("observations", "actions", "next_observations", "rewards", "terminals",
                                            "timeouts", "episode_ids", "episode_starts", "timesteps", *STATE_KEYS)}  # fmt: skip
    returns = []
    for ep in range(num_demos):
        obs, _ = env.reset(seed=ep)
        t, ret, done = 0, 0.0, False
        while not done:
            qpos, qvel, qacc = mujoco_state(env)
            action = np.clip(agent.act(obs, device, deterministic=True), low, high).astype(np.float32)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for k, v in zip(rec, (obs, action, next_obs, reward, terminated, truncated, ep, t == 0, t, qpos, qvel, qacc)):
                rec[k].append(v)
            obs, t, ret, done = next_obs, t + 1, ret + float(reward), terminated or truncated
        returns.append(ret)
    env.close()
    dtypes = {"observations": np.float32, "actions": np.float32, "next_observations": np.float32, "rewards": np.float32,
              "terminals": bool, "timeouts": bool, "episode_ids": np.int64, "episode_starts": bool, "timesteps": np.int64,
              "qpos": np.float64, "qvel": np.float64, "qacc_warmstart": np.float64}  # fmt: skip
    demos = {k: np.asarray(v, dtype=dtypes[k]) for k, v in rec.items()}
    demos.update(returns=np.asarray(returns, np.float64), seeds=np.arange(num_demos, dtype=np.int64), env_id=np.array(env_id))
    return demos


def write_expert_cache(cache: Path, demos: dict, agent: SAC, args: Args, obs_dim: int, act_dim: int) -> None:
    atomic_write(cache / "demos.npz", lambda p: np.savez_compressed(open(p, "wb"), **demos))
    actor_file = {
        "actor": {k: v.cpu() for k, v in agent.actor.state_dict().items()}, "obs_dim": obs_dim, "act_dim": act_dim,
        "hidden": args.hidden_dim, "env_id": args.env_id, "total_timesteps": args.expert_timesteps,
        "mean_return": float(demos["returns"].mean()),
    }  # fmt: skip
    atomic_torch_save(cache / "expert_actor.pt", actor_file)
    meta = {
        "env_id": args.env_id, "expert_timesteps": args.expert_timesteps, "num_demos": int(len(demos["returns"])),
        "return_mean": float(demos["returns"].mean()), "return_std": float(demos["returns"].std()), "seed": args.seed,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "filter_irl_mujoco.py",
    }  # fmt: skip
    atomic_json(cache / "expert_meta.json", meta)


# ----------------------------------------------------------------------------------------------------------------
# Phases
# ----------------------------------------------------------------------------------------------------------------
def evaluate(agent: SAC, env_id: str, episodes: int, seed: int, p_tremble: float, device: torch.device) -> list[float]:
    """`episodes` deterministic episodes (mean action; trembling hand as in training, like the reference)."""
    env = make_env(env_id, seed)
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        ret, done = 0.0, False
        while not done:
            action = tremble(agent.act(obs, device, deterministic=True), rng, p_tremble, low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            ret, done = ret + float(reward), terminated or truncated
        returns.append(ret)
    env.close()
    return returns


def train_expert(args: Args, run_dir: Path, writer, device: torch.device, stop: StopFlag) -> Optional[SAC]:
    """Expert phase: CleanRL SAC on the TRUE reward for `expert_timesteps`; resumable from checkpoints/expert.pt.
    Returns None when interrupted (a checkpoint was saved)."""
    from tqdm import tqdm

    env = make_env(args.env_id, args.seed)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    agent = SAC(obs_dim, act_dim, low, high, args, device)
    np_rng = np.random.default_rng(args.seed)
    ckpt_path = run_dir / "checkpoints" / "expert.pt"
    step, episodes = 0, 0
    ckpt, rb = open_checkpoint(ckpt_path, device, obs_dim, act_dim, args.expert_timesteps, args.buffer_size, True)
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        step, episodes = ckpt["step"], ckpt["episodes"]
        set_rng_state(ckpt["rng"], np_rng, [env])
        print(f"expert phase: resuming at step {step}", file=sys.stderr)

    def save():
        state = {"agent": agent.state_dict(), "rb": rb.state_dict(), "step": step, "episodes": episodes,
                 "rng": rng_state(np_rng, [env])}  # fmt: skip
        atomic_torch_save(ckpt_path, state)

    obs, _ = env.reset(seed=args.seed + episodes)
    ret, length = 0.0, 0
    meter = SPSMeter()
    pbar = tqdm(total=args.expert_timesteps, initial=step, desc="expert SAC", dynamic_ncols=True, mininterval=2)
    while step < args.expert_timesteps:
        if stop.stop:
            save()
            pbar.close()
            return None
        if step < args.learning_starts:
            action = np_rng.uniform(low, high).astype(np.float32)
        else:
            action = agent.act(obs, device)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rb.add(obs, action, next_obs, terminated, reward)
        ret, length = ret + float(reward), length + 1
        obs = next_obs
        if terminated or truncated:
            writer.add_scalar("expert/episodic_return", ret, step)
            writer.add_scalar("expert/episodic_length", length, step)
            pbar.set_postfix(ret=f"{ret:.0f}")
            episodes += 1
            obs, _ = env.reset()
            ret, length = 0.0, 0
        step += 1
        if step > args.learning_starts:
            meter.start(step - 1)
            losses = sac_train_step(agent, rb, step, args)
            if step % args.log_frequency == 0:
                values = check_finite(losses, "expert SAC", step)
                for k, v in values.items():
                    writer.add_scalar(f"expert/{k}", v, step)
                writer.add_scalar("expert/alpha", float(agent.log_alpha.detach().exp()), step)
                if (sps := meter.sps(step)) is not None:
                    writer.add_scalar("expert/SPS", sps, step)
        if step % args.checkpoint_frequency == 0:
            save()
        pbar.update(1)
    pbar.close()
    save()
    env.close()
    return agent


def build_expert_data(args: Args, run_dir: Path, writer, device, stop: StopFlag, obs_dim: int, act_dim: int):
    """Demos from --expert-path, else from the cache, else train the expert, roll out the demos and cache them."""
    if args.expert_path:
        return load_demos(args.expert_path, args.env_id, obs_dim, act_dim, args.reset_prob)
    cache = Path(args.experts_dir) / args.env_id
    if (cache / "demos.npz").exists():
        return load_demos(cache / "demos.npz", args.env_id, obs_dim, act_dim, args.reset_prob)
    agent = train_expert(args, run_dir, writer, device, stop)
    if agent is None:
        return None
    if (cache / "demos.npz").exists():  # another run (or hype_irl_mujoco.py) finished first: never overwrite
        print(f"expert: {cache}/demos.npz appeared meanwhile; using it", file=sys.stderr)
        return load_demos(cache / "demos.npz", args.env_id, obs_dim, act_dim, args.reset_prob)
    demos = collect_demos(agent, args.env_id, args.num_demos, device)
    write_expert_cache(cache, demos, agent, args, obs_dim, act_dim)
    print(f"expert: {args.num_demos} demos, return {demos['returns'].mean():.1f} +- {demos['returns'].std():.1f} -> {cache}")
    return demos


class LearnerEnv:
    """The learner's training env: each episode starts, with probability `reset_prob`, from a uniformly chosen
    expert state (exact restore, remaining horizon); actions pass through the trembling hand. It returns the true
    reward only for LOGGING: the training loop never gives it to the replay buffer."""

    def __init__(self, env: gym.Env, demos: dict, reset_prob: float, p_tremble: float, rng: np.random.Generator):
        self.env, self.demos, self.reset_prob, self.p_tremble, self.rng = env, demos, reset_prob, p_tremble, rng
        self.num_states = len(demos["observations"]) if all(k in demos for k in STATE_KEYS) else 0
        self.low, self.high = env.action_space.low, env.action_space.high
        self.from_expert = False

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        i = sample_start(self.rng, self.reset_prob, self.num_states)
        self.from_expert = i >= 0
        if self.from_expert:
            d = self.demos
            restore_state(self.env, d["qpos"][i], d["qvel"][i], d["qacc_warmstart"][i], d["timesteps"][i])
            # The recorded observation, not one recomputed from the state: Ant/Humanoid observations hold contact
            # forces/inertias that gymnasium reads after mj_step, i.e. computed at the PREVIOUS state; the physics
            # state, and so every later observation, is exact.
            obs = d["observations"][i].astype(np.float64)
        return obs

    def step(self, action: np.ndarray):
        action = tremble(action, self.rng, self.p_tremble, self.low, self.high)
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        return action, next_obs, reward, terminated, truncated


def collect_learner_pairs(agent: SAC, env: LearnerEnv, num_traj: int, device: torch.device) -> tuple[np.ndarray, int]:
    """Fresh complete trajectories of the current (stochastic) policy; returns their (s, a) pairs and env steps."""
    pairs = []
    for _ in range(num_traj):
        obs, done = env.reset(), False
        while not done:
            action, next_obs, _, terminated, truncated = env.step(agent.act(obs, device))
            pairs.append(np.concatenate([obs, action]).astype(np.float32))
            obs, done = next_obs, terminated or truncated
    return np.stack(pairs), len(pairs)


def update_discriminator(
    disc: Discriminator, expert_pairs: torch.Tensor, learner_pairs: torch.Tensor, k: int, args: Args,
) -> dict[str, float]:  # fmt: skip
    """Outer iteration k: a FRESH Adam at lr0 / max(1, k) (the reference re-creates its OAdam each iteration, so no
    optimiser state carries over), `disc_steps` steps on disc_batch_size expert vs learner pairs (with replacement)."""
    optimizer = torch.optim.Adam(disc.parameters(), lr=disc_learning_rate(args.disc_lr, k), betas=(0.9, 0.999))
    device = expert_pairs.device
    for _ in range(args.disc_steps):
        xe = expert_pairs[torch.randint(len(expert_pairs), (args.disc_batch_size,), device=device)]
        xl = learner_pairs[torch.randint(len(learner_pairs), (args.disc_batch_size,), device=device)]
        alpha = torch.rand(args.disc_batch_size, 1, device=device)
        loss, ipm, gp = discriminator_loss(disc, xe, xl, alpha, args.gp_weight, args.gp_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return check_finite({"disc_loss": loss, "ipm": ipm, "gradient_penalty": gp}, "discriminator", k)


def plot_curve(path: Path, history: list[dict], expert_return: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
    if history:
        steps = [h["policy_steps"] for h in history]
        ax.plot(steps, [h["mean"] for h in history], marker="o", label="learner (policy env steps)")
        ax.plot([h["total_env_steps"] for h in history], [h["mean"] for h in history], ls="--", alpha=0.6,
                label="learner (incl. discriminator steps)")  # fmt: skip
    ax.axhline(expert_return, color="k", ls=":", label="expert demos")
    ax.set_xlabel("env steps")
    ax.set_ylabel("true return (deterministic eval)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)


def train_irl(
    args: Args, run_dir: Path, writer, device: torch.device, demos: dict, stop: StopFlag,
    env_fn: Callable[[str, int], gym.Env] = make_env,
) -> Optional[dict]:  # fmt: skip
    """IRL phase: outer iterations of (discriminator step on fresh learner vs expert pairs, then `train_every` SAC
    steps whose every sampled transition is relabelled with the current discriminator). Returns results, or None
    when interrupted (checkpoint saved). `env_fn` builds the training envs (tests pass reward-poisoned ones)."""
    from tqdm import tqdm

    env, disc_env = env_fn(args.env_id, args.seed), env_fn(args.env_id, args.seed + 1)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    np_rng = np.random.default_rng(args.seed)
    learner_env = LearnerEnv(env, demos, args.reset_prob, args.p_tremble, np_rng)
    disc_learner_env = LearnerEnv(disc_env, demos, args.reset_prob if args.disc_reset else 0.0, args.p_tremble, np_rng)
    disc_env.reset(seed=args.seed + 1)  # seeds the discriminator env's RNG; later resets continue it
    agent = SAC(obs_dim, act_dim, low, high, args, device)
    disc = Discriminator(obs_dim, act_dim, args.hidden_dim).to(device)
    expert_pairs = torch.as_tensor(np.concatenate([demos["observations"], demos["actions"]], 1), device=device)
    expert_return = float(np.mean(demos["returns"]))
    c = {"step": 0, "disc_env_steps": 0, "k": 0, "episodes": 0, "history": [], "next_eval": args.eval_frequency}
    ckpt_path = run_dir / "checkpoints" / "irl.pt"
    # the learner's buffer has NO reward storage: its rewards can only come from the discriminator
    ckpt, rb = open_checkpoint(ckpt_path, device, obs_dim, act_dim, args.total_timesteps, args.buffer_size, False)
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        disc.load_state_dict(ckpt["disc"])
        c = ckpt["counters"]
        set_rng_state(ckpt["rng"], np_rng, [env, disc_env])
        print(f"IRL phase: resuming at step {c['step']} (outer iteration {c['k']})", file=sys.stderr)

    def save():
        state = {"agent": agent.state_dict(), "disc": disc.state_dict(), "rb": rb.state_dict(), "counters": c,
                 "rng": rng_state(np_rng, [env, disc_env]), "args": dataclasses.asdict(args)}  # fmt: skip
        atomic_torch_save(ckpt_path, state)

    def run_eval():
        t = time.perf_counter()
        rets = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10_000, args.p_tremble, device)
        mean = float(np.mean(rets))
        entry = {"policy_steps": c["step"], "total_env_steps": c["step"] + c["disc_env_steps"], "mean": mean,
                 "std": float(np.std(rets)), "normalized": normalized_return(mean, expert_return), "returns": rets}  # fmt: skip
        c["history"].append(entry)
        writer.add_scalar("eval/episodic_return", mean, c["step"])
        writer.add_scalar("eval/normalized_return", entry["normalized"], c["step"])
        writer.add_scalar("eval/episodic_return_vs_total_env_steps", mean, entry["total_env_steps"])
        meter.pause(time.perf_counter() - t)
        return entry

    def reward_fn(o, a):
        return relabel_rewards(disc, o, a)

    meter = SPSMeter()
    obs = learner_env.reset(seed=args.seed + c["episodes"])
    ret, length = 0.0, 0
    pbar = tqdm(total=args.total_timesteps, initial=c["step"], desc=f"IRL (reset {args.reset_prob})", dynamic_ncols=True,
                mininterval=2)  # fmt: skip
    while c["step"] < args.total_timesteps:
        if stop.stop:
            save()
            pbar.close()
            return None
        step = c["step"]
        if step % args.train_every == 0 and c["k"] <= step // args.train_every:
            # Outer iteration k: discriminator step on fresh learner trajectories vs the expert's pairs.
            learner_pairs, n = collect_learner_pairs(agent, disc_learner_env, args.disc_trajectories, device)
            c["disc_env_steps"] += n
            d = update_discriminator(disc, expert_pairs, torch.as_tensor(learner_pairs, device=device), c["k"], args)
            for name, v in d.items():
                writer.add_scalar(f"irl/{name}", v, step)
            writer.add_scalar("irl/disc_learning_rate", disc_learning_rate(args.disc_lr, c["k"]), step)
            writer.add_scalar("irl/outer_iteration", c["k"], step)
            writer.add_scalar("irl/disc_env_steps", c["disc_env_steps"], step)
            c["k"] += 1
        if step < args.learning_starts:
            action = np_rng.uniform(low, high).astype(np.float32)
        else:
            action = agent.act(obs, device)
        action, next_obs, env_reward, terminated, truncated = learner_env.step(action)
        rb.add(obs, action, next_obs, terminated)  # no reward: the learner's rewards come from the discriminator
        ret, length = ret + float(env_reward), length + 1  # true return, for logging only
        obs = next_obs
        if terminated or truncated:
            tag = "irl/reset_episodic_return" if learner_env.from_expert else "charts/episodic_return"
            writer.add_scalar(tag, ret, step)
            if not learner_env.from_expert:
                writer.add_scalar("charts/episodic_length", length, step)
                pbar.set_postfix(ret=f"{ret:.0f}")
            c["episodes"] += 1
            obs, ret, length = learner_env.reset(), 0.0, 0
        c["step"] = step = step + 1
        if step > args.learning_starts:
            meter.start(step - 1)
            losses = sac_train_step(agent, rb, step, args, reward_fn)
            if step % args.log_frequency == 0:
                values = check_finite(losses, "IRL learner", step)
                for k, v in values.items():
                    writer.add_scalar("irl/relabelled_reward" if k == "rewards" else f"losses/{k}", v, step)
                writer.add_scalar("losses/alpha", float(agent.log_alpha.detach().exp()), step)
                writer.add_scalar("charts/learning_rate", args.policy_lr, step)
                writer.add_scalar("irl/total_env_steps", step + c["disc_env_steps"], step)
                if (sps := meter.sps(step)) is not None:
                    writer.add_scalar("charts/SPS", sps, step)
                    pbar.set_postfix(sps=f"{sps:.0f}")
        if step >= c["next_eval"]:
            entry = run_eval()
            c["next_eval"] += args.eval_frequency
            tqdm.write(f"step {step}: eval return {entry['mean']:.1f} ({entry['normalized']:.2f} of expert)")
            if args.stop_at_normalized is not None and entry["normalized"] >= args.stop_at_normalized:
                break
        if step % args.checkpoint_frequency == 0:
            save()
        pbar.update(1)
    pbar.close()
    if not c["history"] or c["history"][-1]["policy_steps"] != c["step"]:
        run_eval()
    save()
    env.close()
    disc_env.close()
    final = c["history"][-1]
    sps = meter.sps(c["step"])
    results = {
        "env_id": args.env_id, "method": "FILTER" if args.reset_prob > 0 else "MM", "reset_prob": args.reset_prob,
        "seed": args.seed, "final_eval": final, "eval_mean": final["mean"], "eval_std": final["std"],
        "eval_returns": final["returns"], "normalized_return": final["normalized"], "expert_return": expert_return,
        "best_eval_mean": max(h["mean"] for h in c["history"]),
        "num_demos": int(len(demos["returns"])), "policy_env_steps": c["step"], "disc_env_steps": c["disc_env_steps"],
        "total_env_steps": c["step"] + c["disc_env_steps"], "outer_iterations": c["k"], "SPS": sps,
        "p_tremble": args.p_tremble, "eval_episodes": args.eval_episodes, "history": c["history"],
    }  # fmt: skip
    if args.save_model:
        atomic_torch_save(run_dir / "actor.pt", {"actor": agent.actor.state_dict(), "obs_dim": obs_dim,
                                                 "act_dim": act_dim, "hidden": args.hidden_dim, "env_id": args.env_id})  # fmt: skip
    plot_curve(run_dir / "learning_curve.png", c["history"], expert_return,
               f"{args.env_id} {results['method']} (reset {args.reset_prob})")  # fmt: skip
    return results


# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------
def validate(args: Args) -> Path:
    """Check every documented bad input BEFORE anything is written; return the run dir."""
    for name in ("total_timesteps", "expert_timesteps", "batch_size", "train_every", "disc_batch_size", "num_demos",
                 "eval_frequency", "eval_episodes", "log_frequency", "checkpoint_frequency", "disc_trajectories"):  # fmt: skip
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if not 0.0 <= args.reset_prob <= 1.0 or not 0.0 <= args.p_tremble <= 1.0:
        raise UsageError("--reset-prob and --p-tremble must be probabilities in [0, 1]")
    if args.torch_threads < 0:
        raise UsageError("--torch-threads must be >= 0 (0 = torch's default)")
    check_env_id(args.env_id)
    env = gym.make(args.env_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    if args.expert_path:
        if not args.expert_path.startswith(MINARI_PREFIX) and not Path(args.expert_path).is_file():
            raise UsageError(f"--expert-path {args.expert_path} does not exist; pass a demos.npz or drop the flag to use the cache")
        load_demos(args.expert_path, args.env_id, obs_dim, act_dim, args.reset_prob)
    elif (Path(args.experts_dir) / args.env_id / "demos.npz").exists():
        load_demos(Path(args.experts_dir) / args.env_id / "demos.npz", args.env_id, obs_dim, act_dim, args.reset_prob)
    run_dir = Path(args.run_dir or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    if (run_dir / "args.json").exists():
        old = json.loads((run_dir / "args.json").read_text())
        if old.get("env_id") != args.env_id:
            raise UsageError(f"run dir {run_dir} holds a {old.get('env_id')} run, not {args.env_id}; pass another --run-dir")
    if (run_dir / "results.json").exists():
        raise UsageError(f"run dir {run_dir} already holds a finished run (results.json); pass a new --run-dir")
    return run_dir


def cli(argv: Optional[list[str]] = None) -> Args:
    """Parse the command line; when --run-dir names an existing run, its saved args.json are the defaults, so
    `--run-dir X` alone resumes it and explicitly passed flags still win."""
    argv = sys.argv[1:] if argv is None else argv
    args = tyro.cli(Args, args=argv)
    saved_path = Path(args.run_dir) / "args.json" if args.run_dir else None
    if saved_path is not None and saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
            fields = {f.name for f in dataclasses.fields(Args)}
            default = Args(**{k: v for k, v in saved.items() if k in fields})
        except (ValueError, TypeError):
            print(f"error: {saved_path} is not a run's args.json; pass another --run-dir", file=sys.stderr)
            raise SystemExit(2)
        args = tyro.cli(Args, args=argv, default=default)
    return args


def eval_only(args: Args, device: torch.device) -> None:
    path = Path(args.eval_only) / "actor.pt"
    if not path.is_file():
        raise UsageError(f"{path} does not exist; pass a finished run dir to --eval-only")
    saved = torch.load(path, map_location=device, weights_only=False)
    env = make_env(saved["env_id"], args.seed)
    args = dataclasses.replace(args, hidden_dim=saved["hidden"])
    agent = SAC(saved["obs_dim"], saved["act_dim"], env.action_space.low, env.action_space.high, args, device)
    agent.actor.load_state_dict(saved["actor"])
    rets = evaluate(agent, saved["env_id"], args.eval_episodes, args.seed + 20_000, args.p_tremble, device)
    print(json.dumps({"env_id": saved["env_id"], "mean": float(np.mean(rets)), "std": float(np.std(rets)), "returns": rets}))


def main(args: Args) -> None:
    try:
        device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
        if args.eval_only:
            return eval_only(args, device)
        run_dir = validate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    from torch.utils.tensorboard import SummaryWriter

    keep_freed_memory()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    stop = StopFlag()
    stop.install()
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_json(run_dir / "args.json", dataclasses.asdict(args))
    if args.track:
        try:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=dataclasses.asdict(args), name=run_dir.name, save_code=True)  # fmt: skip
        except ImportError:
            print("--track: wandb is not installed; logging to TensorBoard only", file=sys.stderr)
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    env = gym.make(args.env_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    try:
        demos = build_expert_data(args, run_dir, writer, device, stop, obs_dim, act_dim)
        if demos is None or args.expert_only:
            if demos is None:
                print(f"interrupted: checkpoint saved; re-run with --run-dir {run_dir} to resume", file=sys.stderr)
            writer.close()
            return
        results = train_irl(args, run_dir, writer, device, demos, stop)
    except FloatingPointError as e:
        writer.close()
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    writer.close()
    if results is None:
        print(f"interrupted: checkpoint saved; re-run with --run-dir {run_dir} to resume", file=sys.stderr)
        return
    atomic_json(run_dir / "results.json", results)
    print(f"final eval return {results['eval_mean']:.1f} +- {results['eval_std']:.1f} "
          f"({results['normalized_return']:.2f} of expert) -> {run_dir}")  # fmt: skip


if __name__ == "__main__":
    main(cli())
