"""PPO with Random Network Distillation (RND) exploration on Atari, data-parallel with torchrun.

RND adds an exploration bonus to PPO: the error of a trained predictor imitating a fixed, random target network on
the (whitened, last-frame) next observation; novel frames are predicted badly and earn a lot. The bonus is divided by
a running std of its discounted return (filtered forward in TIME per env), is non-episodic, has its own value head,
and the policy is trained on A = 2 * A_ext + 1 * A_int. Paper: Burda, Edwards, Storkey, Klimov (2019), "Exploration
by Random Network Distillation", ICLR (arXiv 1810.12894). Defaults: its Table 5 and OpenAI's code (CNN). Usage:
    python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4             # the paper's setting (~2B frames)
    python rnd_ppo_atari.py --ppo.num-envs 8 --ppo.num-steps 32 --rnd.num-iterations-obs-norm-init 2 \\
        --ppo.total-timesteps 20000 --eval.episodes 1                          # minutes on a laptop CPU
    python rnd_ppo_atari.py --run-dir runs/X ...     # the same command again resumes;  --eval-only runs/X evaluates
    torchrun --nproc-per-node 8 rnd_ppo_atari.py --rnd.update-proportion 0.03125   # 8 x 128 envs, the paper's scale
Flags, the run directory, the deliberate differences from OpenAI's code: docs/rnd_ppo_atari.md. The algorithm reads top
to bottom down to `train`; below `# ---- run management ----`: main (validation, train, the final evaluation, exit
codes), checkpoints, evaluation, plots, torchrun glue.
"""

import contextlib
import copy
import ctypes
import dataclasses
import difflib
import json
import os
import random
import re
import shlex
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from torch.distributions import Categorical
from tqdm import tqdm


def ranged(default, low: float, high: float):
    """A flag's default and the range [low, high] it must lie in (checked before any work: exit 2; NaN fails)."""
    return field(default=default, metadata={"range": (low, high)})


@dataclass
class EnvArgs:
    sticky_action_prob: float = ranged(0.25, 0, 1)  # ALE repeat_action_probability, per emulator frame (paper: 0.25)
    max_episode_frames: int = ranged(18_000, 4, 1e8)
    """episode cap in emulator frames (paper: 18K); the cap counts as a terminal"""
    env_threads: int = ranged(0, 0, 1024)  # C++ threads of the vector env (0 = one per core)
    track_rooms: bool = True  # Montezuma/Pitfall: train on Python envs that read the room from RAM (same frames)


@dataclass
class PPOArgs:
    total_timesteps: int = ranged(491_520_000, 1, 1e12)
    """agent steps over all envs and ranks; the run ends with the first whole iteration that reaches them (paper:
    0.49B = 1.97B frames)"""
    learning_rate: float = ranged(1e-4, 1e-12, 1)  # Adam learning rate (paper: 1e-4, constant)
    anneal_lr: bool = False  # anneal the learning rate linearly to 0 (CleanRL does; the paper and OpenAI do not)
    adam_eps: float = ranged(1e-8, 1e-12, 1)  # Adam epsilon (OpenAI's MpiAdam: 1e-8)
    num_envs: int = ranged(128, 1, 4096)
    """parallel environments PER RANK (torchrun --nproc-per-node N gives N x num_envs)"""
    num_steps: int = ranged(128, 1, 1e5)  # rollout length per env per iteration
    gamma: float = ranged(0.999, 0, 1)  # extrinsic discount gamma_E (episodic)
    gae_lambda: float = ranged(0.95, 0, 1)  # GAE lambda for both streams
    num_minibatches: int = ranged(4, 1, 4096)
    """minibatches per epoch; each is a slice of num_envs / num_minibatches whole envs"""
    update_epochs: int = ranged(4, 1, 1000)  # PPO epochs per iteration
    norm_adv: bool = False  # normalise advantages per minibatch (the paper and OpenAI do not)
    clip_coef: float = ranged(0.1, 1e-6, 10)  # PPO clip range epsilon (ratio in [0.9, 1.1])
    ent_coef: float = ranged(0.001, 0, 100)  # entropy bonus coefficient (0 = off)
    vf_coef: float = ranged(1.0, 0, 100)
    """value loss weight on 0.5 * (MSE_ext + MSE_int) (OpenAI: 1.0, no value clipping)"""
    max_grad_norm: float = ranged(0.0, 0, 1e6)  # global gradient-norm clip (0 = off, as the paper's runs; CleanRL: 0.5)
    target_score: Optional[float] = ranged(None, -1e12, 1e12)
    """stop when the mean score of the last --ppo.target-score-window episodes"""
    target_score_window: int = ranged(100, 1, 1e6)
    """episodes (per rank) averaged for --ppo.target-score and avg_episodic_return"""


@dataclass
class RNDArgs:
    int_gamma: float = ranged(0.99, 0, 1)  # intrinsic discount gamma_I (non-episodic)
    ext_coef: float = ranged(2.0, 0, 1e6)  # coefficient of the EXTRINSIC advantage
    int_coef: float = ranged(1.0, 0, 1e6)
    """coefficient of the INTRINSIC advantage (0 = plain PPO: no bonus, predictor not trained)"""
    update_proportion: float = ranged(0.25, 1e-9, 1)
    """fraction of each minibatch the predictor trains on (paper: 0.25 at 128 envs)"""
    num_iterations_obs_norm_init: int = ranged(50, 0, 1e6)
    """random-agent rollouts that initialise the observation normaliser (0 = off)"""
    obs_clip: float = ranged(5.0, 1e-6, 1e6)  # whitened RND inputs are clipped to [-obs_clip, obs_clip]


@dataclass
class PolicyArgs:
    rnn_hidden_layers: int = ranged(0, 0, 16)
    """0 = CNN policy (paper Table 5); k > 0 = a k-layer GRU after the encoder (Fig. 7)"""
    rnn_hidden_size: int = ranged(256, 1, 65536)  # GRU width


@dataclass
class EvalArgs:
    episodes: int = ranged(10, 0, 1e5)
    """evaluation episodes at the end of training (stochastic policy, as trained; 0 = none)"""
    every: int = ranged(0, 0, 1e9)  # also evaluate every this many iterations (0 = only at the end)
    num_envs: int = ranged(32, 1, 256)  # episodes played at once (each env plays every num_envs-th)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # the name of this experiment
    seed: int = ranged(1, 0, 4294967295)
    """seed of the experiment (rank r of a torchrun job uses seed + r for its envs and sampling)"""
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # use the GPU when one is present (falls back to the CPU)
    track: bool = False  # log to Weights and Biases as well (needs `wandb`)
    wandb_project_name: str = "cleanRL"  # the wandb's project name
    wandb_entity: Optional[str] = None  # the entity (team) of wandb's project
    capture_video: bool = False  # record the first episode of each evaluation to videos/ (VP9 WebM)
    env_id: str = "MontezumaRevengeNoFrameskip-v4"  # MontezumaRevengeNoFrameskip-v4 or ALE/MontezumaRevenge-v5
    run_dir: Optional[str] = None  # default runs/{env_id}__{exp_name}__{seed}__{unix_time}; an existing one resumes
    eval_only: Optional[str] = None  # evaluate RUN_DIR/policy.pt and write RUN_DIR/evaluations/eval_NNN.json
    checkpoint_every: int = ranged(10, 1, 1e9)
    """iterations between snapshots (also written at the end and on SIGINT/SIGTERM)"""
    keep_checkpoints: int = ranged(3, 1, 1e6)  # snapshots kept in checkpoints/ (older ones are deleted)
    progress_bar: bool = True  # show progress (tqdm on a terminal; a plain line every 30 s in a log file)
    torch_threads: int = ranged(0, 0, 1024)
    """torch CPU threads (0 = torch's default); use 1 on a CPU shared with other jobs"""
    env: EnvArgs = field(default_factory=EnvArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    rnd: RNDArgs = field(default_factory=RNDArgs)
    policy: PolicyArgs = field(default_factory=PolicyArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


# ---- Environments
def make_envs(env_args: EnvArgs, rom: str, num_envs: int, seed: int):
    """ale-py's C++ vector env with every semantic choice of the paper set explicitly.
    Same-step autoreset: a done step returns the reset observation and puts the true
    last one in info["final_obs"] (no wasted transition). Games with a room byte and
    --env.track-rooms: RoomEnvs, the same frames from Python envs, rooms in info."""
    if env_args.track_rooms and rom in ROOM_RAM_ADDRESS:
        return RoomEnvs(env_args, rom, num_envs, seed)
    from ale_py.vector_env import AtariVectorEnv

    envs = AtariVectorEnv(
        game=rom,
        num_envs=num_envs,
        grayscale=True,
        img_height=84,
        img_width=84,
        repeat_action_probability=env_args.sticky_action_prob,
        full_action_space=False,
        max_num_frames_per_episode=env_args.max_episode_frames,
        num_threads=env_args.env_threads,
        noop_max=0,  # Table 2: no random starts, no FireReset
        use_fire_reset=False,
        episodic_life=False,
        reward_clipping=False,
        autoreset_mode="SameStep",
        frameskip=4,
        maxpool=True,
        stack_num=4,
    )
    # making and seeding 128 emulators are two C++ calls of ~10 CPU-s each, which no signal interrupts: check between
    check_stop("during the env start-up")
    envs.reset(seed=emulator_seeds(envs, seed))
    return envs


def emulator_seeds(envs, seed: int) -> np.ndarray:
    """seed, seed + 1, ... one per env. ale-py's vector env takes 32-bit seeds: wrapped below 2**31 there (unchanged
    below it), so a large --seed never overflows it; RoomEnvs' Python envs take any seed, as they always did."""
    seeds = np.arange(seed, seed + envs.num_envs, dtype=np.int64)
    return seeds if isinstance(envs, RoomEnvs) else seeds % 2**31


# The RAM byte holding the current room, as OpenAI's MontezumaInfoWrapper reads it;
# rooms are logged for these games only.
ROOM_RAM_ADDRESS = {"montezuma_revenge": 3, "pitfall": 1}


def rom_to_camel(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


def make_python_env(env_args: EnvArgs, rom: str, seed: int, render: bool = False):
    """One gymnasium env with make_envs' preprocessing (a zero-padded frame stack, as
    ale-py's vector env), whose RAM can be read: evaluation and RoomEnvs use it."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(
        f"ALE/{rom_to_camel(rom)}-v5",
        render_mode="rgb_array" if render else None,
        repeat_action_probability=env_args.sticky_action_prob,
        frameskip=1,
        full_action_space=False,
        max_num_frames_per_episode=env_args.max_episode_frames,
    )
    env = gym.wrappers.AtariPreprocessing(env, noop_max=0, frame_skip=4, terminal_on_life_loss=False)
    env = gym.wrappers.FrameStackObservation(env, 4, padding_type="zero")
    env.reset(seed=seed)
    return env


class RoomEnvs:
    """make_envs' vector env (same frames, episode ends, same-step autoreset and final_obs)
    stepped one env at a time in Python, so each env's room can be read from RAM:
    info["room"] (N,) is the room after the step (before an autoreset)."""

    def __init__(self, env_args: EnvArgs, rom: str, num_envs: int, seed: int):
        self.envs = []
        for i in range(num_envs):  # ~0.3 s each on a busy CPU: a signal stops it between two
            check_stop("during the env start-up")
            self.envs.append(make_python_env(env_args, rom, seed + i))
        self.num_envs, self.ram_addr = num_envs, ROOM_RAM_ADDRESS[rom]
        self.single_action_space = self.envs[0].action_space

    def reset(self, seed=None):
        """seed: one per env, or an int s for s, s + 1, ... (None: not reseeded)."""
        if seed is None or isinstance(seed, (int, np.integer)):
            seed = [None] * self.num_envs if seed is None else range(seed, seed + self.num_envs)
        return np.stack([e.reset(seed=None if s is None else int(s))[0] for e, s in zip(self.envs, seed)]), {}

    def step(self, actions: np.ndarray):
        obs, final_obs, info = [], {}, {"room": np.zeros(self.num_envs, dtype=np.int64)}
        rewards, terms, truncs = (np.zeros(self.num_envs, dtype=t) for t in (np.int32, bool, bool))
        for i, env in enumerate(self.envs):
            o, rewards[i], terms[i], truncs[i], _ = env.step(int(actions[i]))
            info["room"][i] = env.unwrapped.ale.getRAM()[self.ram_addr]
            if terms[i] or truncs[i]:
                final_obs[i] = o
                o, _ = env.reset()
            obs.append(o)
        obs = np.stack(obs)
        if final_obs:
            info["final_obs"] = np.zeros_like(obs)
            info["final_obs"][list(final_obs)] = np.stack(list(final_obs.values()))
        return obs, rewards, terms, truncs, info

    def send(self, actions: np.ndarray):  # the vector env's split step, done at recv
        self.actions = actions

    def recv(self):
        return self.step(self.actions)

    def close(self):
        for env in self.envs:
            env.close()


# ---- Networks
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def conv_encoder(in_channels: int, last_kernel: int, activation) -> nn.Sequential:
    """Conv 32-8-4, 64-4-2, 64-k-1, each followed by the activation, then flatten."""
    return nn.Sequential(
        layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)),
        activation(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        activation(),
        layer_init(nn.Conv2d(64, 64, last_kernel, stride=1)),
        activation(),
        nn.Flatten(),
    )


class Agent(nn.Module):
    """OpenAI's policy: x/255 -> conv 32-8-4, 64-4-2, 64-4-1 -> fc 256 [-> GRU] -> fc 448 = X;
    value trunk X + relu(fc(X)) -> (V_ext, V_int); action trunk X + relu(fc(X)) -> logits.
    Channels-last weights and activations: oneDNN's CPU convolutions ran ~1.4x faster."""

    def __init__(self, n_actions: int, rnn_hidden_layers=0, rnn_hidden_size=256, env_id=""):
        super().__init__()
        self.env_id, self.env_config, self.act_state = env_id, {}, None
        self.config = dict(
            n_actions=int(n_actions),
            rnn_hidden_layers=rnn_hidden_layers,
            rnn_hidden_size=rnn_hidden_size,
        )
        self.encoder = nn.Sequential(
            *conv_encoder(4, 4, nn.ReLU),
            layer_init(nn.Linear(64 * 6 * 6, 256)),
            nn.ReLU(),
        )
        self.rnn_layers, self.rnn_size = rnn_hidden_layers, rnn_hidden_size
        self.rnn = None
        if rnn_hidden_layers > 0:
            self.rnn = nn.GRU(256, rnn_hidden_size, num_layers=rnn_hidden_layers)
        fc_in = rnn_hidden_size if self.rnn else 256
        self.fc = nn.Sequential(layer_init(nn.Linear(fc_in, 448)), nn.ReLU())
        self.value_trunk = layer_init(nn.Linear(448, 448), std=0.1)
        self.action_trunk = layer_init(nn.Linear(448, 448), std=0.1)
        self.actor = layer_init(nn.Linear(448, n_actions), std=0.01)
        self.critic_ext = layer_init(nn.Linear(448, 1), std=0.01)
        self.critic_int = layer_init(nn.Linear(448, 1), std=0.01)
        self.to(memory_format=torch.channels_last)

    def initial_state(self, batch: int, device) -> torch.Tensor:
        """Recurrent state (layers, batch, size); an empty tensor for the CNN policy."""
        return torch.zeros(self.rnn_layers, batch, self.rnn_size, device=device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor):
        """obs (T, B, 4, 84, 84) uint8 in any memory layout; first (T, B) = 1 where obs
        starts an episode (the GRU state is zeroed there). Returns logits (T*B, A),
        v_ext (T*B,), v_int (T*B,) and the state after step T."""
        T, B = obs.shape[:2]
        frames = obs.reshape(T * B, *obs.shape[2:])
        frames = frames.contiguous(memory_format=torch.channels_last)  # uint8: cheap
        x = self.encoder(frames.float() / 255.0)
        if self.rnn is not None:
            x, outs = x.view(T, B, -1), []
            for t in range(T):
                state = state * (1.0 - first[t]).view(1, B, 1)
                out, state = self.rnn(x[t : t + 1], state)
                outs.append(out)
            x = torch.cat(outs).view(T * B, -1)
        h = self.fc(x)
        hv = h + torch.relu(self.value_trunk(h))
        ha = h + torch.relu(self.action_trunk(h))
        v_ext, v_int = self.critic_ext(hv).squeeze(-1), self.critic_int(hv).squeeze(-1)
        return self.actor(ha), v_ext, v_int, state

    @torch.no_grad()
    def act(self, obs: np.ndarray, first: Optional[np.ndarray] = None) -> np.ndarray:
        """A batch of env observations (N, 4, 84, 84) uint8 -> sampled actions (N,). The GRU
        policy keeps its state between calls; first (N,) = True resets it where an episode
        starts."""
        device = next(self.parameters()).device
        if self.act_state is None or self.act_state.shape[1] != len(obs):
            self.act_state, first = self.initial_state(len(obs), device), np.ones(len(obs))
        first = np.zeros(len(obs)) if first is None else first
        first = torch.as_tensor(first, dtype=torch.float32, device=device)
        obs = torch.as_tensor(obs, device=device)
        logits, _, _, self.act_state = self(obs[None], self.act_state, first[None])
        return Categorical(logits=logits).sample().cpu().numpy()


class RNDModel(nn.Module):
    """Fixed random target f (convs -> linear 512) and trained predictor f^
    (convs -> 512 -> 512 -> 512)."""

    def __init__(self, out_size: int = 512):
        super().__init__()
        self.target = nn.Sequential(
            conv_encoder(1, 3, nn.LeakyReLU),
            layer_init(nn.Linear(3136, out_size)),
        )
        head = [
            layer_init(nn.Linear(3136, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, 512)),
            nn.ReLU(),
        ]
        self.predictor = nn.Sequential(
            conv_encoder(1, 3, nn.LeakyReLU),
            *head,
            layer_init(nn.Linear(512, out_size)),
        )
        self.target.requires_grad_(False)
        self.to(memory_format=torch.channels_last)  # as Agent (1-channel inputs: already NHWC)

    def errors(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample bonus/loss on whitened frames x (B, 1, 84, 84)."""
        with torch.no_grad():
            target = self.target(x)
        return rnd_errors(self.predictor(x), target)


# ---- The math, as pure functions
def rnd_errors(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||f^(s) - f(s)||^2 averaged over features (OpenAI's reduce_mean; CleanRL and jcwleo
    use sum/2, 256x larger)."""
    return (prediction - target).pow(2).mean(dim=-1)


def normalize_frames(frames: torch.Tensor, mean, var, clip: float) -> torch.Tensor:
    """uint8 frames (..., 84, 84) -> clip((x - mu) / sigma, -clip, clip) as float (..., 1, 84, 84)."""
    x = (frames.float() - mean) / torch.sqrt(var + 1e-8)
    return x.clamp(-clip, clip).unsqueeze(-3)


def merge_moments(mean_a, var_a, count_a, mean_b, var_b, count_b):
    """Combine two (mean, population variance, count) summaries (Chan et al.'s formula)."""
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2 = var_a * count_a + var_b * count_b + delta.pow(2) * (count_a * count_b / count)
    return mean, m2 / count, count


def discounted_reward_filter(rewards: torch.Tensor, state: torch.Tensor, gamma: float):
    """R_t = gamma * R_{t-1} + r_t over TIME (dim 0), separately for each env (dim 1), never
    reset at episode ends. rewards (T, N), state (N,) from the previous rollout ->
    (filtered (T, N), new state (N,)). CleanRL's #360 bug ran this over envs; with T != N
    the shapes here make that impossible to repeat silently."""
    out = torch.empty_like(rewards)
    for t in range(rewards.shape[0]):
        state = state * gamma + rewards[t]
        out[t] = state
    return out, state


def compute_gae(rewards, values, firsts, next_value, next_first, gamma: float, lam: float):
    """GAE over (T, N) tensors. firsts[t] = 1 when obs t starts an episode (so step t-1 was
    terminal); zeros for the non-episodic intrinsic stream. Returns (advantages, returns)."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        nonterminal = 1.0 - (next_first if t == T - 1 else firsts[t + 1])
        v_next = next_value if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * v_next * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        advantages[t] = last
    return advantages, advantages + values


def ppo_policy_loss(new_logprob, old_logprob, advantages, clip_coef: float):
    """Clipped surrogate; also returns approx_kl (k3) and the clip fraction, as tensors."""
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    approx_kl = ((ratio - 1) - logratio).mean()
    clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return torch.max(pg_loss1, pg_loss2).mean(), approx_kl, clipfrac


def predictor_subsample(batch: int, proportion: float, device) -> torch.Tensor:
    """Indices of the round(proportion * batch) samples (at least 1) the predictor trains on."""
    k = max(1, int(round(proportion * batch)))
    return torch.randperm(batch, device=device)[:k]


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    var = target.var()
    return torch.where(var > 0, 1 - (target - pred).var() / var, torch.zeros_like(var))


class RunningMeanStd:
    """Running mean / population variance of tensors of a fixed shape, merged across ranks."""

    def __init__(self, shape=(), device="cpu"):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = 1e-4

    def update_from_sums(self, total, total_sq, count: float, world: "World"):
        """Fold in a batch given by its sum, sum of squares and count, summed over ranks
        first. Every rank adds the same count: the global count needs no device sync."""
        packed = torch.cat([total.reshape(-1), total_sq.reshape(-1)]).double()
        packed = world.all_reduce_sum(packed)
        n, size = count * world.size, total.numel()
        mean = packed[:size].view_as(self.mean) / n
        var = (packed[size:].view_as(self.mean) / n - mean.pow(2)).clamp_min(0.0)
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, mean, var, n)

    def update(self, x: torch.Tensor, world: "World"):
        """x: (batch, *shape)."""
        x = x.double()
        self.update_from_sums(x.sum(0), x.pow(2).sum(0), float(x.shape[0]), world)

    def state_dict(self):
        return {"mean": self.mean.cpu(), "var": self.var.cpu(), "count": self.count}

    def load_state_dict(self, state: dict):
        self.mean = state["mean"].to(self.mean.device)
        self.var = state["var"].to(self.var.device)
        self.count = state["count"]


def intrinsic_rewards(raw, filter_state, reward_rms: RunningMeanStd, gamma: float, world):
    """The bonus PPO sees: raw (T, N) divided by the running std of its discounted return
    (filtered over time per env; all T*N filtered values update the statistics), with no
    mean subtraction. Returns (rewards, filter state)."""
    filtered, filter_state = discounted_reward_filter(raw, filter_state, gamma)
    reward_rms.update(filtered.reshape(-1), world)
    return raw / torch.sqrt(reward_rms.var.float()).clamp_min(1e-8), filter_state


# ---- How a run ends early (main turns these into exit codes 3 and 130); progress bars
class NonFiniteLoss(Exception):
    """A loss or statistic became NaN or infinite: main exits 3."""


class Interrupted(Exception):
    """SIGINT/SIGTERM: a snapshot was saved; main exits 130."""


STOP = {"signal": 0, "solo": True}  # set by the SIGINT/SIGTERM handler that start_run installs


def check_stop(where: str) -> None:
    """Inside an iteration (the rollout, each PPO minibatch, each evaluation step): a signal stops a single-process
    run at once (train then saves the snapshot of the last whole iteration). The ranks of a torchrun job stop
    together at the end of an iteration instead (each checks its flag there; stopping apart would hang them)."""
    if STOP["signal"] and STOP["solo"]:
        raise Interrupted(f"stopped by signal {where}")


PROGRESS_EVERY_S = 30.0  # stderr not a terminal (a log file): a plain progress line this often, no tqdm bars


class Progress:
    """tqdm's bar on a terminal. Where stderr is not one (a log file): one plain line every PROGRESS_EVERY_S seconds
    and one at the end, never tqdm's carriage-return bars (they flood a redirected log). Nothing when not enabled."""

    def __init__(self, total: int, desc: str, enabled: bool, initial: int = 0):
        self.lines = enabled and not sys.stderr.isatty()
        bar = dict(total=total, initial=initial, desc=desc, unit="step", mininterval=2.0)
        self.bar = tqdm(**bar, disable=self.lines or not enabled)
        self.total, self.desc, self.n, self.n0, self.postfix = total, desc, initial, initial, ""
        self.t0 = self.last = time.monotonic()

    def update(self, n: int, **postfix) -> None:
        """n more steps done; postfix: the latest values to show (SPS, return, ...)."""
        self.n += n
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix(**postfix)
            self.postfix = "".join(f", {k} {v}" for k, v in postfix.items())
        if self.lines and time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.show()

    def show(self) -> None:
        self.last = time.monotonic()
        rate = (self.n - self.n0) / max(self.last - self.t0, 1e-9)
        done = f"{self.n}/{self.total} ({100 * self.n / max(self.total, 1):.0f} %, {rate:.0f} steps/s)"
        print(f"{self.desc}: {done}{self.postfix}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()
        if self.lines and self.n != self.n0:
            self.show()
            self.n0 = self.n


# ---- Phases: observation-normaliser warm-up, then training (rollout, bonus, PPO update)
def init_obs_normalization(envs, obs_rms: RunningMeanStd, args: Args, world: "World", writer):
    """Whiten RND inputs from random-agent steps (paper: 50 rollouts x 128 steps per env, last
    frame only). One (num_envs, 84, 84) batch per vector step is summed in float64 while the
    next step already runs in C++ threads."""
    steps, started = args.rnd.num_iterations_obs_norm_init * args.ppo.num_steps, time.perf_counter()
    rng = np.random.default_rng(args.seed + 7919 * world.rank)
    n_actions, num_envs = envs.single_action_space.n, args.ppo.num_envs
    all_steps = steps * num_envs * world.size
    total, total_sq = np.zeros((84, 84)), np.zeros((84, 84))
    obs, *_ = envs.step(rng.integers(0, n_actions, size=num_envs))
    show = args.progress_bar and world.rank == 0
    with contextlib.closing(Progress(all_steps, "obs-norm warm-up", show)) as bar:
        for i in range(steps):
            frames = obs[:, -1].astype(np.float32)  # copy before the next step reuses the buffer
            envs.send(rng.integers(0, n_actions, size=num_envs))
            total += frames.sum(0)
            total_sq += np.einsum("nij,nij->ij", frames, frames)
            obs, *_ = envs.recv()
            bar.update(num_envs * world.size)
            if STOP["signal"]:
                where = "during the observation-normalisation warm-up"
                raise Interrupted(f"stopped {where} (nothing to save)")
    total, total_sq = (torch.from_numpy(x).to(obs_rms.mean.device) for x in (total, total_sq))
    obs_rms.update_from_sums(total, total_sq, steps * num_envs, world)
    if writer is not None:
        seconds = time.perf_counter() - started
        writer.add_scalar("charts/obs_norm_warmup_seconds", seconds, 0)
        rate = f"{all_steps} random steps in {seconds:.1f} s ({all_steps / seconds:.0f} steps/s)"
        print(f"obs-norm warm-up: {rate}", flush=True)


class Rollout:
    """One rollout's buffers. Frames are stored channels-last (T, N, 84, 84, 4): a minibatch
    of env slices is one contiguous index_select that the networks read as an NHWC view."""

    def __init__(self, T: int, N: int, device):
        self.obs = torch.zeros((T, N, 84, 84, 4), dtype=torch.uint8, device=device)
        # the last frame of each next observation: what the bonus scores
        self.next_frames = torch.zeros((T, N, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((T, N), device=device)
        self.ext_rewards = torch.zeros((T, N), device=device)
        self.firsts = torch.zeros((T, N), device=device)
        self.v_ext = torch.zeros((T, N), device=device)
        self.v_int = torch.zeros((T, N), device=device)
        self.state0 = None  # GRU state at the rollout's start


class Player:
    """The envs and what carries over between rollouts: next observation, episode starts,
    GRU state, scores, and with RoomEnvs the rooms (of this process, and of each episode)."""

    def __init__(self, envs, agent: Agent, seed: int, device):
        obs, _ = envs.reset(seed=emulator_seeds(envs, seed))
        self.envs, self.device = envs, device
        self.next_obs = torch.tensor(obs, device=device)
        self.next_first = torch.ones(envs.num_envs, device=device)
        self.state = agent.initial_state(envs.num_envs, device)
        self.score = np.zeros(envs.num_envs)
        self.length = np.zeros(envs.num_envs, dtype=np.int64)
        self.rooms, self.episode_rooms = set(), [set() for _ in range(envs.num_envs)]

    def rollout(self, agent: Agent, buf: Rollout) -> list:
        """num_steps steps of every env; per step, the only host<->device traffic is the
        actions out and the frames in. Returns the finished episodes (step, score, length,
        distinct rooms or None)."""
        buf.state0, episodes = self.state.clone(), []
        for step in range(buf.actions.shape[0]):
            check_stop("during a rollout")
            buf.obs[step] = self.next_obs.permute(0, 2, 3, 1)
            buf.firsts[step] = self.next_first
            with torch.no_grad():
                logits, buf.v_ext[step], buf.v_int[step], self.state = agent(
                    self.next_obs[None], self.state, self.next_first[None]
                )
                dist = Categorical(logits=logits)
                action = dist.sample()
            buf.actions[step], buf.logprobs[step] = action, dist.log_prob(action)
            obs, reward, term, trunc, info = self.envs.step(action.cpu().numpy())
            done = term | trunc  # no life-loss terminals: final_obs is valid for every done env
            last = obs[:, -1].copy()
            if done.any():  # the bonus is on the true last frame, not the reset one
                last[done] = info["final_obs"][done, -1]
            buf.next_frames[step] = torch.from_numpy(last).to(self.device, non_blocking=True)
            self.next_obs = torch.tensor(obs, device=self.device)
            self.next_first = torch.as_tensor(done, dtype=torch.float32, device=self.device)
            clipped = np.sign(reward)
            buf.ext_rewards[step] = torch.as_tensor(clipped, dtype=torch.float32, device=self.device)
            self.score, self.length = self.score + reward, self.length + 1
            for i, room in enumerate(info["room"].tolist() if "room" in info else []):
                self.episode_rooms[i].add(room)
                self.rooms.add(room)
            for i in np.flatnonzero(done):
                rooms = len(self.episode_rooms[i]) if "room" in info else None
                episodes.append((step, float(self.score[i]), int(self.length[i]), rooms))
                self.score[i], self.length[i], self.episode_rooms[i] = 0.0, 0, set()
        return episodes


@torch.no_grad()
def score_rollout(buf, player, agent, rnd, obs_rms, reward_rms, filter_state, args, world):
    """Frame statistics updated, then every next frame scored by the pre-update predictor
    (whitened chunk by chunk); GAE of both streams (the intrinsic one non-episodic).
    Returns the PPO batch and the reward filter's new state."""
    T, N = buf.actions.shape
    frames = buf.next_frames.view(T * N, 84, 84)
    obs_rms.update(frames, world)
    mean, var = obs_rms.mean.float(), obs_rms.var.float()
    raw_int = torch.zeros_like(buf.ext_rewards)
    if args.rnd.int_coef != 0:  # plain PPO: the RND networks are not run
        chunks = [normalize_frames(c, mean, var, args.rnd.obs_clip) for c in frames.split(4096)]
        raw_int = torch.cat([rnd.errors(x) for x in chunks]).view(T, N)
    int_rewards, filter_state = intrinsic_rewards(raw_int, filter_state, reward_rms, args.rnd.int_gamma, world)
    _, next_v_ext, next_v_int, _ = agent(player.next_obs[None], player.state, player.next_first[None])
    lam, zeros = args.ppo.gae_lambda, torch.zeros_like(buf.firsts)
    ext_adv, ext_ret = compute_gae(
        buf.ext_rewards, buf.v_ext, buf.firsts, next_v_ext, player.next_first, args.ppo.gamma, lam
    )
    int_adv, int_ret = compute_gae(int_rewards, buf.v_int, zeros, next_v_int, zeros[0], args.rnd.int_gamma, lam)
    batch = dict(vars(buf))
    batch["advantages"] = args.rnd.ext_coef * ext_adv + args.rnd.int_coef * int_adv
    batch |= {"ext_returns": ext_ret, "int_returns": int_ret, "obs_mean": mean, "obs_var": var}
    return batch | {"raw_int": raw_int, "int_rewards": int_rewards}, filter_state


def ppo_update(agent, rnd, optimizer, batch: dict, args: Args, world: "World", params) -> dict:
    """update_epochs x num_minibatches steps on env slices (whole sequences, for the GRU);
    returns the last epoch's mean losses as tensors (no host sync)."""
    keys = ("obs", "firsts", "actions", "logprobs", "advantages", "ext_returns", "int_returns")
    keys += ("next_frames",)
    ppo, N, device = args.ppo, batch["actions"].shape[1], batch["actions"].device
    mb_envs = N // ppo.num_minibatches
    for _ in range(ppo.update_epochs):
        sums = {}
        perm = torch.randperm(N, device=device)
        for start in range(0, N, mb_envs):
            check_stop("during a PPO update")
            mb_inds = perm[start : start + mb_envs]
            mb = {k: batch[k][:, mb_inds] for k in keys}
            obs = mb.pop("obs").permute(0, 1, 4, 2, 3)  # NHWC storage, (T, B, 4, 84, 84) view
            logits, v_ext, v_int, _ = agent(obs, batch["state0"][:, mb_inds], mb["firsts"])
            dist = Categorical(logits=logits)
            mb = {k: v.flatten(0, 1) for k, v in mb.items()}  # (T, B, ...) -> (T * B, ...)
            adv = mb["advantages"]
            if ppo.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            new_logprob = dist.log_prob(mb["actions"])
            pg_loss, approx_kl, clipfrac = ppo_policy_loss(new_logprob, mb["logprobs"], adv, ppo.clip_coef)
            v_loss_ext = (v_ext - mb["ext_returns"]).pow(2).mean()
            v_loss = 0.5 * (v_loss_ext + (v_int - mb["int_returns"]).pow(2).mean())
            entropy = dist.entropy().mean()
            pred_loss = torch.zeros((), device=device)
            if args.rnd.int_coef != 0:  # plain PPO (int_coef 0): the RND networks are not run
                frames = mb["next_frames"]
                keep = predictor_subsample(frames.shape[0], args.rnd.update_proportion, device)
                x = normalize_frames(frames[keep], batch["obs_mean"], batch["obs_var"], args.rnd.obs_clip)
                pred_loss = rnd.errors(x).mean()
            loss = pg_loss - ppo.ent_coef * entropy + ppo.vf_coef * v_loss + pred_loss
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            world.all_reduce_gradients(params)
            if ppo.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(params, ppo.max_grad_norm)
            optimizer.step()
            step_losses = dict(
                policy_loss=pg_loss,
                value_loss=v_loss,
                entropy=entropy,
                predictor_loss=pred_loss,
                approx_kl=approx_kl,
                clipfrac=clipfrac,
                total_loss=loss,
            )
            for name, value in step_losses.items():
                sums[name] = sums.get(name, 0.0) + value.detach() / ppo.num_minibatches
    return sums


def diagnostics(losses: dict, batch: dict, reward_rms: RunningMeanStd) -> dict:
    """What one iteration logs, as tensors: PPO's losses and the two reward streams."""
    logs = {f"losses/{k}": v for k, v in losses.items()}
    logs |= {
        "rnd/predictor_loss": losses["predictor_loss"],
        "rnd/intrinsic_reward_raw": batch["raw_int"].mean(),
        "rnd/intrinsic_reward": batch["int_rewards"].mean(),
        "rnd/intrinsic_return": batch["int_returns"].mean(),
        "rnd/extrinsic_return": batch["ext_returns"].mean(),
        "rnd/extrinsic_reward": batch["ext_rewards"].mean(),
        "rnd/intrinsic_return_std": torch.sqrt(reward_rms.var.float()),
        "losses/explained_variance": explained_variance(batch["v_ext"], batch["ext_returns"]),
        "losses/explained_variance_int": explained_variance(batch["v_int"], batch["int_returns"]),
    }
    return logs


def log_episodes(writer, run: dict, recent, episodes: list, steps_per_env_step: int) -> None:
    """The finished episodes: scores for the target score; rank 0 logs each (score, length,
    rooms) at the global step where it ended."""
    for step, score, length, rooms in episodes:
        recent.append(score)
        if writer is None:
            continue
        at_step = run["global_step"] + (step + 1) * steps_per_env_step
        writer.add_scalar("charts/episodic_return", score, at_step)
        writer.add_scalar("charts/episodic_length", length, at_step)
        if rooms is not None:
            writer.add_scalar("charts/episodic_rooms", rooms, at_step)
            run["history"]["episode_step"].append(at_step)
            run["history"]["episode_rooms"].append(rooms)


def log_iteration(writer, bar, run: dict, logs: dict, avg_return: float, lr: float) -> None:
    """Rank 0: the scalars to TensorBoard, the progress bar, and the history the plot draws."""
    step = run["global_step"]
    for tag, value in (logs | {"charts/learning_rate": lr}).items():
        writer.add_scalar(tag, value, step)
    if np.isfinite(avg_return):
        writer.add_scalar("charts/avg_episodic_return", avg_return, step)
    if np.isfinite(run["sps"]):
        writer.add_scalar("charts/SPS", run["sps"], step)
    writer.flush()
    int_reward, rooms = logs["rnd/intrinsic_reward"], logs.get("charts/visited_rooms_train")
    for key, value in (("step", step), ("avg_return", avg_return), ("int_reward", int_reward), ("train_rooms", rooms)):
        run["history"][key].append(value)
    postfix = dict(sps=f"{run['sps']:.0f}", avg_ret=f"{avg_return:.1f}", int_r=f"{int_reward:.3f}")
    bar.update(step - bar.n, **postfix)  # the bar counts global steps (and starts at the resumed one)


def measure_sps(run: dict, sps_start):
    """SPS is measured from the end of iteration 1 (after warm-up): returns the start mark."""
    if sps_start is None:
        return time.perf_counter(), run["global_step"]
    if run["global_step"] > sps_start[1]:
        run["sps"] = (run["global_step"] - sps_start[1]) / (time.perf_counter() - sps_start[0])
    return sps_start


def train(args: Args, rom: str, device, run_dir: Path, snapshot, world: "World", writer):
    """PPO + RND until the budget, the target score or a signal, resuming from `snapshot`.
    Returns the agent and the run's record (counters, scores, why it stopped)."""
    ppo, T, N = args.ppo, args.ppo.num_steps, args.ppo.num_envs
    batch_size = N * T * world.size
    num_iterations = -(-ppo.total_timesteps // batch_size)  # the first whole iteration that reaches the budget
    start = snapshot["iteration"] if snapshot else 0
    env_seed = args.seed * 100_003 + world.rank * N + start * 1_000_003
    envs = make_envs(args.env, rom, N, env_seed)
    layers, size = args.policy.rnn_hidden_layers, args.policy.rnn_hidden_size
    agent = Agent(envs.single_action_space.n, layers, size, args.env_id).to(device)
    rnd = RNDModel().to(device)
    params = [p for p in [*agent.parameters(), *rnd.parameters()] if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=ppo.learning_rate, eps=ppo.adam_eps)
    obs_rms, reward_rms = RunningMeanStd((84, 84), device), RunningMeanStd((), device)
    recent = deque(maxlen=ppo.target_score_window)  # the scores the target score is checked on
    learner = dict(agent=agent, rnd=rnd, optimizer=optimizer, obs_rms=obs_rms, reward_rms=reward_rms)
    filter_state = torch.zeros(N, device=device)
    run, filter_state = resume(snapshot, learner, recent, world, args.seed, filter_state)
    if snapshot is None:
        world.same_start(learner, args.seed)
        if args.rnd.num_iterations_obs_norm_init > 0:
            init_obs_normalization(envs, obs_rms, args, world, writer)
    player, buf = Player(envs, agent, env_seed, device), Rollout(T, N, device)
    show = args.progress_bar and world.rank == 0
    bar = Progress(num_iterations * batch_size, "training", show, run["global_step"])
    sps_start = None
    save_snapshot = partial(checkpoint, run_dir, rom, args, world)
    try:
        for iteration in range(start + 1, num_iterations + 1):
            if ppo.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = ppo.learning_rate * frac
            # a signal inside the iteration: the snapshot of the last whole one (a copy, taken here) is saved
            with saved_on_stop(save_snapshot, learner, run, recent, filter_state, copy_on_entry=True):
                log_episodes(writer, run, recent, player.rollout(agent, buf), N * world.size)
                run["global_step"] += batch_size
                scored = score_rollout(buf, player, agent, rnd, obs_rms, reward_rms, filter_state, args, world)
                batch, filter_state = scored
                losses = ppo_update(agent, rnd, optimizer, batch, args, world, params)

            # one host sync per iteration: the logs, the NaN guard and every rank's stop flags
            logs = diagnostics(losses, batch, reward_rms)
            values = torch.stack([v.float() for v in logs.values()])
            flags = [STOP["signal"] > 0, sum(recent), len(recent), 0]
            flags = torch.tensor(flags, dtype=torch.double, device=device)
            flags[3] = (~torch.isfinite(values)).any().double()
            world.all_reduce_sum(flags)  # every rank stops at the same iteration, on the same mean
            if flags[3].item() > 0:
                hint = "lower --ppo.learning-rate or set --ppo.max-grad-norm"
                raise NonFiniteLoss(f"non-finite loss at iteration {iteration}: {hint}")
            logs = dict(zip(logs, values.tolist()))
            run["iteration"], run["rooms_train"] = iteration, run["rooms_train"] | world.union(player.rooms)
            if isinstance(envs, RoomEnvs):  # distinct rooms any env (of any rank) has been in so far
                logs["charts/visited_rooms_train"] = len(run["rooms_train"])
            avg_return = float(flags[1] / flags[2]) if flags[2] > 0 else float("nan")
            sps_start = measure_sps(run, sps_start)
            if writer is not None:
                log_iteration(writer, bar, run, logs, avg_return, optimizer.param_groups[0]["lr"])
                if args.eval.every and iteration % args.eval.every == 0 and iteration < num_iterations:
                    with saved_on_stop(save_snapshot, learner, run, recent, filter_state):
                        evaluate_during_training(args, agent, rom, device, run_dir, run, writer)
            stop = flags[0].item() > 0
            reached = ppo.target_score is not None and avg_return >= ppo.target_score
            if stop or reached or iteration % args.checkpoint_every == 0 or iteration == num_iterations:
                save_snapshot(snapshot_state(learner, run, recent, filter_state))
            if stop:
                raise Interrupted(f"stopped by signal at iteration {iteration}; a snapshot is saved")
            if reached:
                run["stop_reason"] = "target_score"
                break
    finally:
        bar.close()
        envs.close()
    run["train_mean_return"] = float(np.mean(recent)) if recent else float("nan")
    run["train_episodes_in_mean"] = len(recent)
    return agent, run | world.checksums(agent, player.next_obs, obs_rms, reward_rms)


# ---- run management ----
def main(args: Args) -> Optional[dict]:
    """Check every input, then train and evaluate (or only evaluate); exit codes as in
    docs/CONTRACT.md."""
    world = World()
    try:
        inputs = validate(args, world)  # rank 0 checks the run dir and tells the other ranks
    except UsageError as e:
        if world.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    run_dir, device, rom = inputs.run_dir, inputs.device, inputs.rom
    if inputs.finished is not None:  # (the other ranks of --eval-only also wait here for rank 0)
        world.close()
        if world.rank == 0:
            never = "results.json is never overwritten"
            print(f"{run_dir} is finished ({never}); evaluate it with --eval-only")
        return inputs.finished if world.rank == 0 else None
    writer, restore_signals = start_run(args, inputs, world)
    try:
        if args.eval_only:
            return evaluate_only(args, inputs.policy, rom, device, run_dir, inputs.eval_path)
        agent, run = train(args, rom, device, run_dir, inputs.snapshot, world, writer)
        if world.rank == 0:
            return finish(args, agent, run, rom, device, run_dir, world, writer)
    except NonFiniteLoss as e:
        if world.rank == 0:
            print(f"error: {e}; the last good snapshot is in checkpoints/", file=sys.stderr)
        raise SystemExit(3) from None
    except Interrupted as e:
        if world.rank == 0:
            message = f"interrupted: {e}; resume with: {resume_command(run_dir, world.size)}"
            if args.eval_only:  # its file is written whole, after the last episode, or not at all
                message = "interrupted during --eval-only: no evaluation written; the same command starts it again"
            print(message, file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if writer is not None:
            writer.close()
            if args.track:  # before a torchrun rank's os._exit, which skips wandb's own exit hook
                sys.modules["wandb"].finish()
        restore_signals()
        world.close()
        if world.rank == 0:
            print(f"run directory: {run_dir}", flush=True)


SCRIPT = os.path.basename(__file__)
VERSION = 1  # of the files `save` writes; `load` refuses any other
REQUIRED = {  # the keys `load` checks for each kind of file
    "policy": {"env_id", "network", "config", "state_dict"},
    "snapshot": {"agent", "rnd", "optimizer", "obs_rms", "reward_rms", "filter_state", "rng", "iteration"},
}
REQUIRED["snapshot"] |= {"global_step", "recent_returns", "history", "rooms_seen", "rooms_train", "config"}
ARCHITECTURE = ("rnn_hidden_layers", "rnn_hidden_size")  # a snapshot cannot be resumed with other values
OTHER_FAMILIES = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid", "Swimmer", "Reacher", "Pusher", "Inverted")
OTHER_FAMILIES += ("CartPole", "Pendulum", "MountainCar", "Acrobot", "LunarLander", "BipedalWalker", "CarRacing")


class UsageError(Exception):
    """A bad input the user can fix: main prints it as one line and exits 2."""


class Inputs(NamedTuple):
    """What validation checked and loaded, for main to hand to the phases."""

    run_dir: Path
    device: torch.device
    rom: str = ""
    snapshot: Optional[dict] = None  # the latest snapshot, to resume from
    policy: Optional[Agent] = None  # --eval-only: the policy, and the record its evaluation goes to
    eval_path: Optional[Path] = None
    finished: Optional[dict] = None  # results.json of a finished run ({} on the other ranks)


def resolve_env_id(env_id: str) -> str:
    """XNoFrameskip-v4 or ALE/X-v5 -> the ROM id (both read with the paper's settings); UsageError with the fix."""
    from ale_py import roms

    match = re.fullmatch(r"(ALE/)?([A-Za-z0-9]+?)(NoFrameskip|Deterministic)?(-v\d+)", env_id)
    game = match.group(2) if match else re.split(r"[-/]", env_id.removeprefix("ALE/"))[0]
    rom = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()
    if rom in roms.get_all_rom_ids():
        if match and match.groups() in ((None, game, "NoFrameskip", "-v4"), ("ALE/", game, None, "-v5")):
            return rom
        good = f"{rom_to_camel(rom)}NoFrameskip-v4 or ALE/{rom_to_camel(rom)}-v5"
        raise UsageError(f"{env_id!r} is a retired or unsupported version of {rom_to_camel(rom)}: use {good}")
    if game.startswith(OTHER_FAMILIES):
        raise UsageError(f"{env_id!r} is not an Atari game: this script needs e.g. MontezumaRevengeNoFrameskip-v4")
    known = [f"{rom_to_camel(r)}NoFrameskip-v4" for r in roms.get_all_rom_ids()]
    close = difflib.get_close_matches(f"{rom_to_camel(rom)}NoFrameskip-v4", known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "use e.g. MontezumaRevengeNoFrameskip-v4"
    raise UsageError(f"unknown Atari env id {env_id!r}: {hint}")


def check_args(args: Args) -> None:
    """Every numeric flag in its range (see `ranged`) and the rules between flags."""
    groups = [(f"{f.name}.", getattr(args, f.name)) for f in dataclasses.fields(args)]
    for prefix, group in [("", args), *(g for g in groups if dataclasses.is_dataclass(g[1]))]:
        for f in dataclasses.fields(group):
            (low, high), value = f.metadata.get("range", (None, None)), getattr(group, f.name)
            if low is not None and value is not None and not low <= value <= high:
                name, (low, high) = f"--{prefix}{f.name}".replace("_", "-"), (exact(low), exact(high))
                raise UsageError(f"{name} must be in [{low}, {high}] (got {value})")
    if not args.exp_name or "/" in args.exp_name:
        raise UsageError("--exp-name must be a non-empty name without '/'")
    ppo = args.ppo
    if ppo.num_envs % ppo.num_minibatches:
        raise UsageError("--ppo.num-envs must be a multiple of num-minibatches (a minibatch is whole envs)")


def exact(bound: float) -> str:
    """A range bound as written: 1e+09 stays short, but 4294967295 is not rounded to 4.29497e+09."""
    return f"{float(bound):g}" if float(f"{bound:g}") == bound else str(int(bound))


def validate(args: Args, world: "World") -> Inputs:
    """Every check on user input before anything is written; rank 0 checks the run dir and tells the other ranks.
    Returns what it loaded (the latest snapshot, or the policy for --eval-only)."""
    check_args(args)
    rom = "" if args.eval_only else resolve_env_id(args.env_id)
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{world.local_rank % max(torch.cuda.device_count(), 1)}" if use_cuda else "cpu")
    world.init(device)
    inputs, message = Inputs(Path(), device, rom), None
    if world.rank == 0:
        try:
            inputs = validate_eval_only(args, device) if args.eval_only else validate_run_dir(args, device, rom)
        except UsageError as e:
            message = str(e)
    run_dir, message, finished = world.broadcast_object((str(inputs.run_dir), message, inputs.finished is not None))
    if message is not None:
        raise UsageError(message)
    if world.rank != 0:  # the other ranks read the snapshot rank 0 has checked (--eval-only runs on rank 0 alone)
        if finished or args.eval_only:
            return Inputs(Path(run_dir), device, rom, finished={})
        return Inputs(Path(run_dir), device, rom, latest_snapshot(Path(run_dir)))
    return inputs


def validate_run_dir(args: Args, device, rom: str) -> Inputs:
    default = f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = check_length(Path(args.run_dir or default), "--run-dir" if args.run_dir else "--exp-name")
    check_run_dir(run_dir, args.env_id)
    if (run_dir / "results.json").exists():
        finished = read_json(run_dir / "results.json")
        check_finished_with_same_flags(run_dir, read_json(run_dir / "args.json").get("args", {}), args)
        return Inputs(run_dir, device, rom, finished=finished)
    snapshot = latest_snapshot(run_dir)
    changed = [k for k in ARCHITECTURE if snapshot and snapshot["config"][k] != getattr(args.policy, k)]
    if changed:
        was = " ".join(f"--policy.{k.replace('_', '-')} {snapshot['config'][k]}" for k in changed)
        raise UsageError(f"{run_dir} was trained with {was}: resume with the same values or pass a new --run-dir")
    return Inputs(run_dir, device, rom, snapshot)


def validate_eval_only(args: Args, device) -> Inputs:
    run_dir = check_length(Path(args.eval_only), "--eval-only")
    if not (run_dir / "policy.pt").is_file():
        raise UsageError(f"--eval-only {run_dir}: no policy.pt there; pass the run dir of a finished training run")
    if not (run_dir / "args.json").is_file():  # (check_run_dir's message would name --run-dir)
        raise UsageError(f"--eval-only {run_dir}: no args.json there; pass the run dir of a finished training run")
    check_run_dir(run_dir, None)
    policy = load_policy(str(run_dir / "policy.pt"))
    numbers = [int(p.stem[5:]) for p in (run_dir / "evaluations").glob("eval_*.json") if p.stem[5:].isdigit()]
    eval_path = run_dir / "evaluations" / f"eval_{max(numbers, default=0) + 1:03d}.json"
    return Inputs(run_dir, device, resolve_env_id(policy.env_id), policy=policy, eval_path=eval_path)


def check_length(path: Path, flag: str) -> Path:
    """The path, or a UsageError when the file system cannot hold it (255 bytes a name, 4095 a path, as on Linux):
    checked before anything looks at it, so it fails here and not halfway through making the run dir."""
    if any(len(os.fsencode(part)) > 255 for part in path.parts) or len(os.fsencode(path.absolute())) > 4095:
        limits = "255 bytes a name, 4095 a path"
        raise UsageError(f"{flag}: {str(path)[:60]}... is too long for the file system ({limits}): shorten it")
    return path


def check_run_dir(run_dir: Path, env_id: Optional[str]) -> None:
    """A run dir is ours (args.json names this script and the env) and writable; nothing is created here."""
    if (run_dir / "args.json").exists():
        saved = read_json(run_dir / "args.json")
        if not isinstance(saved, dict) or saved.get("script") != SCRIPT:
            raise UsageError(f"{run_dir} was not made by {SCRIPT} (args.json): pass a new --run-dir")
        if env_id is not None and saved.get("env_id") != env_id:
            raise UsageError(f"{run_dir} holds a run on {saved.get('env_id')}, not {env_id}: pass a new --run-dir")
    elif run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UsageError(f"{run_dir} exists and is not a run dir of {SCRIPT} (no args.json): pass a new --run-dir")
    probe = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    try:
        tempfile.TemporaryDirectory(dir=probe).cleanup()
    except OSError:
        raise UsageError(f"cannot write in {probe}: pass a writable --run-dir") from None


def resume_command(run_dir: Path, world_size: int) -> str:
    """The exact command that resumes this run: this one's flags with --run-dir set to the run dir (the default
    run dir ends in a timestamp, so the same command alone would start a new run)."""
    argv, kept = sys.argv[1:], []
    while argv:
        arg = argv.pop(0)
        if arg == "--run-dir" or arg == "--run_dir":
            argv = argv[1:]
        elif not arg.startswith(("--run-dir=", "--run_dir=")):
            kept.append(arg)
    launcher = ["torchrun", f"--nproc-per-node={world_size}"] if world_size > 1 else ["python"]
    return shlex.join([*launcher, sys.argv[0], *kept, "--run-dir", str(run_dir)])


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


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise UsageError(f"{path} is corrupt: delete it (it is rewritten) or pass a new --run-dir") from None


def save(path: Path, kind: str, **payload) -> None:
    """The one writer of .pt files: {script, kind, version, **payload}, atomically (name.tmp, then os.replace)."""
    atomic_write(path, {"script": SCRIPT, "kind": kind, "version": VERSION, **payload})


def load(path: Path, kind: str) -> dict:
    """The one reader: a file `save` wrote, checked (this script's, this kind and version, every key); otherwise a
    UsageError naming the file. A policy is read with weights_only (plain tensors and numbers)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=kind == "policy")
    except Exception:  # noqa: BLE001 -- any unreadable file is the same user error
        saved = None
    header = {"script": SCRIPT, "kind": kind, "version": VERSION}
    if isinstance(saved, dict) and header.items() <= saved.items() and REQUIRED[kind] <= set(saved):
        return saved
    fix = "delete it to resume from the previous snapshot" if kind == "snapshot" else f"pass a {kind} of {SCRIPT}"
    what = f"a readable {kind} of {SCRIPT} (format {VERSION})"
    raise UsageError(f"{path} is not {what}: corrupt, another script's or an older format; {fix}")


def checkpoint_paths(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def latest_snapshot(run_dir: Path) -> Optional[dict]:
    """The newest checkpoints/ckpt_*.pt, checked, or None when there is none."""
    paths = checkpoint_paths(run_dir)
    return load(paths[-1], "snapshot") if paths else None


def snapshot_state(learner: dict, run: dict, recent, filter_state, copied: bool = False) -> dict:
    """What a snapshot holds: model, optimizer, normalisers, reward filter, RNG states, counters; `copied`: a copy
    that later training does not change (kept to be saved if a signal comes inside the next iteration)."""
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    rng["cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    state = {k: v.state_dict() for k, v in learner.items()} | {"iteration": run["iteration"], "rng": rng}
    state |= {"global_step": run["global_step"], "filter_state": filter_state.cpu(), "recent_returns": list(recent)}
    state |= {"history": run["history"], "rooms_seen": sorted(run["rooms_seen"]), "config": learner["agent"].config}
    state["rooms_train"] = sorted(run["rooms_train"])
    if copied:
        state = {k: copy.deepcopy(v) if k in learner or k == "filter_state" else v for k, v in state.items()}
        state["history"] = {k: list(v) for k, v in run["history"].items()}
    return state


def checkpoint(run_dir: Path, rom: str, args: Args, world: "World", state: dict) -> None:
    """Rank 0: the snapshot `state` into checkpoints/; keeps the newest snapshots."""
    if world.rank != 0:
        return
    save(run_dir / "checkpoints" / f"ckpt_{state['iteration']:08d}.pt", "snapshot", **state)
    for old in checkpoint_paths(run_dir)[: -args.keep_checkpoints]:
        old.unlink(missing_ok=True)
    plot_curves(state["history"], rom, args.env_id, run_dir)


@contextlib.contextmanager
def saved_on_stop(save_snapshot, learner: dict, run: dict, recent, filter_state, copy_on_entry: bool = False):
    """A signal noticed inside the block (check_stop raised): save_snapshot(state), then the stop goes on to main.
    The state saved: with copy_on_entry, a copy taken on entry (the block's iteration is not whole; single process
    only: the ranks of a torchrun job stop at an iteration's end), else the state at the stop."""
    live = (learner, run, recent, filter_state)
    last = snapshot_state(*live, copied=True) if copy_on_entry and STOP["solo"] else None
    try:
        yield
    except Interrupted as e:
        save_snapshot(last if last is not None else snapshot_state(*live))
        raise Interrupted(f"{e}; the snapshot of the last whole iteration is saved") from None


def resume(snapshot: Optional[dict], learner: dict, recent, world, seed: int, filter_state: torch.Tensor):
    """A fresh run record, or the snapshot loaded into the learner, the counters and the RNGs. Returns the record and
    the reward filter's state (the snapshot's when --ppo.num-envs is unchanged)."""
    run = {"iteration": 0, "global_step": 0, "rooms_seen": set(), "stop_reason": "budget", "sps": float("nan")}
    run["rooms_train"] = set()  # rooms visited in training rollouts (RoomEnvs); rooms_seen: in evaluations
    keys = ("step", "avg_return", "int_reward", "train_rooms", "eval_step", "eval_return", "eval_rooms")
    run["history"] = {k: [] for k in (*keys, "episode_step", "episode_rooms")}
    if snapshot is None:
        return run, filter_state
    for name, obj in learner.items():
        obj.load_state_dict(snapshot[name])
    run.update(iteration=snapshot["iteration"], global_step=snapshot["global_step"], history=snapshot["history"])
    run["rooms_seen"], run["rooms_train"] = set(snapshot["rooms_seen"]), set(snapshot["rooms_train"])
    recent.extend(snapshot["recent_returns"])
    rng = snapshot["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if world.rank:  # the snapshot holds rank 0's RNG; the other ranks diverge from it
        torch.manual_seed(seed + world.rank + 7 * run["iteration"])
        np.random.seed((seed + world.rank + 7 * run["iteration"]) % 2**32)  # numpy's seeds are 32-bit
    if world.rank == 0:
        print(f"resumed from iteration {run['iteration']} (global step {run['global_step']})", flush=True)
    if snapshot["filter_state"].shape == filter_state.shape:  # --ppo.num-envs may change on resume
        filter_state = snapshot["filter_state"].to(filter_state.device)
    return run, filter_state


# Evaluation: separate Python envs with RAM (for the rooms), the stochastic policy as trained
@torch.no_grad()
def evaluate(agent: Agent, env_args: EnvArgs, rom: str, ev: EvalArgs, device, seed: int, render=False):
    """ev.episodes episodes (episode i seeded seed + i), n = ev.num_envs at once in lockstep (batched inference; env
    i plays episodes i, i + n, ...), stochastic policy; visited rooms read from RAM; with `render`, the frames of
    the first episode."""
    if ev.episodes == 0:
        return {"returns": [], "lengths": [], "rooms": [], "frames": []}
    ram_addr, n = ROOM_RAM_ADDRESS.get(rom), min(ev.num_envs, ev.episodes)
    envs = []
    for i in range(n):
        check_stop("during an evaluation")
        envs.append(make_python_env(env_args, rom, seed + i, render and i == 0))
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns, lengths = np.zeros(ev.episodes), np.zeros(ev.episodes, dtype=np.int64)
    rooms, frames = [set() for _ in range(ev.episodes)], []
    episode = np.arange(n)  # the episode each env plays (-1: none left to start)
    state, first = agent.initial_state(n, device), torch.ones(1, n, device=device)
    while (episode >= 0).any():
        check_stop("during an evaluation")
        logits, _, _, state = agent(torch.as_tensor(obs, device=device)[None], state, first)
        first = torch.zeros_like(first)
        actions = Categorical(logits=logits).sample().cpu().numpy()
        for i in np.flatnonzero(episode >= 0):
            e = episode[i]
            obs[i], reward, term, trunc, _ = envs[i].step(int(actions[i]))
            returns[e], lengths[e] = returns[e] + reward, lengths[e] + 1
            if ram_addr is not None:
                rooms[e].add(int(envs[i].unwrapped.ale.getRAM()[ram_addr]))
            if e == 0 and render:
                frames.append(envs[i].render())
            if term or trunc:
                episode[i] = e + n if e + n < ev.episodes else -1
                if episode[i] >= 0:
                    obs[i], first[0, i] = envs[i].reset(seed=int(seed + e + n))[0], 1.0
    for env in envs:
        env.close()
    rooms = [sorted(r) for r in rooms] if ram_addr is not None else None
    return {"returns": returns.tolist(), "lengths": lengths.tolist(), "rooms": rooms, "frames": frames}


def evaluate_during_training(args: Args, agent: Agent, rom: str, device, run_dir: Path, run: dict, writer) -> dict:
    seed = args.seed + 10_000 + run["iteration"]
    result = evaluate(agent, args.env, rom, args.eval, device, seed, args.capture_video)
    if result["frames"]:
        write_video(run_dir / "videos" / f"eval_{run['global_step']:010d}.webm", result["frames"])
    step, history = run["global_step"], run["history"]
    if result["returns"]:
        mean = float(np.mean(result["returns"]))
        writer.add_scalar("eval/episodic_return", mean, step)
        history["eval_step"].append(step)
        history["eval_return"].append(mean)
        if result["rooms"] is not None:
            run["rooms_seen"].update(*result["rooms"])
            writer.add_scalar("eval/visited_rooms", float(np.mean([len(r) for r in result["rooms"]])), step)
            writer.add_scalar("charts/visited_rooms", len(run["rooms_seen"]), step)
            history["eval_rooms"].append(len(run["rooms_seen"]))
    return result


def finish(args: Args, agent: Agent, run: dict, rom: str, device, run_dir: Path, world, writer) -> dict:
    """Rank 0 after training: the final evaluation, policy.pt, the plot and results.json."""
    result = evaluate_during_training(args, agent, rom, device, run_dir, run, writer)
    config = agent.config | {"env_config": dataclasses.asdict(args.env)}
    policy = dict(env_id=agent.env_id, network="Agent", config=config, state_dict=agent.state_dict())
    save(run_dir / "policy.pt", "policy", **policy)
    returns, rooms = result["returns"], ROOM_RAM_ADDRESS.get(rom) is not None
    mean, std = (float(f(returns)) if returns else float("nan") for f in (np.mean, np.std))
    results = {"env_id": args.env_id, "policy": "gru" if args.policy.rnn_hidden_layers else "cnn", "seed": args.seed}
    results |= {"world_size": world.size, "num_envs_total": args.ppo.num_envs * world.size}
    results |= {"global_step": run["global_step"], "frames": run["global_step"] * 4, "iterations": run["iteration"]}
    results |= {"stop_reason": run["stop_reason"], "eval_episodes": len(returns), "eval_returns": returns}
    results |= {"eval_mean_return": mean, "eval_std_return": std, "eval_lengths": result["lengths"]}
    results |= {"eval_rooms_per_episode": result["rooms"], "visited_rooms": len(run["rooms_seen"]) if rooms else None}
    results |= {"rooms_seen": sorted(run["rooms_seen"]) if rooms else None, "sps": run["sps"]}
    history, tracked = run["history"], rooms and any(r is not None for r in run["history"]["train_rooms"])
    results |= {"visited_rooms_train": len(run["rooms_train"]) if tracked else None}
    results |= {"rooms_seen_train": sorted(run["rooms_train"]) if tracked else None}
    curve = {"step": history["step"], "visited_rooms": history["train_rooms"]}
    episodes = {"step": history["episode_step"], "rooms": history["episode_rooms"]}
    results |= {"train_rooms_curve": curve if tracked else None, "train_episode_rooms": episodes if tracked else None}
    results |= {k: run[k] for k in ("train_mean_return", "train_episodes_in_mean")}
    results |= {k: run[k] for k in ("rank_param_checksums", "rank_obs_checksums", "rank_normaliser_checksums")}
    results["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    plot_curves(run["history"], rom, args.env_id, run_dir, final_eval=mean)
    atomic_write(run_dir / "results.json", results)
    rooms_text = f", visited rooms {len(run['rooms_seen'])}" if rooms else ""
    rooms_text += f" (in training {len(run['rooms_train'])})" if tracked else ""
    summary = f"{run['global_step']} steps, eval return {mean:.1f} over {len(returns)} episodes"
    print(f"done: {summary}{rooms_text}; results in {run_dir / 'results.json'}", flush=True)
    return results


def evaluate_only(args: Args, policy: Agent, rom: str, device, run_dir: Path, path: Path) -> dict:
    """--eval-only RUN_DIR: RUN_DIR/policy.pt with --eval.episodes, into evaluations/eval_NNN.json (a new file)."""
    policy = policy.to(device)
    env_args = EnvArgs(**{k: policy.env_config[k] for k in ("sticky_action_prob", "max_episode_frames")})
    print(f"evaluating {run_dir / 'policy.pt'}: {args.eval.episodes} episodes", flush=True)
    result = evaluate(policy, env_args, rom, args.eval, device, args.seed + 20_000, args.capture_video)
    if result["frames"]:
        write_video(run_dir / "videos" / f"{path.stem}.webm", result["frames"])
    mean = float(np.mean(result["returns"])) if result["returns"] else float("nan")
    out = {"env_id": policy.env_id, "policy": "policy.pt", "eval_returns": result["returns"], "eval_mean_return": mean}
    atomic_write(path, out | {"eval_lengths": result["lengths"], "eval_rooms_per_episode": result["rooms"]})
    print(f"[eval-only] mean return {mean:.1f} over {len(result['returns'])} episodes; written to {path}")
    return out


def load_policy(path: str, device="cpu") -> Agent:
    """policy.pt -> the Agent in eval mode on `device`, with .act(obs) and .env_id (see docs/CONTRACT.md)."""
    saved = load(Path(path), "policy")
    config = dict(saved["config"])
    agent = Agent(**{k: v for k, v in config.items() if k != "env_config"}, env_id=saved["env_id"])
    agent.env_config = config["env_config"]
    agent.load_state_dict(saved["state_dict"])
    return agent.to(device).eval()


def make_policy_envs(policy: Agent, num_envs: int):
    """The vector envs a loaded policy was trained on, made with the settings saved in policy.pt (the C++ ones: the
    same frames as RoomEnvs, faster)."""
    env_args = EnvArgs(**policy.env_config | {"track_rooms": False})
    return make_envs(env_args, resolve_env_id(policy.env_id), num_envs, seed=0)


def atomic_write(path: Path, content, suffix: str = "") -> None:
    """content -- a callable writing the given path, or data saved as JSON (*.json) or by torch.save -- is written to
    the fixed `name.tmp` (plus a suffix some writers need) in the same folder, then moved in place by os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + suffix)
    if callable(content):
        content(tmp)
    elif path.suffix == ".json":
        tmp.write_text(json.dumps(content, indent=2))
    else:
        torch.save(content, tmp)
    os.replace(tmp, path)


def write_video(path: Path, frames: list, fps: int = 30) -> None:
    """RGB frames as VP9 WebM (plays in browsers, TensorBoard and wandb)."""
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # not its warning about the WebM codec tag
    import cv2

    def write(tmp):
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"VP90"), fps, frames[0].shape[1::-1])
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()

    atomic_write(path, write, suffix=".webm")  # opencv picks the container from the file's extension


def plot_curves(history: dict, rom: str, env_id: str, run_dir: Path, final_eval: Optional[float] = None) -> None:
    """Score (evaluations, the final one marked), visited rooms (room games only), intrinsic reward vs agent steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rooms = ROOM_RAM_ADDRESS.get(rom) is not None
    fig, axes = plt.subplots(1, 3 if rooms else 2, figsize=(13 if rooms else 9, 3.4))
    axes[0].plot(history["step"], history["avg_return"], label="training (avg of last episodes)")
    if history["eval_step"]:
        axes[0].plot(history["eval_step"], history["eval_return"], "o-", label="evaluation")
    if final_eval is not None and history["step"]:
        axes[0].plot([history["step"][-1]], [final_eval], "r*", ms=12, label="final evaluation")
    axes[0].set_title("extrinsic score")
    axes[0].legend(fontsize=7)
    if rooms:
        train = [(s, r) for s, r in zip(history["step"], history["train_rooms"]) if r is not None]
        if train:
            axes[1].plot(*zip(*train), label="training")
        axes[1].plot(history["eval_step"][-len(history["eval_rooms"]) :], history["eval_rooms"], "o-", label="eval")
        axes[1].set_title("visited rooms (cumulative)")
        axes[1].legend(fontsize=7)
    axes[-1].plot(history["step"], history["int_reward"])
    axes[-1].set_title("normalised intrinsic reward / step")
    for ax in axes:
        ax.set_xlabel("agent steps")
        ax.grid(alpha=0.3)
    fig.suptitle(env_id, fontsize=9)
    fig.tight_layout()
    atomic_write(run_dir / "curves.png", lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    plt.close(fig)


def keep_freed_memory() -> None:
    """glibc keeps freed memory instead of handing it back: otherwise every large tensor of an update is mapped and
    page-faulted again (measured up to 16 % of the update time). jemalloc/tcmalloc via LD_PRELOAD do the same."""
    with contextlib.suppress(OSError):  # not glibc (musl, macOS, Windows): nothing to tune
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MB (glibc's maximum) come from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not give the heap's top back while less than 1 GB is free


def start_run(args: Args, inputs: Inputs, world: "World"):
    """After validation: seeds, memory, the run dir (stale *.tmp removed, args.json), signals, logging (rank 0)."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if inputs.device.type == "cuda":
        torch.cuda.set_device(inputs.device)
    keep_freed_memory()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    signals = (signal.SIGINT, signal.SIGTERM)
    handlers = {s: signal.signal(s, lambda signum, _: STOP.update(signal=signum)) for s in signals}
    STOP["signal"], STOP["solo"] = 0, world.size == 1
    writer, run_dir = None, inputs.run_dir
    if world.rank == 0:
        print(f"run directory: {run_dir}", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.rglob("*.tmp*"):
            stale.unlink()
    if world.rank == 0 and not args.eval_only:
        saved = {"script": SCRIPT, "env_id": args.env_id, "args": dataclasses.asdict(args)}
        batch_size = args.ppo.num_envs * args.ppo.num_steps * world.size
        saved |= {"batch_size": batch_size, "num_iterations": -(-args.ppo.total_timesteps // batch_size)}
        saved |= {"world_size": world.size}
        atomic_write(run_dir / "args.json", saved)
        from torch.utils.tensorboard import SummaryWriter

        if args.track:
            import wandb

            options = dict(name=run_dir.name, id=run_dir.name, resume="allow", save_code=True, sync_tensorboard=True)
            options |= dict(project=args.wandb_project_name, entity=args.wandb_entity, config=dataclasses.asdict(args))
            wandb.init(**options)
        writer = SummaryWriter(str(run_dir), flush_secs=10)
        if inputs.snapshot is None:
            table = "\n".join(f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items())
            writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    return writer, lambda: [signal.signal(s, h) for s, h in handlers.items()]


class World:
    """Rank / world size from torchrun's environment; every collective is a no-op in a single process."""

    def __init__(self):
        self.size, self.rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        self.local_rank, self.enabled = int(os.environ.get("LOCAL_RANK", "0")), self.size > 1

    def init(self, device: torch.device):
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def close(self):
        if self.enabled and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def all_reduce_sum(self, t: torch.Tensor):
        if self.enabled:
            dist.all_reduce(t)
        return t

    def all_reduce_gradients(self, params: list):
        """One flat all-reduce of all gradients, then divide by the world size (mean gradient)."""
        if self.enabled:
            grads = [p.grad for p in params]
            flat = self.all_reduce_sum(torch.cat([g.reshape(-1) for g in grads])) / self.size
            for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(part.view_as(grad))

    def broadcast_object(self, obj):
        box = [obj]
        if self.enabled:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj) -> list:
        out = [obj] * self.size
        if self.enabled:
            dist.all_gather_object(out, obj)
        return out

    def union(self, items: set) -> set:
        """The union of every rank's set."""
        return set().union(*self.all_gather_object(sorted(items))) if self.enabled else set(items)

    def checksums(self, agent, next_obs, obs_rms, reward_rms) -> dict:
        """Every rank must end with the same weights and normalisers (and its own envs): checksums of each rank."""
        params = float(sum(p.double().sum().item() for p in agent.state_dict().values()))
        norms = float(obs_rms.mean.sum().item() + obs_rms.var.sum().item() + reward_rms.var.item())
        gathered = [self.all_gather_object(x) for x in (params, int(next_obs.sum().item()), norms)]
        return dict(zip(("rank_param_checksums", "rank_obs_checksums", "rank_normaliser_checksums"), gathered))

    def same_start(self, learner: dict, seed: int) -> None:
        """Identical initial weights on every rank (same seed, then a broadcast); then rank-specific sampling."""
        if self.enabled:
            for module in (learner["agent"], learner["rnd"]):
                for p in module.state_dict().values():
                    dist.broadcast(p, src=0)
        torch.manual_seed(seed + self.rank)
        np.random.seed((seed + self.rank) % 2**32)  # numpy's seeds are 32-bit
        random.seed(seed + self.rank)


def parse_args(argv: Optional[list] = None) -> Args:
    """tyro's parser; a parse error becomes one line naming the flag, made from the fields of tyro's parse-error
    event (no printed text is read), and exit 2. A tyro without that hook prints its own box (also exit 2)."""

    def one_line(event) -> None:
        if getattr(event, "tokens", None):
            raise UsageError(f"unrecognized arguments: {' '.join(event.tokens)}")
        flag = getattr(event, "argument", None)
        where = "/".join(flag.lowered.name_or_flags) + ": " if flag else ""
        raise UsageError(where + getattr(event, "message", "a missing or bad value"))

    errors = getattr(tyro, "_errors", None)
    try:
        with errors.on_parse_error(one_line) if errors else contextlib.nullcontext():
            return tyro.cli(Args, args=argv)
    except UsageError as e:
        print(f"error: {e} (see --help)", file=sys.stderr)
        raise SystemExit(2) from None


def run_rank() -> None:
    """One torchrun rank: main, then os._exit. Ending it the usual way can abort the rank (SIGABRT, "terminate
    called without an active exception", about one run in six here): a gloo worker thread may still be letting go
    of a collective's tensors when the interpreter shuts down, and that needs the GIL it can no longer take."""
    code = 0
    try:
        main(parse_args())
    except SystemExit as e:
        code = e.code
    if code is not None and not isinstance(code, int):  # SystemExit("message") prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    if World().enabled:
        run_rank()
    else:
        main(parse_args())
