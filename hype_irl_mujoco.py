"""HyPE: hybrid inverse RL on MuJoCo — the learner's SAC minibatches mix expert transitions into its own replay.

Moment-matching inverse RL alternates a discriminator (a cost) f(s, a), trained with an integral-probability-metric
loss E_expert[f] - E_learner[f] + 10 * gradient penalty toward norm 0.4, and a SAC learner maximising the reward
-f(s, a). HyPE makes the policy step cheap: every SAC minibatch holds a fraction rho of expert transitions and 1 - rho
of the learner's own replay, all relabelled with the CURRENT discriminator, so the learner needs no global exploration
and no resets. rho follows a piecewise-linear schedule per environment. `--reset-prob > 0` adds FILTER's resets to
exact expert states (HyPE+FILTER); `--rho-schedule 0` (with the default `--reset-prob 0`) is plain moment matching.

Paper: Juntao Ren, Gokul Swamy, Zhiwei Steven Wu, J. Andrew Bagnell, Sanjiban Choudhury (2024), "Hybrid Inverse
Reinforcement Learning", ICML 2024 (arXiv 2402.08848). Defaults follow the official model-free code (jren03/garage):
discriminator MLP 256-256, one step per outer iteration on 4,096 expert vs 4,096 learner pairs from 4 fresh learner
trajectories, learning rate lr0/k with the optimiser re-created at every outer iteration k, lr0 = 8e-4, rho schedules
[[0.2, 0.1, 200k], [0.1, 0.01, 1M]] (Hopper, Humanoid) and [[0.2, 0.2, 300k], [0.2, 0.1, 1M]] (Ant, Walker2d).
Deliberate differences (see docs/hype_irl_mujoco.md): CleanRL's SAC hyper-parameters and Adam instead of SB3 SAC with
OAdam and a learning rate that restarts every outer iteration; gymnasium v5 envs on MuJoCo 3+/4; env steps spent on
the discriminator's rollouts ARE counted in the budget; expert-state resets restore (qpos, qvel, qacc_warmstart) exactly
instead of replaying seeds and actions.

Usage:
    python hype_irl_mujoco.py --env-id Hopper-v5                     # expert phase (or cache) + 1M-step HyPE
    python hype_irl_mujoco.py --env-id Hopper-v5 --reset-prob 0.5    # HyPE+FILTER
    python hype_irl_mujoco.py --env-id Hopper-v5 --rho-schedule 0    # no expert rows: moment matching (MM)
    # minutes on a laptop CPU: a tiny expert and a short IRL run on a cheap env
    python hype_irl_mujoco.py --env-id InvertedPendulum-v5 --expert-timesteps 10000 --total-timesteps 10000 \
        --train-every 1000 --eval-frequency 2500 --learning-starts 1000
    python hype_irl_mujoco.py --env-id Hopper-v5 --run-dir runs/x   # same --run-dir again: resumes (checkpoints/)
    python hype_irl_mujoco.py --env-id Hopper-v5 --eval-only runs/x  # evaluate a run's learner, write nothing

Run directory: TensorBoard events, `args.json`, `checkpoints/{expert,irl}.pt` (atomic; model, optimisers, replay,
RNG states, counters), `results.json` (final evaluation, budget, SPS), `learning_curve.png`, `eval_history.json`.

Expert data format
------------------
Cache: `{experts_dir}/{env_id}/` holds `demos.npz`, `expert_actor.pt` (dict: actor state_dict of the SAC actor
obs->256->256 ReLU -> mean and log_std heads, tanh squash, action = tanh(mean) * scale + bias at evaluation, plus
obs_dim, act_dim, hidden=256, env_id, total_timesteps, mean_return) and `expert_meta.json` (env_id, expert training
steps, number of demos, mean/std of demo returns, seed, date, producing script), all written atomically. If
`demos.npz` exists it is reused (shapes validated against the env); otherwise a SAC expert is trained on the true
reward (`--expert-timesteps`) and `--num-demos` deterministic complete episodes are rolled out with reset seeds 0, 1, ...
`demos.npz` keys (N transitions, E episodes): observations float32 (N, obs_dim); actions float32 (N, act_dim) clipped to
the action bounds; next_observations float32 (N, obs_dim); rewards float32 (N,) true env reward, stored for reference
and NEVER used for learning; terminals bool (N,) (env `terminated`); timeouts bool (N,) (env `truncated`); episode_ids
int64 (N,) in 0..E-1; episode_starts bool (N,); timesteps int64 (N,) index inside the episode; returns float64 (E,)
true undiscounted return per episode; seeds int64 (E,) reset seed per episode; qpos float64 (N, nq), qvel float64
(N, nv), qacc_warmstart float64 (N, nv): MuJoCo state before each transition, so restoring them (plus mj_forward) and
replaying actions[i] reproduces next_observations[i] exactly; env_id 0-d str array. qpos, qvel, qacc_warmstart, seeds
and timesteps are optional in a user's file (timesteps is derived from episode_starts); without the MuJoCo state,
`--reset-prob > 0` is refused. Validation: missing keys, observation/action sizes that do not match the env, another
env_id, or zero episodes exit with code 2 and a one-line message. `--expert-path minari:DATASET_ID` reads a Minari
dataset (`minari download DATASET_ID` first) into the same keys, as filter_irl_mujoco.py does: an episode's T+1
observations give observations/next_observations, terminations/truncations give terminals/timeouts. It carries no
MuJoCo state, so `--reset-prob` must stay 0.
"""


import ctypes
import datetime as dt
import difflib
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

# Piecewise-linear rho schedules of the reference ([start, end, until_step] segments, in learner env steps).
# HalfCheetah is not in the reference; it gets the Ant/Walker2d schedule (our choice). Any other env: Hopper's.
RHO_SCHEDULES = {
    "Hopper": "0.2,0.1,200000;0.1,0.01,1000000",
    "Humanoid": "0.2,0.1,200000;0.1,0.01,1000000",
    "Ant": "0.2,0.2,300000;0.2,0.1,1000000",
    "Walker2d": "0.2,0.2,300000;0.2,0.1,1000000",
    "HalfCheetah": "0.2,0.2,300000;0.2,0.1,1000000",
}
DEFAULT_RHO_SCHEDULE = RHO_SCHEDULES["Hopper"]
REQUIRED_DEMO_KEYS = (
    "observations", "actions", "next_observations", "rewards", "terminals", "timeouts",
    "episode_ids", "episode_starts", "returns", "env_id",
)
STATE_KEYS = ("qpos", "qvel", "qacc_warmstart")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class Args:
    exp_name: str = "hype_irl_mujoco"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, CUDA is used when available (falls back to the CPU)"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases (needs wandb installed)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """accepted for CleanRL compatibility; this script records no videos"""
    save_model: bool = True
    """if toggled, the final actor is saved to `{run_dir}/hype_irl_mujoco.cleanrl_model`"""

    # Environment and run directory
    env_id: str = "Hopper-v5"
    """the MuJoCo environment id (Hopper-v5, Walker2d-v5, HalfCheetah-v5, Ant-v5, Humanoid-v5, InvertedPendulum-v5, ...)"""
    run_dir: str | None = None
    """run directory; default runs/{env_id}__{exp_name}__{seed}__{unix_time}; an existing one is resumed"""
    max_episode_steps: int | None = None
    """episode horizon override (default: the env's registered limit, 1000 for the MuJoCo tasks)"""
    torch_threads: int = 0
    """CPU threads for torch (0 = torch's default: all cores, or OMP_NUM_THREADS). Use 1 on a CPU shared with other
    jobs: oversubscribed threads made the small-MLP updates many times slower on our busy 2-core machine"""

    # Expert data (shared cache with filter_irl_mujoco.py)
    experts_dir: str = "experts"
    """cache of expert data: {experts_dir}/{env_id}/demos.npz, expert_actor.pt, expert_meta.json"""
    expert_path: str | None = None
    """a demos.npz of your own (format in the module docstring), or minari:DATASET_ID for a downloaded Minari dataset
    (e.g. minari:mujoco/hopper/expert-v0; needs `pip install "minari[hdf5]"`); overrides the cache"""
    expert_timesteps: int = 1_000_000
    """SAC expert training steps on the true reward when no cached demos exist"""
    num_demos: int = 64
    """deterministic complete expert episodes rolled out (reset seeds 0, 1, 2, ...)"""

    # SAC learner (also used, on the true reward, for the expert)
    total_timesteps: int = 1_000_000
    """IRL budget in policy env steps (the discriminator's rollout steps are counted and reported separately)"""
    buffer_size: int = 1_000_000
    """learner replay capacity"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network smoothing coefficient"""
    batch_size: int = 256
    """SAC minibatch size (expert + learner rows)"""
    learning_starts: int = 5000
    """random-action steps before SAC updates start (each phase)"""
    policy_lr: float = 3e-4
    """actor and entropy-temperature learning rate"""
    q_lr: float = 1e-3
    """critic learning rate"""
    policy_frequency: int = 2
    """the actor (and temperature) is updated `policy_frequency` times every `policy_frequency` steps (CleanRL)"""
    alpha: float = 0.2
    """entropy temperature when --no-autotune"""
    autotune: bool = True
    """automatic entropy tuning toward -act_dim"""
    hidden_dim: int = 256
    """width of the two hidden layers of actor, critics and discriminator"""

    # HyPE: hybrid replay and resets
    rho_schedule: str | None = None
    """expert fraction rho: 'start,end,until;start,end,until...' piecewise-linear in learner steps, or one number;
    default per env (Hopper/Humanoid 0.2->0.1 by 200k ->0.01 by 1M; Ant/Walker2d/HalfCheetah 0.2 until 300k ->0.1 by 1M)"""
    reset_prob: float = 0.0
    """probability an episode starts from a uniformly drawn expert state (exact restore): >0 gives HyPE+FILTER"""
    p_tremble: float = 0.01
    """trembling hand: probability of replacing the action by a uniform random one (training, discriminator
    rollouts and evaluation, as the reference)"""
    terminal_reward: str = "min"
    """'min': a terminal transition enters an absorbing state that earns the minibatch's lowest relabelled reward
    forever (no survival or suicide bias from the sign of -f); 'none': the episode just ends (reference)"""

    # Discriminator f(s, a); reward = -f
    train_every: int = 5000
    """learner env steps per outer iteration (one discriminator update each)"""
    disc_lr: float = 8e-4
    """discriminator lr0; outer iteration k uses lr0 / k with a fresh Adam"""
    disc_steps: int = 1
    """discriminator gradient steps per outer iteration"""
    disc_batch_size: int = 4096
    """expert and learner (s, a) pairs per discriminator step"""
    disc_trajectories: int = 4
    """fresh learner trajectories collected per outer iteration for the discriminator (their steps are counted)"""
    gp_weight: float = 10.0
    """gradient-penalty weight"""
    gp_target: float = 0.4
    """gradient-penalty target norm"""

    # Evaluation, logging, checkpoints
    eval_frequency: int = 50_000
    """evaluate every this many policy env steps"""
    eval_episodes: int = 10
    """deterministic evaluation episodes (reset seeds seed + 10000, +1, ...)"""
    log_frequency: int = 1000
    """TensorBoard scalars (losses, SPS, rho) every this many env steps"""
    checkpoint_frequency: int = 25_000
    """checkpoint every this many env steps (and on SIGINT/SIGTERM and at the end)"""
    eval_only: str | None = None
    """evaluate the learner saved in this run dir (checkpoints/irl.pt) and print the returns; no training"""


def fail(message: str) -> None:
    """Documented bad input: one line on stderr, exit code 2, nothing written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ----------------------------------------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------------------------------------
def make_env(env_id: str, max_episode_steps: int | None = None) -> tuple[gym.Env, int]:
    """The env WITHOUT gymnasium's TimeLimit, and its horizon: the loop keeps its own time index so that an episode
    restored to expert time t runs for exactly horizon - t more steps."""
    env = gym.make(env_id, disable_env_checker=True)
    horizon = max_episode_steps or env.spec.max_episode_steps or 1000
    if isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return env, horizon


def snapshot_state(env: gym.Env) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MuJoCo state before a step: (qpos, qvel, qacc_warmstart), copied."""
    data = env.unwrapped.data
    return data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy()


def restore_state(env: gym.Env, qpos: np.ndarray, qvel: np.ndarray, qacc_warmstart: np.ndarray) -> np.ndarray:
    """Exact restore: the expert's next states replay bit for bit (warm start included). Returns the recomputed
    observation, which equals the recorded one except, on Ant/Humanoid, for the contact/actuator-force entries
    (gymnasium computes those from the last substep's solver state): the learner's reset uses the recorded one."""
    import mujoco

    u = env.unwrapped
    u.data.qpos[:] = qpos
    u.data.qvel[:] = qvel
    u.data.qacc_warmstart[:] = qacc_warmstart
    if u.model.na:
        u.data.act[:] = 0.0
    mujoco.mj_forward(u.model, u.data)
    return u._get_obs()


# ----------------------------------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------------------------------
class Actor(nn.Module):
    """SAC actor: obs -> 256 -> 256 ReLU -> mean, log_std; tanh-squashed Gaussian (names as CleanRL's)."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, hidden: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc_mean = nn.Linear(hidden, act_dim)
        self.fc_logstd = nn.Linear(hidden, act_dim)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

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
        return y * self.action_scale + self.action_bias, log_prob, torch.tanh(mean) * self.action_scale + self.action_bias


class TwinQ(nn.Module):
    """Both Q-networks as ONE batched module: weights stacked on a leading axis, evaluated with batched matmuls, so
    the critic costs three kernels per layer stack instead of two separate MLPs (the CPU update is latency-bound)."""

    def __init__(self, in_dim: int, hidden: int = 256, n: int = 2):
        super().__init__()
        dims = [in_dim, hidden, hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
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
        # Output width 1: multiply-and-sum instead of a (B, h) x (h, 1) batched matmul, whose backward is an outer
        # product that MKL runs slowly (~8 % of a Q forward + backward on the 2-core CPU).
        return (h * w3.transpose(1, 2)).sum(-1) + b3.squeeze(-1)


class Discriminator(nn.Module):
    """f(s, a): MLP 256-256 ReLU -> scalar cost, orthogonal weights (reference), default biases. Reward = -f."""

    def __init__(self, in_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, gain=1.0 if m.out_features == 1 else math.sqrt(2))

    def forward(self, sa: torch.Tensor) -> torch.Tensor:
        return self.net(sa).squeeze(-1)


# ----------------------------------------------------------------------------------------------------------------------
# The math as pure functions
# ----------------------------------------------------------------------------------------------------------------------
def parse_rho_schedule(spec: str) -> list[tuple[float, float, int]]:
    """'0.2,0.1,200000;0.1,0.01,1000000' -> [(0.2, 0.1, 200000), (0.1, 0.01, 1000000)]; a single number is constant."""
    spec = spec.strip()
    try:
        if ";" not in spec and "," not in spec:
            value = float(spec)
            segments = [(value, value, 1)]
        else:
            segments = []
            for part in spec.split(";"):
                start, end, until = part.split(",")
                segments.append((float(start), float(end), int(float(until))))
    except ValueError:
        raise ValueError(f"--rho-schedule {spec!r} is not 'start,end,until;...' or a number, e.g. '0.2,0.1,200000;0.1,0.01,1000000'")
    previous = 0
    for start, end, until in segments:
        if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0):
            raise ValueError(f"--rho-schedule {spec!r}: every rho must lie in [0, 1]")
        if until <= previous:
            raise ValueError(f"--rho-schedule {spec!r}: segment end steps must be positive and increasing")
        previous = until
    return segments


def rho_at(step: int, segments: list[tuple[float, float, int]]) -> float:
    """Piecewise-linear rho: segment i goes from `start` at the previous segment's end (0 for the first) to `end` at
    `until`; after the last segment rho stays at its end value."""
    seg_start = 0
    for start, end, until in segments:
        if step <= until:
            return start + (end - start) * (step - seg_start) / (until - seg_start)
        seg_start = until
    return segments[-1][1]


def hybrid_indices(batch_size: int, rho: float, num_expert: int, num_learner: int, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """Row indices of one hybrid minibatch in the combined storage [expert rows 0..E-1 | learner rows E..E+L-1]:
    exactly round(rho * batch_size) expert rows (uniform over expert transitions) and the rest learner rows (uniform
    over the filled replay). Rows are sampled with replacement, like SB3's buffers."""
    n_expert = int(round(rho * batch_size)) if num_expert > 0 else 0
    if num_learner == 0:
        n_expert = batch_size
    expert = torch.randint(0, max(num_expert, 1), (n_expert,), generator=generator, device=device)
    learner = num_expert + torch.randint(0, max(num_learner, 1), (batch_size - n_expert,), generator=generator, device=device)
    return torch.cat([expert, learner])


def relabel_rewards(disc: Discriminator, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """Reward of every sampled transition (expert and learner) under the CURRENT discriminator: r = -f(s, a)."""
    with torch.no_grad():
        return -disc(torch.cat([obs, act], -1))


def gradient_penalty(f, x_expert: torch.Tensor, x_learner: torch.Tensor, target: float = 0.4,
                     alpha: torch.Tensor | None = None) -> torch.Tensor:
    """E[(||grad_x f(x_hat)||_2 - target)^2] at x_hat = alpha * x_expert + (1 - alpha) * x_learner, alpha ~ U(0,1) per row."""
    if alpha is None:
        alpha = torch.rand(x_expert.shape[0], 1, device=x_expert.device)
    x_hat = (alpha * x_expert + (1 - alpha) * x_learner).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(x_hat).sum(), x_hat, create_graph=True)
    return ((grad.norm(2, dim=-1) - target) ** 2).mean()


def discriminator_loss(f, x_expert: torch.Tensor, x_learner: torch.Tensor, gp_weight: float = 10.0,
                       gp_target: float = 0.4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IPM loss E_expert[f] - E_learner[f] + gp_weight * GP: f is a cost, pushed down on expert pairs, up on the learner's.
    Returns (loss, ipm term, gradient penalty)."""
    ipm = f(x_expert).mean() - f(x_learner).mean()
    gp = gradient_penalty(f, x_expert, x_learner, gp_target)
    return ipm + gp_weight * gp, ipm, gp


def disc_lr_at(outer_iteration: int, lr0: float) -> float:
    """Harmonic decay of the reference: lr0 at k = 0 and k = 1, lr0 / k after."""
    return lr0 / max(1, outer_iteration)


def soft_q_target(reward: torch.Tensor, done: torch.Tensor, next_q: torch.Tensor, next_logp: torch.Tensor,
                  alpha: torch.Tensor, gamma: float, absorbing_reward: torch.Tensor | None = None) -> torch.Tensor:
    """r + gamma * (1 - d) * (min Q'(s', a') - alpha * log pi(a'|s')). With `absorbing_reward`, a terminal transition
    instead enters an absorbing state earning that reward forever: + gamma * d * r_abs / (1 - gamma)."""
    target = reward + gamma * (1.0 - done) * (next_q - alpha * next_logp)
    if absorbing_reward is not None:
        target = target + gamma * done * absorbing_reward / (1.0 - gamma)
    return target


def tremble(action: np.ndarray, rng: np.random.Generator, p: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Trembling hand: with probability p the whole action is replaced by a uniform random one."""
    if p > 0 and rng.random() < p:
        return rng.uniform(low, high).astype(np.float32)
    return action


# ----------------------------------------------------------------------------------------------------------------------
# SAC learner
# ----------------------------------------------------------------------------------------------------------------------
class SAC:
    """Actor, batched twin Q, target twin Q, automatic entropy tuning. `update` takes the rewards explicitly: in the
    IRL phase they are always the discriminator's relabelled rewards, never the stored ones."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, args: Args, device: torch.device):
        self.args = args
        self.actor = Actor(obs_dim, act_dim, low, high, args.hidden_dim).to(device)
        self.qf = TwinQ(obs_dim + act_dim, args.hidden_dim).to(device)
        self.qf_target = TwinQ(obs_dim + act_dim, args.hidden_dim).to(device)
        self.qf_target.load_state_dict(self.qf.state_dict())
        fused = {"fused": True}  # one fused kernel per optimiser step (CPU and CUDA)
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=args.q_lr, **fused)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=args.policy_lr, **fused)
        self.target_entropy = -float(act_dim)
        self.log_alpha = torch.tensor([math.log(args.alpha)], device=device, requires_grad=True)
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=args.q_lr, **fused)  # CleanRL uses q_lr here
        self.num_updates = 0

    def update(self, obs, act, next_obs, done, reward, absorbing: bool = False) -> dict[str, torch.Tensor]:
        """One critic step, `policy_frequency` actor/temperature steps every `policy_frequency` calls, one target
        lerp. Returns loss tensors (no host sync)."""
        args = self.args
        alpha = self.log_alpha.detach().exp() if args.autotune else torch.full_like(self.log_alpha, args.alpha)
        with torch.no_grad():
            next_act, next_logp, _ = self.actor.get_action(next_obs)
            next_q = self.qf_target(next_obs, next_act).min(0).values
            target = soft_q_target(reward, done, next_q, next_logp, alpha, args.gamma, reward.min() if absorbing else None)
        q = self.qf(obs, act)
        qf_loss = ((q - target) ** 2).mean(-1).sum()  # qf1_loss + qf2_loss, as CleanRL
        self.q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.q_optimizer.step()
        out = {"qf_loss": qf_loss.detach(), "qf1_values": q[0].detach().mean(), "qf2_values": q[1].detach().mean(),
               "relabelled_reward": reward.mean()}
        self.num_updates += 1
        if self.num_updates % args.policy_frequency == 0:
            self.qf.requires_grad_(False)  # the actor's loss needs gradients w.r.t. actions only
            for _ in range(args.policy_frequency):  # same batch each time, as CleanRL
                pi, logp, _ = self.actor.get_action(obs)
                actor_loss = (alpha * logp - self.qf(obs, pi).min(0).values).mean()
                self.actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
                self.actor_optimizer.step()
                out["actor_loss"] = actor_loss.detach()
                if args.autotune:
                    alpha_loss = (-self.log_alpha.exp() * (logp.detach() + self.target_entropy)).mean()
                    self.a_optimizer.zero_grad(set_to_none=True)
                    alpha_loss.backward()
                    self.a_optimizer.step()
                    alpha = self.log_alpha.detach().exp()
                    out["alpha_loss"] = alpha_loss.detach()
            self.qf.requires_grad_(True)
        with torch.no_grad():
            torch._foreach_lerp_(list(self.qf_target.parameters()), list(self.qf.parameters()), args.tau)
        out["alpha"] = alpha.squeeze()
        return out

    def state_dict(self) -> dict:
        return {
            "actor": self.actor.state_dict(), "qf": self.qf.state_dict(), "qf_target": self.qf_target.state_dict(),
            "q_optimizer": self.q_optimizer.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(), "a_optimizer": self.a_optimizer.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.qf.load_state_dict(state["qf"])
        self.qf_target.load_state_dict(state["qf_target"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.a_optimizer.load_state_dict(state["a_optimizer"])
        self.num_updates = state["num_updates"]


class Storage:
    """Combined replay on the device: rows [0, E) hold expert transitions, rows [E, E + capacity) a ring of learner
    transitions. A row is [obs | act | next_obs | done | reward] so a minibatch is ONE gather. In the IRL phase the
    reward column holds NaN for every row (the env reward is hidden, expert rewards are not loaded): a learning step
    that read it would turn the losses into NaN and stop the run, which makes 'env reward never used' checkable."""

    def __init__(self, obs_dim: int, act_dim: int, capacity: int, device: torch.device, expert_rows: torch.Tensor | None = None):
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.width = 2 * obs_dim + act_dim + 2
        self.num_expert = 0 if expert_rows is None else expert_rows.shape[0]
        self.capacity = capacity
        self.data = torch.zeros(self.num_expert + capacity, self.width, device=device)
        if expert_rows is not None:
            self.data[: self.num_expert] = expert_rows
        self.ptr, self.size = 0, 0

    @staticmethod
    def rows(obs, act, next_obs, done, reward) -> np.ndarray:
        return np.concatenate([obs, act, next_obs, np.atleast_1d(done), np.atleast_1d(reward)], -1, dtype=np.float32)

    def add(self, row: np.ndarray) -> None:
        self.data[self.num_expert + self.ptr] = torch.from_numpy(row)
        self.ptr = (self.ptr + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def split(self, batch: torch.Tensor):
        o, a = self.obs_dim, self.act_dim
        return batch[:, :o], batch[:, o:o + a], batch[:, o + a:2 * o + a], batch[:, 2 * o + a], batch[:, 2 * o + a + 1]

    def sample(self, batch_size: int, rho: float, generator: torch.Generator | None = None):
        idx = hybrid_indices(batch_size, rho, self.num_expert, self.size, generator, self.data.device)
        return self.split(self.data[idx])

    def learner_rows(self) -> torch.Tensor:
        """The filled learner rows, oldest first (for checkpoints)."""
        rows = self.data[self.num_expert:self.num_expert + self.size]
        return torch.roll(rows, -self.ptr, 0) if self.size == self.capacity else rows

    def load_learner_rows(self, rows: torch.Tensor) -> None:
        n = min(rows.shape[0], self.capacity)
        self.data[self.num_expert:self.num_expert + n] = rows[-n:].to(self.data.device)
        self.size, self.ptr = n, n % self.capacity


# ----------------------------------------------------------------------------------------------------------------------
# Expert data: load and validate, or train an expert and roll out demonstrations
# ----------------------------------------------------------------------------------------------------------------------
MINARI = "minari:"


def read_minari(dataset_id: str) -> dict[str, np.ndarray]:
    """A downloaded Minari dataset as demos.npz keys (no MuJoCo state); exit 2 with one line if it cannot be read."""
    try:
        import minari
    except ImportError:
        fail(f"{MINARI}{dataset_id} needs the minari package: pip install 'minari[hdf5]'")
    if dataset_id not in minari.list_local_datasets():
        fail(f"Minari dataset {dataset_id} is not downloaded: run `minari download {dataset_id}` first")
    try:
        data = minari.load_dataset(dataset_id)
        env_spec = data.spec.env_spec
        episodes = list(data.iterate_episodes())
    except Exception as exc:  # noqa: BLE001 - a broken local copy is bad input
        fail(f"cannot read Minari dataset {dataset_id} ({type(exc).__name__}); delete it and download it again")
    if any(not isinstance(ep.observations, np.ndarray) or not isinstance(ep.actions, np.ndarray) for ep in episodes):
        fail(f"Minari dataset {dataset_id} has dict/tuple spaces; use a dataset with flat Box observations and actions")
    steps = [len(ep.rewards) for ep in episodes]
    n = sum(steps)

    def stack(parts, dtype, width=None):
        out = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        return out.reshape(n, -1) if width else out

    return {
        "observations": stack([ep.observations[:-1] for ep in episodes], np.float32, True),
        "next_observations": stack([ep.observations[1:] for ep in episodes], np.float32, True),
        "actions": stack([ep.actions for ep in episodes], np.float32, True),
        "rewards": stack([ep.rewards for ep in episodes], np.float32),
        "terminals": stack([ep.terminations for ep in episodes], bool),
        "timeouts": stack([ep.truncations for ep in episodes], bool),
        "episode_ids": np.repeat(np.arange(len(episodes), dtype=np.int64), steps),
        "episode_starts": stack([np.arange(k) == 0 for k in steps], bool),
        "timesteps": stack([np.arange(k) for k in steps], np.int64),
        "returns": np.array([float(ep.rewards.sum()) for ep in episodes], np.float64),
        "env_id": np.array("" if env_spec is None else env_spec.id),
    }


def load_demos(path: Path | str, env_id: str, obs_dim: int, act_dim: int, need_states: bool) -> dict[str, np.ndarray]:
    """Load demos.npz (or minari:ID) and validate it against the env (exit 2 with one line on any mismatch)."""
    if str(path).startswith(MINARI):
        demos = read_minari(str(path)[len(MINARI):])
    else:
        try:
            with np.load(path, allow_pickle=False) as f:
                demos = {k: f[k] for k in f.files}
        except Exception as exc:  # noqa: BLE001 - any unreadable file is bad input
            fail(f"cannot read expert data {path} ({type(exc).__name__}); pass a valid npz with --expert-path or delete it to regenerate")
    missing = [k for k in REQUIRED_DEMO_KEYS if k not in demos]
    if missing:
        fail(f"{path} lacks keys {', '.join(missing)}; see 'Expert data format' in hype_irl_mujoco.py's docstring")
    if str(demos["env_id"]) != env_id:
        fail(f"{path} holds demos of {demos['env_id']}, not {env_id}; use that env's demos (--expert-path / --experts-dir)")
    o, a = demos["observations"], demos["actions"]
    if o.ndim != 2 or o.shape[1] != obs_dim or demos["next_observations"].shape != o.shape:
        fail(f"{path}: observation size {o.shape[1:] } does not match {env_id}'s {obs_dim}; use demos recorded on {env_id}")
    if a.ndim != 2 or a.shape[1] != act_dim or a.shape[0] != o.shape[0]:
        fail(f"{path}: action size {a.shape[1:]} does not match {env_id}'s {act_dim}; use demos recorded on {env_id}")
    if o.shape[0] == 0 or len(demos["returns"]) < 1:
        fail(f"{path} holds no expert episode; record at least 1 episode")
    if "timesteps" not in demos:
        starts = demos["episode_starts"].astype(bool)
        idx = np.arange(len(starts))
        demos["timesteps"] = idx - np.maximum.accumulate(np.where(starts, idx, 0))
    if need_states and any(k not in demos for k in STATE_KEYS):
        fail(f"{path} has no {'/'.join(STATE_KEYS)}, so expert-state resets are impossible; use --reset-prob 0 or record them")
    return demos


def atomic_save(obj, path: Path, save_fn=torch.save) -> None:
    """Write to a temporary file in the same directory, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_fn(obj, tmp)
    os.replace(tmp, path)


def collect_demos(env_id: str, policy, num_demos: int, max_episode_steps: int | None = None) -> dict[str, np.ndarray]:
    """Roll out `policy(obs) -> action` for complete episodes with reset seeds 0, 1, ...; record MuJoCo state."""
    env, horizon = make_env(env_id, max_episode_steps)
    low, high = env.action_space.low, env.action_space.high
    keys = ["observations", "actions", "next_observations", "rewards", "terminals", "timeouts", "episode_ids",
            "episode_starts", "timesteps", "qpos", "qvel", "qacc_warmstart"]
    buf = {k: [] for k in keys}
    returns = []
    for ep in range(num_demos):
        obs, _ = env.reset(seed=ep)
        ret = 0.0
        for t in range(horizon):
            qpos, qvel, qacc = snapshot_state(env)
            action = np.clip(np.asarray(policy(obs), dtype=np.float32), low, high)
            next_obs, reward, terminated, _, _ = env.step(action)
            truncated = t + 1 >= horizon
            for k, v in zip(keys, [obs, action, next_obs, reward, terminated, truncated, ep, t == 0, t,
                                   qpos, qvel, qacc]):
                buf[k].append(v)
            ret += float(reward)
            obs = next_obs
            if terminated:
                break
        returns.append(ret)
    env.close()
    dtypes = dict(observations=np.float32, actions=np.float32, next_observations=np.float32, rewards=np.float32,
                  terminals=bool, timeouts=bool, episode_ids=np.int64, episode_starts=bool, timesteps=np.int64,
                  qpos=np.float64, qvel=np.float64, qacc_warmstart=np.float64)
    demos = {k: np.asarray(buf[k], dtype=dtypes[k]) for k in keys}
    demos.update(returns=np.asarray(returns, np.float64), seeds=np.arange(num_demos, dtype=np.int64), env_id=np.array(env_id))
    return demos


def save_expert_cache(cache: Path, demos: dict, actor: Actor | None, meta: dict) -> None:
    """demos.npz, expert_actor.pt and expert_meta.json, each written atomically."""
    atomic_save(demos, cache / "demos.npz", lambda d, p: np.savez_compressed(open(p, "wb"), **d))
    if actor is not None:
        atomic_save({"actor": {k: v.cpu() for k, v in actor.state_dict().items()}, "obs_dim": meta["obs_dim"],
                     "act_dim": meta["act_dim"], "hidden": meta["hidden"], "env_id": meta["env_id"],
                     "total_timesteps": meta["expert_timesteps"], "mean_return": meta["return_mean"]},
                    cache / "expert_actor.pt")
    atomic_save(meta, cache / "expert_meta.json", lambda d, p: Path(p).write_text(json.dumps(d, indent=2)))


# ----------------------------------------------------------------------------------------------------------------------
# Phases
# ----------------------------------------------------------------------------------------------------------------------
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


class StopFlag:
    """SIGINT/SIGTERM set the flag; the training loop saves a checkpoint and exits cleanly."""

    def __init__(self):
        self.stop = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):  # noqa: ARG002
        self.stop = True


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, p_tremble: float, device: torch.device,
             max_episode_steps: int | None = None) -> list[float]:
    """Deterministic actions (tanh(mean) * scale + bias), trembling hand as in training (reference), true env
    return, reset seeds seed, seed + 1, ..."""
    env, horizon = make_env(env_id, max_episode_steps)
    low, high = env.action_space.low, env.action_space.high
    rng = np.random.default_rng(seed)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        ret = 0.0
        for _ in range(horizon):
            with torch.inference_mode():
                action = actor.get_action(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[2][0].cpu().numpy()
            action = tremble(action, rng, p_tremble, low, high)
            obs, reward, terminated, _, _ = env.step(action)
            ret += float(reward)
            if terminated:
                break
        returns.append(ret)
    env.close()
    return returns


def train_sac(args: Args, phase: str, budget: int, run_dir: Path, writer: SummaryWriter, device: torch.device,
              stop: StopFlag, demos: dict | None = None, expert_return: float = float("nan")) -> dict:
    """One SAC phase of `budget` policy env steps, resumable from `checkpoints/{phase}.pt`.

    phase "expert": SAC on the TRUE env reward (builds the expert when no demos are cached).
    phase "irl": HyPE. At the start of every outer iteration (each `train_every` policy steps) collect
    `disc_trajectories` fresh learner episodes (counted separately as discriminator env steps) and update f; every
    step: act, store the transition (reward column NaN), maybe reset to an expert state; every minibatch:
    round(rho * batch) expert rows + learner rows, rewards relabelled as -f(s, a) with the current f.
    Returns the learner, the discriminator, the counters and the evaluation history."""
    irl = phase == "irl"
    env, horizon = make_env(args.env_id, args.max_episode_steps)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    sac = SAC(obs_dim, act_dim, low, high, args, device)
    expert_rows, disc, expert_sa, segments = None, None, None, None
    if irl:
        n = len(demos["observations"])
        # Expert rows: reward column NaN (demo rewards never enter learning); done = the dataset's terminals only.
        expert_rows = torch.from_numpy(Storage.rows(demos["observations"], demos["actions"], demos["next_observations"],
                                                    demos["terminals"].astype(np.float32)[:, None], np.full((n, 1), np.nan)))
        expert_sa = torch.from_numpy(np.concatenate([demos["observations"], demos["actions"]], -1)).to(device)
        disc = Discriminator(obs_dim + act_dim, args.hidden_dim).to(device)
        segments = parse_rho_schedule(args.rho_schedule)
    storage = Storage(obs_dim, act_dim, min(args.buffer_size, max(budget, 1)), device, expert_rows)
    np_rng = np.random.default_rng(args.seed + (1000 if irl else 0))
    c = {"step": 0, "disc_env_steps": 0, "k": 0, "episodes": 0, "history": [], "resumed_from_step": 0, "sps": None}
    ckpt_path = run_dir / "checkpoints" / f"{phase}.pt"
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        sac.load_state_dict(ckpt["sac"])
        storage.load_learner_rows(ckpt["learner_rows"])
        if irl:
            disc.load_state_dict(ckpt["disc"])
        c.update(ckpt["counters"])
        c["resumed_from_step"] = c["step"]
        set_rng_state(ckpt["rng"])
        np_rng.bit_generator.state = ckpt["np_rng"]
        print(f"[{phase}] resuming from step {c['step']} ({ckpt_path})", flush=True)

    def save_checkpoint() -> None:
        atomic_save({"sac": sac.state_dict(), "disc": disc.state_dict() if irl else None,
                     "learner_rows": storage.learner_rows().cpu(), "counters": c, "rng": rng_state(),
                     "np_rng": np_rng.bit_generator.state, "args": asdict(args)}, ckpt_path)

    def policy_action(obs_np: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return sac.actor.get_action(torch.as_tensor(obs_np, dtype=torch.float32, device=device)[None])[0][0].cpu().numpy()

    def start_episode(e: gym.Env, reset_prob: float) -> tuple[np.ndarray, int]:
        """Reset; with probability reset_prob restore a uniformly drawn expert state, whose episode then runs for
        the expert's remaining horizon. Returns (obs, time index)."""
        obs, _ = e.reset(seed=args.seed + c["episodes"])
        c["episodes"] += 1
        if reset_prob > 0 and np_rng.random() < reset_prob:
            i = int(np_rng.integers(len(demos["observations"])))
            restore_state(e, demos["qpos"][i], demos["qvel"][i], demos["qacc_warmstart"][i])
            return demos["observations"][i].astype(np.float64), int(demos["timesteps"][i])
        return obs, 0

    def discriminator_update() -> dict[str, float]:
        """Outer iteration k: `disc_trajectories` complete episodes of the current stochastic policy from the env's
        own start distribution (trembling hand included; counted), then `disc_steps` steps of a FRESH Adam at
        lr0 / max(1, k) on disc_batch_size expert vs learner pairs."""
        pairs = []
        for _ in range(args.disc_trajectories):
            o, t = start_episode(disc_env, 0.0)
            while t < horizon:
                a = tremble(policy_action(o), np_rng, args.p_tremble, low, high)
                pairs.append(np.concatenate([o, a]).astype(np.float32))
                o, _, terminated, _, _ = disc_env.step(a)
                t += 1
                c["disc_env_steps"] += 1
                if terminated:
                    break
        learner_sa = torch.from_numpy(np.stack(pairs)).to(device)
        lr = disc_lr_at(c["k"], args.disc_lr)
        optimizer = torch.optim.Adam(disc.parameters(), lr=lr)
        for _ in range(args.disc_steps):
            x_e = expert_sa[torch.randint(0, len(expert_sa), (args.disc_batch_size,), device=device)]
            x_l = learner_sa[torch.randint(0, len(learner_sa), (args.disc_batch_size,), device=device)]
            loss, ipm, gp = discriminator_loss(disc, x_e, x_l, args.gp_weight, args.gp_target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if not torch.isfinite(loss):
            fail_nonfinite("discriminator loss")
        with torch.no_grad():
            stats = {"irl/disc_loss": loss.item(), "irl/ipm": ipm.item(), "irl/gradient_penalty": gp.item(),
                     "irl/disc_lr": lr, "irl/reward_expert": -disc(x_e).mean().item(),
                     "irl/reward_learner": -disc(x_l).mean().item(), "irl/outer_iteration": c["k"],
                     "irl/disc_env_steps": c["disc_env_steps"]}
        c["k"] += 1
        return stats

    def run_eval() -> None:
        returns = evaluate(sac.actor, args.env_id, args.eval_episodes, args.seed + 10_000, args.p_tremble, device,
                           args.max_episode_steps)
        mean, std = float(np.mean(returns)), float(np.std(returns))
        c["history"].append({"step": c["step"], "total_env_steps": c["step"] + c["disc_env_steps"], "mean": mean,
                             "std": std, "returns": returns})
        writer.add_scalar("eval/episodic_return" if irl else "expert/eval_return", mean, c["step"])
        if irl and np.isfinite(expert_return) and expert_return != 0:
            writer.add_scalar("eval/normalized_return", mean / expert_return, c["step"])

    disc_env = make_env(args.env_id, args.max_episode_steps)[0] if irl else None
    prefix = "charts" if irl else "expert"
    obs, ep_t = start_episode(env, args.reset_prob if irl else 0.0)
    ep_return, ep_len, from_expert = 0.0, 0, ep_t > 0
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    losses: dict[str, torch.Tensor] = {}
    sps_start, paused = None, 0.0  # SPS counts from the first update on (after warm-up), evaluation time excluded
    next_eval = (c["step"] // args.eval_frequency + 1) * args.eval_frequency
    rho = 0.0
    pbar = tqdm(total=budget, initial=c["step"], desc=phase, unit="step", mininterval=5, dynamic_ncols=True)
    while c["step"] < budget and not stop.stop:
        if irl and c["step"] % args.train_every == 0 and c["k"] <= c["step"] // args.train_every:
            for tag, value in discriminator_update().items():
                writer.add_scalar(tag, value, c["step"])
        learn_started = c["step"] >= args.learning_starts
        action = policy_action(obs) if learn_started else np_rng.uniform(low, high).astype(np.float32)
        action = tremble(action, np_rng, args.p_tremble, low, high)
        next_obs, reward, terminated, _, _ = env.step(action)
        ep_t += 1
        ep_return += float(reward)  # true return, for logging only in the IRL phase
        ep_len += 1
        # IRL phase: the env reward is NOT stored (NaN in its column): the learner's rewards come from f only.
        storage.add(Storage.rows(obs, action, next_obs, float(terminated), float("nan") if irl else float(reward)))
        obs = next_obs
        c["step"] += 1
        if terminated or ep_t >= horizon:
            if from_expert:  # an episode restored to an expert state: its return is partial
                writer.add_scalar("irl/reset_episodic_return", ep_return, c["step"])
            else:
                writer.add_scalar(f"{prefix}/episodic_return", ep_return, c["step"])
                writer.add_scalar(f"{prefix}/episodic_length", ep_len, c["step"])
                pbar.set_postfix(ret=f"{ep_return:.0f}", refresh=False)
            obs, ep_t = start_episode(env, args.reset_prob if irl else 0.0)
            ep_return, ep_len, from_expert = 0.0, 0, ep_t > 0

        if learn_started:
            if sps_start is None:
                sps_start = (c["step"] - 1, time.perf_counter())
            if irl:
                rho = rho_at(c["step"], segments)
                b_obs, b_act, b_next, b_done, _ = storage.sample(args.batch_size, rho)
                b_rew = relabel_rewards(disc, b_obs, b_act)
            else:
                b_obs, b_act, b_next, b_done, b_rew = storage.sample(args.batch_size, 0.0)
            losses = sac.update(b_obs, b_act, b_next, b_done, b_rew, absorbing=irl and args.terminal_reward == "min")
            nonfinite |= ~torch.isfinite(losses["qf_loss"])

        if c["step"] % args.log_frequency == 0 and losses:
            if bool(nonfinite):
                fail_nonfinite("SAC loss")
            for name, value in losses.items():
                writer.add_scalar(f"irl/{name}" if name == "relabelled_reward" else f"losses/{name}", float(value), c["step"])
            writer.add_scalar(f"{prefix}/learning_rate", args.q_lr, c["step"])
            if irl:
                writer.add_scalar("irl/rho", rho, c["step"])
                writer.add_scalar("irl/total_env_steps", c["step"] + c["disc_env_steps"], c["step"])
            if sps_start is not None and c["step"] > sps_start[0]:
                c["sps"] = (c["step"] - sps_start[0]) / max(time.perf_counter() - sps_start[1] - paused, 1e-9)
                writer.add_scalar(f"{prefix}/SPS", c["sps"], c["step"])
        if irl and c["step"] >= next_eval:
            next_eval += args.eval_frequency
            t0 = time.perf_counter()
            run_eval()
            paused += time.perf_counter() - t0
            tqdm.write(f"[{phase}] step {c['step']}: eval return {c['history'][-1]['mean']:.1f} (expert {expert_return:.1f})")
        if c["step"] % args.checkpoint_frequency == 0:
            save_checkpoint()
        pbar.update(1)
    pbar.close()
    env.close()
    if bool(nonfinite):
        fail_nonfinite("SAC loss")
    if irl and not stop.stop and (not c["history"] or c["history"][-1]["step"] != c["step"]):
        run_eval()
    save_checkpoint()
    if stop.stop:
        print(f"[{phase}] interrupted at step {c['step']}; checkpoint saved, re-run with --run-dir {run_dir} to resume",
              flush=True)
        raise SystemExit(0)
    return {"sac": sac, "disc": disc, "counters": c, "final_rho": rho}


def fail_nonfinite(what: str) -> None:
    print(f"error: non-finite {what}; lower the learning rates or check the expert data (the run stopped, last checkpoint kept)",
          file=sys.stderr)
    raise SystemExit(1)


def expert_phase(args: Args, cache: Path, run_dir: Path, writer: SummaryWriter, device: torch.device, stop: StopFlag) -> None:
    """No cached demos: train SAC on the true reward, roll out deterministic demos, write the shared cache."""
    print(f"[expert] no demos in {cache}; training a SAC expert for {args.expert_timesteps} steps", flush=True)
    actor = train_sac(args, "expert", args.expert_timesteps, run_dir, writer, device, stop)["sac"].actor

    def policy(obs):
        with torch.inference_mode():
            return actor.get_action(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[2][0].cpu().numpy()

    demos = collect_demos(args.env_id, policy, args.num_demos, args.max_episode_steps)
    returns = demos["returns"]
    meta = {"env_id": args.env_id, "expert_timesteps": args.expert_timesteps, "num_demos": args.num_demos,
            "return_mean": float(returns.mean()), "return_std": float(returns.std()), "seed": args.seed,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "hype_irl_mujoco.py",
            "num_transitions": int(len(demos["observations"])), "obs_dim": int(demos["observations"].shape[1]),
            "act_dim": int(demos["actions"].shape[1]), "hidden": args.hidden_dim}
    if (cache / "demos.npz").exists():  # another run finished first: keep its demos, never overwrite the shared cache
        print(f"[expert] {cache}/demos.npz appeared meanwhile; using it", flush=True)
        return
    save_expert_cache(cache, demos, actor, meta)
    writer.add_scalar("expert/demo_return", float(returns.mean()), args.expert_timesteps)
    print(f"[expert] {args.num_demos} demos, return {returns.mean():.1f} +- {returns.std():.1f} -> {cache}", flush=True)


def save_curve(history: list[dict], expert_return: float, path: Path, title: str) -> None:
    """Learning curve PNG: evaluation return vs policy env steps (and vs all env steps), expert line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
    means, stds = np.array([h["mean"] for h in history]), np.array([h["std"] for h in history])
    steps = [h["step"] for h in history]
    ax.plot(steps, means, marker="o", label="learner (policy env steps)")
    ax.fill_between(steps, means - stds, means + stds, alpha=0.2)
    ax.plot([h["total_env_steps"] for h in history], means, ls="--", alpha=0.6, label="learner (incl. discriminator steps)")
    if np.isfinite(expert_return):
        ax.axhline(expert_return, color="k", ls=":", label="expert demos")
    ax.set_xlabel("env steps")
    ax.set_ylabel("true return (deterministic eval)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_save(fig, path, lambda f, p: f.savefig(p, format="png"))
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------------------------
def validate(args: Args) -> tuple[Path, Path, dict | None]:
    """Every documented failure exits 2 here, before anything is written. Returns (run_dir, cache dir, demos or None)."""
    if args.env_id not in gym.registry:
        close = difflib.get_close_matches(args.env_id, list(gym.registry), n=3)
        fail(f"unknown env id {args.env_id!r}; did you mean {', '.join(close) or 'Hopper-v5'}? (--env-id)")
    try:
        env, _ = make_env(args.env_id)
    except Exception as exc:  # noqa: BLE001 - e.g. mujoco missing
        fail(f"cannot create {args.env_id} ({type(exc).__name__}); install gymnasium[mujoco] or pick another --env-id")
    if not hasattr(env.unwrapped, "data") or not isinstance(env.action_space, gym.spaces.Box):
        fail(f"{args.env_id} is not a continuous-action MuJoCo env; pass e.g. --env-id Hopper-v5")
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    for name in ("total_timesteps", "expert_timesteps", "batch_size", "buffer_size", "train_every", "disc_batch_size",
                 "disc_trajectories", "disc_steps", "eval_frequency", "eval_episodes", "log_frequency",
                 "checkpoint_frequency", "num_demos", "policy_frequency", "hidden_dim"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        fail("--max-episode-steps must be >= 1")
    if args.torch_threads < 0:
        fail("--torch-threads must be >= 0 (0 = torch's default)")
    for name in ("reset_prob", "p_tremble"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            fail(f"--{name.replace('_', '-')} must lie in [0, 1]")
    if args.terminal_reward not in ("min", "none"):
        fail(f"--terminal-reward must be 'min' or 'none', not {args.terminal_reward!r}")
    if args.rho_schedule is None:
        args.rho_schedule = RHO_SCHEDULES.get(args.env_id.split("-")[0], DEFAULT_RHO_SCHEDULE)
    try:
        parse_rho_schedule(args.rho_schedule)
    except ValueError as exc:
        fail(str(exc))
    if args.eval_only is not None:
        if not (Path(args.eval_only) / "checkpoints" / "irl.pt").is_file():
            fail(f"--eval-only {args.eval_only} has no checkpoints/irl.pt; pass the run dir of an IRL run")
        return Path(args.eval_only), Path(args.experts_dir) / args.env_id, None

    run_dir = Path(args.run_dir or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    if (run_dir / "results.json").exists():
        fail(f"{run_dir} already holds a finished run (results.json); choose a new --run-dir")
    if (run_dir / "args.json").exists():
        previous = json.loads((run_dir / "args.json").read_text())
        if previous.get("env_id") != args.env_id:
            fail(f"{run_dir} holds a {previous.get('env_id')} run, not {args.env_id}; choose a new --run-dir")
    elif run_dir.exists() and any(run_dir.iterdir()):
        fail(f"{run_dir} exists and is not a run of this script; choose a new --run-dir")

    cache = Path(args.experts_dir) / args.env_id
    if args.expert_path is not None:
        if not args.expert_path.startswith(MINARI) and not Path(args.expert_path).is_file():
            fail(f"--expert-path {args.expert_path} does not exist; pass a demos.npz (see 'Expert data format')")
        demos = load_demos(args.expert_path, args.env_id, obs_dim, act_dim, args.reset_prob > 0)
    elif (cache / "demos.npz").exists():
        demos = load_demos(cache / "demos.npz", args.env_id, obs_dim, act_dim, args.reset_prob > 0)
    else:
        demos = None
    return run_dir, cache, demos


def eval_only(args: Args, run_dir: Path, device: torch.device) -> list[float]:
    """Evaluate the learner of a run's checkpoint; prints the returns, writes nothing."""
    ckpt = torch.load(run_dir / "checkpoints" / "irl.pt", map_location=device, weights_only=False)
    env, _ = make_env(args.env_id)
    actor = Actor(env.observation_space.shape[0], env.action_space.shape[0], env.action_space.low, env.action_space.high,
                  args.hidden_dim).to(device)
    env.close()
    actor.load_state_dict(ckpt["sac"]["actor"])
    returns = evaluate(actor, args.env_id, args.eval_episodes, args.seed + 10_000, args.p_tremble, device, args.max_episode_steps)
    print(json.dumps({"run_dir": str(run_dir), "eval_mean_return": float(np.mean(returns)),
                      "eval_std_return": float(np.std(returns)), "eval_returns": returns}))
    return returns


def main(args: Args) -> dict | None:
    run_dir, cache, demos = validate(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    keep_freed_memory()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_only is not None:
        eval_only(args, run_dir, device)
        return None

    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "args.json").exists():
        atomic_save(asdict(args), run_dir / "args.json", lambda d, p: Path(p).write_text(json.dumps(d, indent=2)))
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
                   name=run_dir.name, save_code=True)
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    stop = StopFlag()
    stop.install()
    start = time.time()

    if demos is None:
        expert_phase(args, cache, run_dir, writer, device, stop)
        env, _ = make_env(args.env_id)
        demos = load_demos(cache / "demos.npz", args.env_id, env.observation_space.shape[0], env.action_space.shape[0],
                           args.reset_prob > 0)
        env.close()
    expert_return = float(np.mean(demos["returns"]))
    method = "HyPE+FILTER" if args.reset_prob > 0 else "HyPE"
    print(f"[irl] {method}: {len(demos['returns'])} expert episodes, {len(demos['observations'])} transitions, mean "
          f"return {expert_return:.1f}; rho schedule {args.rho_schedule}, reset_prob {args.reset_prob}", flush=True)

    out = train_sac(args, "irl", args.total_timesteps, run_dir, writer, device, stop, demos, expert_return)
    c = out["counters"]
    final = c["history"][-1]
    results = {
        "env_id": args.env_id, "method": method, "seed": args.seed, "eval_mean": final["mean"], "eval_std": final["std"],
        "eval_returns": final["returns"], "eval_episodes": args.eval_episodes, "expert_return": expert_return,
        "normalized_return": final["mean"] / expert_return if expert_return else float("nan"),
        "num_demos": int(len(demos["returns"])), "policy_env_steps": c["step"], "disc_env_steps": c["disc_env_steps"],
        "total_env_steps": c["step"] + c["disc_env_steps"], "outer_iterations": c["k"], "SPS": c["sps"],
        "rho_schedule": args.rho_schedule, "final_rho": out["final_rho"], "reset_prob": args.reset_prob,
        "p_tremble": args.p_tremble, "terminal_reward": args.terminal_reward, "resumed_from_step": c["resumed_from_step"],
        "wall_time_s": time.time() - start, "device": str(device), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "history": [{k: h[k] for k in ("step", "total_env_steps", "mean", "std")} for h in c["history"]],
    }
    save_curve(c["history"], expert_return, run_dir / "learning_curve.png", f"{method} on {args.env_id}")
    if args.save_model:
        atomic_save(out["sac"].actor.state_dict(), run_dir / f"{args.exp_name}.cleanrl_model")
    atomic_save(results, run_dir / "results.json", lambda d, p: Path(p).write_text(json.dumps(d, indent=2)))
    writer.close()
    print(f"[irl] final return {final['mean']:.1f} +- {final['std']:.1f} (expert {expert_return:.1f}) -> {run_dir}", flush=True)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
