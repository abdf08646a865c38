"""T-REX on Atari: demonstrator -> ranked demos -> learned reward -> PPO on it -> evaluation, in one file.

T-REX learns a state-only reward r̂(s) from ranked, suboptimal demonstrations with a Bradley-Terry loss on snippet
pairs (the better demo's snippet must get the larger summed reward), then trains PPO on sigmoid(r̂(s')) alone, so
the policy can beat the best demonstration. Paper: Brown, Goo, Nagarajan, Niekum (2019), "Extrapolating Beyond
Suboptimal Demonstrations via Inverse Reinforcement Learning from Observations", ICML (arXiv 1904.06387).
Defaults follow hiwonjoon/ICML2019-TREX (reward learning) and CleanRL's ppo_atari.py (PPO). Usage:
    python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4                 # the whole pipeline, paper budgets
    python trex_ppo_atari.py --demonstrator.total-timesteps 8192 --policy.total-timesteps 8192 \\
        --reward.num-pairs 300 --reward.epochs 1 --eval.episodes 2 --env.max-episode-frames 4000  # minutes, CPU
    python trex_ppo_atari.py --run-dir runs/X ...      # the same command again resumes where it stopped
    python trex_ppo_atari.py --eval-only runs/X        # evaluate runs/X/policy.pt again
Progress: a bar on a terminal; stderr to a file or pipe: a line every 30 s (env PROGRESS_EVERY_S).
Flags, file formats, the run directory and the deliberate differences: docs/trex_ppo_atari.md.
"""

import contextlib
import ctypes
import difflib
import json
import math
import os
import random
import re
import shlex
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.distributions import Categorical
from tqdm import tqdm

# tensorboard, matplotlib, scipy, cv2 and ale_py are imported where they are used, so that importing this file
# (tests) and rejecting bad input (exit 2) stay fast.


def ranged(default, lo: float, hi: float):
    """A setting's default and the range [lo, hi] it must lie in (checked before any work: exit 2)."""
    return field(default=default, metadata={"range": (lo, hi)})


@dataclass
class EnvArgs:
    sticky_actions: float = ranged(-1.0, -1, 1)
    """repeat_action_probability; -1 = 0.0 for *NoFrameskip-v4, 0.25 for ALE/*-v5"""
    noop_max: int = ranged(30, 0, 1e4)  # up to this many no-ops at every reset (0 = off)
    max_episode_frames: int = ranged(108_000, 4, 1e8)  # emulator frames per game before truncation (27,000 agent steps)
    episodic_life: bool = True  # PPO phases: a lost life ends the learner's episode (the game goes on)


@dataclass
class PPOArgs:
    """PPO of both the demonstrator and the T-REX policy (CleanRL ppo_atari.py defaults)."""

    num_envs: int = ranged(8, 1, 1024)  # parallel environments
    num_steps: int = ranged(128, 1, 1e5)  # steps per environment per rollout
    learning_rate: float = ranged(2.5e-4, 1e-12, 1)  # Adam learning rate
    anneal_lr: bool = True  # linearly anneal the learning rate to 0 over the phase
    gamma: float = ranged(0.99, 0, 1)  # discount factor
    gae_lambda: float = ranged(0.95, 0, 1)  # GAE lambda
    num_minibatches: int = ranged(4, 1, 1e6)  # minibatches per epoch
    update_epochs: int = ranged(4, 1, 1000)  # epochs per rollout
    norm_adv: bool = True  # normalise advantages per minibatch
    clip_coef: float = ranged(0.1, 1e-6, 10)  # PPO clip range (also used for the value clip)
    clip_vloss: bool = True  # clipped value loss
    ent_coef: float = ranged(0.01, 0, 100)  # entropy bonus (0 = off)
    vf_coef: float = ranged(0.5, 0, 100)  # value loss weight
    max_grad_norm: float = ranged(0.5, 0, 1e6)  # gradient-norm clip (0 = off)
    target_kl: Optional[float] = ranged(None, 1e-12, 100)  # stop the epochs early above this approximate KL


@dataclass
class DemonstratorArgs:
    """Phase 1: PPO on the true, clipped reward."""

    total_timesteps: int = ranged(10_000_000, 1, 1e11)  # budget in agent steps (stops earlier at the return ceiling)
    return_ceiling: Optional[float] = ranged(None, -1e12, 1e12)
    """stop once the recent mean score reaches this; default: paper's best demo"""
    ceiling_window: int = ranged(20, 1, 1e6)  # number of recent training games averaged for the ceiling test
    snapshot_every: int = ranged(0, 0, 1e9)  # save a snapshot every N iterations (0 = about 50 over the budget)


@dataclass
class CollectArgs:
    """Phase 2: demonstrations from the demonstrator's snapshots."""

    num_snapshots: int = ranged(12, 2, 1e4)  # snapshots (of increasing training time) to draw demos from
    episodes_per_snapshot: int = ranged(1, 1, 1e4)  # stochastic full games per snapshot (the paper: 1)


@dataclass
class RewardArgs:
    """Phase 3: Bradley-Terry reward learning on snippet pairs."""

    mask_top: int = ranged(-1, -1, 83)
    """rows hidden at the top of every frame (score, lives); -1 = the game's default (SCORE_MASKS)"""
    mask_bottom: int = ranged(-1, -1, 83)  # rows hidden at the bottom of every frame; -1 = the game's default
    sampling: Literal["offline", "live"] = "offline"  # offline: the paper's fixed pairs; live: fresh pairs every step
    num_pairs: int = ranged(6000, 1, 1e8)  # offline training pairs
    epochs: int = ranged(5, 1, 1e6)  # passes over the offline pairs (paper: 5 x 6000 = 30,000 steps)
    live_steps: int = ranged(30_000, 1, 1e9)  # optimiser steps with live sampling
    min_len: int = ranged(50, 1, 1e5)  # shortest snippet, in observations (capped by the shortest demo)
    max_len: int = ranged(100, 1, 1e5)  # longest snippet, inclusive (capped by the shortest demo)
    live_len: int = ranged(50, 1, 1e5)  # fixed snippet length with live sampling
    stride: int = ranged(2, 1, 1000)  # keep every k-th observation inside a snippet (live sampling: 1)
    batch_size: int = ranged(1, 1, 1e4)  # pairs per optimiser step (paper: 1)
    lr: float = ranged(5e-5, 1e-12, 1)  # Adam learning rate
    weight_decay: float = ranged(0.0, 0, 10)  # Adam weight decay (0 = off)
    val_fraction: float = ranged(0.1, 1e-6, 1)
    """extra held-out pairs, as a fraction of the training pairs, for validation accuracy"""
    eval_every: int = ranged(500, 1, 1e9)  # optimiser steps between validations
    patience: int = ranged(10, 1, 1e9)
    """stop after this many validations without a better accuracy (keeps the best model)"""


@dataclass
class PolicyArgs:
    """Phase 4: PPO on the learned reward."""

    total_timesteps: int = ranged(12_500_000, 1, 1e11)  # agent steps (the paper's 50M frames at frameskip 4)
    reward: Literal["sigmoid", "raw", "normalized", "env"] = "sigmoid"
    """sigmoid(r̂(s')) as the paper; raw r̂; r̂ normalised by running stats; env = clipped true reward (ablation)"""


@dataclass
class EvalArgs:
    """Phase 5 (and --eval-only): full games, stochastic policy."""

    seeds: list[int] = field(default_factory=lambda: [1234, 12345, 123456])  # evaluation seeds (paper: best mean of 3)
    episodes: int = ranged(30, 1, 1e5)  # full games per seed
    num_envs: int = ranged(8, 1, 1024)  # parallel environments for evaluation


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # the name of this experiment
    seed: int = ranged(1, 0, 4294967295)  # seed of the experiment
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # use the GPU when one is available (falls back to the CPU)
    track: bool = False  # log to Weights and Biases as well (needs wandb installed)
    wandb_project_name: str = "cleanRL"  # the wandb's project name
    wandb_entity: Optional[str] = None  # the entity (team) of wandb's project
    capture_video: bool = False  # record the first evaluation game of each seed's first env to videos/ (VP9 WebM)
    torch_threads: int = ranged(0, 0, 1024)
    """CPU threads for torch (0 = torch's default; use 1 on a CPU shared with other jobs)"""
    env_id: str = "BreakoutNoFrameskip-v4"  # gymnasium-style Atari id (BreakoutNoFrameskip-v4, ALE/Breakout-v5)
    run_dir: Optional[str] = None  # default runs/{env_id}__{exp_name}__{seed}__{time}; an existing one is resumed
    demos: Optional[str] = None  # npz of your own demonstrations (skips phases 1-2); format in docs/trex_ppo_atari.md
    reward_model: Optional[str] = None  # a reward_model.pt saved by this script (skips phases 1-3)
    stop_after: Optional[Literal["demonstrator", "demos", "reward", "policy"]] = None
    """stop after this phase; re-running with the same --run-dir continues"""
    checkpoint_every: int = ranged(10, 1, 1e9)
    """PPO iterations between resume checkpoints (also at the end and on SIGINT/SIGTERM)"""
    eval_only: Optional[str] = None  # evaluate RUN_DIR/policy.pt with --eval.*, into RUN_DIR/evaluations/eval_NNN.json
    env: EnvArgs = field(default_factory=EnvArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    demonstrator: DemonstratorArgs = field(default_factory=DemonstratorArgs)
    collect: CollectArgs = field(default_factory=CollectArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    policy: PolicyArgs = field(default_factory=PolicyArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


# Rows of the 84x84 frame hidden from the reward net (top, bottom), as hiwonjoon/ICML2019-TREX's
# trex_utils.py hides the score and lives.
SCORE_MASKS = {"space_invaders": (10, 0), "breakout": (10, 0), "pong": (10, 0), "qbert": (12, 0)}
SCORE_MASKS |= {"beam_rider": (16, 11), "enduro": (0, 14), "hero": (0, 30), "seaquest": (12, 16)}
SCORE_MASKS |= {"ms_pacman": (0, 15), "video_pinball": (15, 0), "montezuma_revenge": (10, 0)}
DEFAULT_MASK = (10, 0)  # other games: the top 10 rows; check with a frame!
# The paper's best-demo scores: the demonstrator stops once it is this good (the demos stay suboptimal).
PAPER_BEST_DEMO = {"beam_rider": 1332.0, "breakout": 32.0, "enduro": 84.0, "hero": 13235.0}
PAPER_BEST_DEMO |= {"pong": -6.0, "qbert": 800.0, "seaquest": 600.0, "space_invaders": 600.0}
PAPER_BREAKOUT = {"best_demo": 32.0, "average_demo": 14.5, "trex": 221.3}


def score_mask(rom: str, reward: RewardArgs) -> tuple[int, int]:
    """(top, bottom) rows hidden from the reward net: the flags, or the game's default for a -1."""
    flags, defaults = (reward.mask_top, reward.mask_bottom), SCORE_MASKS.get(rom, DEFAULT_MASK)
    return tuple(flag if flag >= 0 else default for flag, default in zip(flags, defaults))


# ---- Stopping
# A SIGINT/SIGTERM sets STOP (the handler start_run installs); the long loops check it and
# raise Interrupted once the phase saved what it can: main exits 130 with the resume command.
STOP = {"signal": 0}


class Interrupted(Exception):  # SIGINT/SIGTERM arrived; the phase saved what it could
    exit_code = 130


class NonFiniteLoss(Exception):  # a loss became NaN or infinite
    exit_code = 3


# ---- Environments
def make_envs(game: dict, num_envs: int, life_loss: bool):
    """AtariVectorEnv with explicit semantics: 84x84 gray, 4-stack, frameskip 4 with max-pool, no
    reward clipping (the learner clips; the true score is logged), same-step autoreset (the last
    frame of a finished game is in info["final_obs"]). `game` holds rom, sticky, noop_max and
    max_episode_frames (saved in policy.pt as env_config). `life_loss` ends the learner's episode at
    a lost life *without* resetting the game (ale-py's episodic_life=True resets the whole game at
    every lost life, so it is not used)."""
    from ale_py.vector_env import AtariVectorEnv

    frames = dict(img_height=84, img_width=84, grayscale=True, maxpool=True, stack_num=4, frameskip=4)
    rules = dict(repeat_action_probability=game["sticky"], noop_max=game["noop_max"])
    ends = dict(episodic_life=False, life_loss_info=life_loss)
    ends["max_num_frames_per_episode"] = game["max_episode_frames"]
    resets = dict(autoreset_mode="SameStep", use_fire_reset=True, reward_clipping=False)
    return AtariVectorEnv(game["rom"], num_envs, **frames, **rules, **ends, **resets, full_action_space=False)


def emulator_seeds(seed: int, num_envs: int) -> np.ndarray:
    """seed, seed + 1, ... for the envs' emulators, which take 32-bit seeds: wrapped below 2**31 (unchanged below
    it), so a large --seed, an evaluation seed or a long run's seed + offset never overflows them."""
    return (seed + np.arange(num_envs, dtype=np.int64)) % 2**31


def fire_action(rom: str) -> Optional[int]:
    """1 when FIRE is action 1 of >= 3 in the minimal action set (FireResetEnv's rule); else None."""
    from ale_py import ALEInterface, LoggerMode, roms

    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.loadROM(roms.get_rom_path(rom))
    actions = [str(a).split(".")[-1] for a in ale.getMinimalActionSet()]
    return 1 if len(actions) >= 3 and actions[1] == "FIRE" else None


class GameTracker:
    """True game score and length per env, across life losses. A game is over when the env's
    episode frame counter restarts (same-step autoreset): with life_loss_info a termination may
    only be a lost life."""

    def __init__(self, num_envs: int):
        self.score = np.zeros(num_envs)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.prev_frame = np.zeros(num_envs, dtype=np.int64)

    def step(self, reward, info) -> np.ndarray:
        self.score += reward
        self.length += 1
        frame = info["episode_frame_number"].astype(np.int64)
        over, self.prev_frame = frame < self.prev_frame, frame
        return over

    def pop(self, over: np.ndarray) -> list[tuple[float, int]]:
        games = [(float(self.score[i]), int(self.length[i])) for i in np.flatnonzero(over)]
        self.score[over], self.length[over] = 0.0, 0
        return games


# ---- Networks
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature-CNN actor-critic (CleanRL ppo_atari.py) on uint8 (N, 4, 84, 84). Weights and
    activations are channels-last (uint8 converted before the float cast): oneDNN's CPU convolutions
    ran the PPO update 1.4x faster."""

    def __init__(self, num_actions: int, env_id: str = "", env_config: Optional[dict] = None):
        super().__init__()
        self.env_id, self.env_config = env_id, env_config or {}
        specs = ((4, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1))
        convs = [layer_init(nn.Conv2d(i, o, k, stride=s)) for i, o, k, s in specs]
        layers = [layer for conv in convs for layer in (conv, nn.ReLU())]
        head = [nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU()]
        self.network = nn.Sequential(*layers, *head)
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)
        self.to(memory_format=torch.channels_last)

    def forward(self, obs):
        hidden = self.network(obs.contiguous(memory_format=torch.channels_last).float() / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Env observations (N, 4, 84, 84) uint8 -> actions (N,) sampled from the policy."""
        logits = self(torch.as_tensor(obs, device=next(self.parameters()).device))[0]
        return Categorical(logits=logits).sample().cpu().numpy()


class RewardNet(nn.Module):
    """T-REX Atari reward net: 4 convs x 16 channels with leaky ReLU, FC 64, scalar r̂(s); state
    only. The score mask is a buffer applied inside forward: no caller can show it the score."""

    def __init__(self, mask_top: int = 10, mask_bottom: int = 0):
        super().__init__()
        rows = torch.arange(84)  # 0 on the hidden rows (score, lives), 1 elsewhere
        keep_rows = (rows >= mask_top) & (rows < 84 - mask_bottom)
        self.register_buffer("keep_rows", keep_rows.float().view(1, 1, 84, 1))
        self.mask_top, self.mask_bottom = mask_top, mask_bottom
        specs = ((4, 7, 3), (16, 5, 2), (16, 3, 1), (16, 3, 1))
        convs = [nn.Conv2d(i, 16, k, stride=s) for i, k, s in specs]
        layers = [layer for conv in convs for layer in (conv, nn.LeakyReLU())]
        head = [nn.Flatten(), nn.Linear(784, 64), nn.LeakyReLU(), nn.Linear(64, 1)]
        self.body = nn.Sequential(*layers, *head)
        self.to(memory_format=torch.channels_last)  # as Agent: faster CPU convolutions

    def forward(self, obs):
        x = obs.contiguous(memory_format=torch.channels_last).float()
        return self.body(x * (self.keep_rows / 255.0)).squeeze(-1)


# ---- The math (pure functions)
def trex_loss(return_a, return_b, label):
    """Bradley-Terry loss: -log P(preferred snippet), P = softmax([R_a, R_b]); label 0 = a
    preferred, 1 = b. Computed with log-softmax, so returns of any size stay finite."""
    return F.cross_entropy(torch.stack([return_a, return_b], dim=-1), label)


def sample_snippet_pairs(lengths, scores, num_pairs, min_len, max_len, stride, rng):
    """The paper's snippet-pair rule. Two demos with *different* scores; a length L uniform in
    [min_len, max_len] (inclusive, capped by the shortest demo); the worse demo's snippet starts
    uniform in [0, min(len_i, len_j) - L], the better one's uniform in [start_worse, len_better - L]
    -- never earlier (progress prior). Returns int64 arrays (demo_a, start_a, demo_b, start_b,
    length, label); label 1 means b is better; the order within a pair is random. Snippet
    observations are start + stride * k, k < ceil(L / stride)."""
    lengths, scores = np.asarray(lengths), np.asarray(scores, dtype=np.float64)
    max_len = min(max_len, int(lengths.min()))
    min_len = min(min_len, max_len)
    out = np.zeros((num_pairs, 6), dtype=np.int64)
    n = 0
    while n < num_pairs:
        i, j = rng.choice(len(lengths), size=2, replace=False)
        if scores[i] == scores[j]:
            continue
        worse, better = (i, j) if scores[i] < scores[j] else (j, i)
        length = int(rng.integers(min_len, max_len + 1))
        start_worse = int(rng.integers(0, min(lengths[i], lengths[j]) - length + 1))
        start_better = int(rng.integers(start_worse, lengths[better] - length + 1))
        b_better = (worse, start_worse, better, start_better, length, 1)
        a_better = (better, start_better, worse, start_worse, length, 0)
        out[n] = b_better if rng.random() < 0.5 else a_better
        n += 1
    return tuple(out.T.copy())


def snippet_obs_index(offsets, demo, start, length, stride):
    """Frame-store index of each snippet observation, and the snippet it is in (for the sums)."""
    counts = -(-np.asarray(length) // stride)
    snippet = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    first = np.asarray(offsets)[np.asarray(demo)] + np.asarray(start)  # of each snippet
    obs_index = first[snippet] + within * stride
    return obs_index, snippet


def gather_stacks(frames, obs_index):
    """frames (F, 84, 84): single frames of concatenated demos; obs t = frames[o+t : o+t+4]."""
    first = torch.as_tensor(obs_index, device=frames.device)
    idx = first[:, None] + torch.arange(4, device=frames.device)
    return frames[idx]


def pair_returns(net, frames, offsets, pairs, stride):
    """Summed r̂ of both snippets of every pair, in one batched pass; returns (R_a, R_b, labels)."""
    demo_a, start_a, demo_b, start_b, length, label = pairs
    demos, starts = np.concatenate([demo_a, demo_b]), np.concatenate([start_a, start_b])
    idx, snippet = snippet_obs_index(offsets, demos, starts, np.tile(length, 2), stride)
    r = net(gather_stacks(frames, idx))
    sums = torch.zeros(2 * len(label), device=r.device)
    sums.index_add_(0, torch.as_tensor(snippet, device=r.device), r)
    return sums[: len(label)], sums[len(label) :], torch.as_tensor(label, device=r.device)


def demo_returns(net, frames, offsets, lengths, transform=None, chunk: int = 512):
    """Predicted return of each demo: the sum of r̂ (or transform(r̂)) over its observations."""
    transform = transform or (lambda r: r)
    out = []
    with torch.no_grad():
        for offset, n in zip(offsets, lengths):
            if STOP["signal"]:  # thousands of demo frames: answer a signal within one demo
                raise Interrupted("reward learning interrupted (it restarts on resume)")
            idx = np.arange(offset, offset + n)
            parts = (gather_stacks(frames, idx[k : k + chunk]) for k in range(0, n, chunk))
            out.append(sum(float(transform(net(part)).sum()) for part in parts))
    return np.array(out)


def next_frame_reward_hat(reward_net, frames, next_obs, final_frames: dict, chunk: int):
    """r̂(s_{t+1}) for every step of a rollout, shape (T, N). `frames` (T, N, 84, 84, 4) holds
    s_0..s_{T-1}, so s_{t+1} is frames[t + 1], `next_obs` after the last step; final_frames[t] =
    (envs, stacks) for the envs whose game ended at step t (the env has already reset them; their
    true last frame is what the reward must see)."""
    T, N = frames.shape[:2]
    flat = frames.view(T * N, 84, 84, 4).permute(0, 3, 1, 2)
    r_hat_seen = torch.cat([reward_net(c) for c in flat.split(chunk)]).view(T, N)
    r_hat = torch.cat([r_hat_seen[1:], reward_net(next_obs)[None]])
    for step, (envs, stacks) in final_frames.items():
        r_hat[step, envs] = reward_net(stacks)
    return r_hat


def finished_game_sums(rewards, over, running) -> list:
    """Adds each step's rewards (T, N) to the per-env running sums (N,) in place; at over[t] (game
    over after step t) that env's sum is returned (one tensor per such step) and restarted."""
    out = []
    for t in range(rewards.shape[0]):
        running.add_(rewards[t])
        if over[t].any():
            done = torch.as_tensor(over[t])
            out.append(running[done].clone())
            running[done] = 0.0
    return out


def compute_gae(rewards, values, dones, next_value, next_done, gamma: float, gae_lambda: float):
    """GAE over (T, N) tensors; dones[t] is the done flag that came *with* obs t.
    Returns (advantages, returns)."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        nonterminal = 1.0 - (next_done if t == T - 1 else dones[t + 1])
        next_v = next_value if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * gae_lambda * nonterminal * last
        advantages[t] = last
    return advantages, advantages + values


def masked_mean(x, mask):
    """Mean over mask == 1 (where, not a product: an inf on a masked-out sample stays out)."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def ppo_loss(new_logp, old_logp, entropy, new_value, old_value, advantages, returns, valid, ppo: PPOArgs):
    """Clipped PPO objective averaged over valid samples (valid = 0: an action the policy did not
    choose, the automatic FIRE after a lost life).
    Returns (loss, pg_loss, v_loss, entropy, approx_kl, clipfrac)."""
    logratio = new_logp - old_logp
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - logratio, valid)
        clipfrac = masked_mean(((ratio - 1.0).abs() > ppo.clip_coef).float(), valid)
    if ppo.norm_adv:
        mean = masked_mean(advantages, valid)
        advantages = (advantages - mean) / (torch.sqrt(masked_mean((advantages - mean) ** 2, valid)) + 1e-8)
    clipped_ratio = ratio.clamp(1 - ppo.clip_coef, 1 + ppo.clip_coef)
    pg_loss = masked_mean(torch.max(-advantages * ratio, -advantages * clipped_ratio), valid)
    v_loss = (new_value - returns) ** 2
    if ppo.clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-ppo.clip_coef, ppo.clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - returns) ** 2)
    v_loss = 0.5 * masked_mean(v_loss, valid)
    ent = masked_mean(entropy, valid)
    return pg_loss - ppo.ent_coef * ent + ppo.vf_coef * v_loss, pg_loss, v_loss, ent, approx_kl, clipfrac


class RunningMeanStd:
    """Running mean/variance (Chan's parallel update) for --policy.reward normalized."""

    def __init__(self, device):
        self.mean, self.var = torch.zeros((), device=device), torch.ones((), device=device)
        self.count = torch.full((), 1e-4, device=device)

    def update(self, x):
        b_mean, b_var, b_count = x.mean(), x.var(unbiased=False), x.numel()
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * b_count / total
        self.var = (self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total) / total
        self.count = total


def policy_rewards(r_hat, kind: str, rms: RunningMeanStd):
    """The reward PPO sees, from r̂(s'): sigmoid (the paper), raw, or normalised (running stats)."""
    if kind == "sigmoid":
        return torch.sigmoid(r_hat)
    if kind == "normalized":
        rms.update(r_hat.reshape(-1))
        return (r_hat - rms.mean) / torch.sqrt(rms.var + 1e-8)
    return r_hat


# ---- Progress of the long phases
PROGRESS_EVERY_S = float(os.environ.get("PROGRESS_EVERY_S", "30"))  # plain lines off a terminal


class Progress:
    """A tqdm bar on a terminal; when stderr is not one (a log file, a pipe), a plain line on stderr
    every PROGRESS_EVERY_S seconds: `[phase] step/total unit, rate unit/s, latest values`."""

    def __init__(self, total: int, desc: str, initial: int = 0, unit: str = "it"):
        self.tty = sys.stderr.isatty()
        bar = {"total": total, "initial": initial, "desc": desc, "unit": unit}
        self.bar = tqdm(**bar, file=sys.stderr, dynamic_ncols=True, disable=not self.tty)
        self.total, self.desc, self.unit, self.n, self.postfix = total, desc, unit, initial, {}
        self.n0, self.t0 = initial, time.time()
        self.last = self.t0

    def update(self, n: int = 1, **postfix):
        """n more done; postfix: the latest values to show (step, SPS, score, ...)."""
        self.n += n
        self.bar.update(n)
        if postfix:
            self.postfix = postfix
            self.bar.set_postfix(**postfix)
        if not self.tty and time.time() - self.last >= PROGRESS_EVERY_S:
            self.last = time.time()
            rate = (self.n - self.n0) / max(self.last - self.t0, 1e-9)
            shown = "".join(f", {k} {v}" for k, v in self.postfix.items())
            done = f"[{self.desc}] {self.n}/{self.total} {self.unit}"
            print(f"{done}, {rate:.3g} {self.unit}/s{shown}", file=sys.stderr, flush=True)

    def close(self):
        self.bar.close()


# ---- PPO (phase 1 on the true reward, phase 4 on the learned one)
class Rollout:
    """One rollout's buffers. Frames are stored channels-last (T, N, 84, 84, 4): a minibatch is then
    one contiguous index_select that the network reads as an NHWC view, ~25x cheaper than gathering
    NCHW frames and converting."""

    def __init__(self, T: int, N: int, device):
        self.obs = torch.zeros((T, N, 84, 84, 4), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((T, N), dtype=torch.long, device=device)
        floats = [torch.zeros((T, N), device=device) for _ in range(5)]
        self.logp, self.rewards, self.dones, self.values, self.valid = floats
        # game over after step t (for the learned-reward game sums)
        self.over = np.zeros((T, N), dtype=bool)
        # step -> (envs, their true last frames) where a game ended at that step
        self.final_frames: dict = {}
        self.games: list = []  # (true score, length) of the games finished in this rollout


class Player:
    """The envs of a PPO phase and what carries over between rollouts (next obs, FIRE to press)."""

    def __init__(self, envs, rom_fire: Optional[int], seed: int, device):
        self.envs, self.fire, self.device = envs, rom_fire, device
        self.tracker = GameTracker(envs.num_envs)
        obs, _ = envs.reset(seed=emulator_seeds(seed, envs.num_envs))
        # A zero-copy view of the env's frames (on the CPU): each step copies them once, into the
        # rollout buffer, before the env is stepped again, so the env reusing its buffer is safe.
        self.next_obs = torch.from_numpy(obs).to(device)
        self.next_done = torch.zeros(envs.num_envs, device=device)
        self.need_fire = np.zeros(envs.num_envs, dtype=bool)

    def rollout(self, agent: Agent, buf: Rollout, keep_final_frames: bool) -> None:
        """Fills buf with num_steps steps of every env. After a lost life the reference's
        FireResetEnv presses FIRE in reset(); here the game goes on, so FIRE is pressed for the
        policy and left out of the loss (valid = 0)."""
        buf.final_frames, buf.games = {}, []
        for step in range(buf.obs.shape[0]):
            if STOP["signal"]:
                raise Interrupted("stopped inside a rollout")
            buf.obs[step] = self.next_obs.permute(0, 2, 3, 1)
            buf.dones[step] = self.next_done
            with torch.no_grad():
                logits, value = agent(buf.obs[step].permute(0, 3, 1, 2))
                dist = Categorical(logits=logits)
                action = dist.sample()
            buf.actions[step] = action
            buf.logp[step] = dist.log_prob(action)
            buf.values[step] = value
            action_np = action.cpu().numpy()
            if self.need_fire.any():
                action_np[self.need_fire] = self.fire
            buf.valid[step] = torch.as_tensor(~self.need_fire, dtype=torch.float32)
            obs, reward, term, trunc, info = self.envs.step(action_np)
            over = self.tracker.step(reward, info)
            buf.games += self.tracker.pop(over)
            buf.over[step] = over
            if self.fire is not None:
                self.need_fire = term & ~over
            # final_obs is only meaningful where a game really ended: at a lost life (and in envs
            # that did not end) it holds stale memory, which made the policy phase irreproducible.
            if keep_final_frames and over.any():
                envs = np.flatnonzero(over)
                buf.final_frames[step] = (envs, torch.tensor(info["final_obs"][envs], device=self.device))
            buf.rewards[step] = torch.as_tensor(np.sign(reward), dtype=torch.float32)
            self.next_obs = torch.from_numpy(obs).to(self.device)
            self.next_done = torch.as_tensor(term | trunc, dtype=torch.float32, device=self.device)


def ppo_update(agent: Agent, optimizer, buf: Rollout, advantages, returns, ppo: PPOArgs) -> dict:
    """update_epochs x num_minibatches clipped-PPO steps on random minibatches; the last losses."""
    batch_size = buf.actions.numel()
    minibatch_size = batch_size // ppo.num_minibatches
    b_obs = buf.obs.view(-1, 84, 84, 4)
    b_actions, b_logp = buf.actions.reshape(-1), buf.logp.reshape(-1)
    b_adv, b_ret = advantages.reshape(-1), returns.reshape(-1)
    b_val, b_valid = buf.values.reshape(-1), buf.valid.view(-1)
    clipfracs = []
    for _epoch in range(ppo.update_epochs):
        perm = torch.randperm(batch_size)
        for start in range(0, batch_size, minibatch_size):
            # drawn on the CPU: one RNG stream on any device
            mb = perm[start : start + minibatch_size].to(b_obs.device)
            logits, new_value = agent(b_obs.index_select(0, mb).permute(0, 3, 1, 2))
            dist = Categorical(logits=logits)
            new_logp, entropy = dist.log_prob(b_actions[mb]), dist.entropy()
            loss, pg_loss, v_loss, entropy, approx_kl, clipfrac = ppo_loss(
                new_logp, b_logp[mb], entropy, new_value, b_val[mb], b_adv[mb], b_ret[mb], b_valid[mb], ppo
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if ppo.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(agent.parameters(), ppo.max_grad_norm)
            optimizer.step()
            clipfracs.append(clipfrac)
        if ppo.target_kl is not None and approx_kl.item() > ppo.target_kl:
            break
    losses = {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss}
    losses |= {"entropy": entropy, "approx_kl": approx_kl}
    losses = {k: v.item() for k, v in losses.items()}
    return losses | {"clipfrac": torch.stack(clipfracs).mean().item()}


def relabel_rollout(buf: Rollout, next_obs, reward_net, args: Args, rms, running) -> list:
    """Phase 4's rewards: buf.rewards = f(r̂(s')) for the whole rollout, in batched passes of a
    minibatch's size. Returns the learned return of each game that ended in it (`running`: each
    env's sum over its game so far)."""
    chunk = buf.actions.numel() // args.ppo.num_minibatches
    with torch.no_grad():
        r_hat = next_frame_reward_hat(reward_net, buf.obs, next_obs, buf.final_frames, chunk)
        buf.rewards[:] = policy_rewards(r_hat, args.policy.reward, rms)
        sums = finished_game_sums(buf.rewards, buf.over, running)
    return torch.cat(sums).tolist() if sums else []


def train_ppo(args, game, phase, writer, device, run_dir, plot, resume=None, reward_net=None, ceiling=None):
    """CleanRL's PPO for getattr(args, phase).total_timesteps, resumed from `resume`; plot(history)
    redraws the learning curve at each checkpoint. With `reward_net` the env reward is discarded:
    r = f(r̂(s')) (relabel_rollout). The demonstrator stops at `ceiling`."""
    ppo = args.ppo
    num_iterations = -(-getattr(args, phase).total_timesteps // (ppo.num_envs * ppo.num_steps))  # ceil: exact ints
    envs = make_envs(game, ppo.num_envs, life_loss=args.env.episodic_life)
    agent = Agent(int(envs.single_action_space.n), args.env_id, game).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=ppo.learning_rate, eps=1e-5)
    rms = RunningMeanStd(device)
    state = {"iteration": 0, "global_step": 0, "history": [], "done": False}
    if resume_ppo(resume, phase, num_iterations, agent, optimizer, rms, state):
        envs.close()
        return agent, state

    def checkpoint():
        ckpt = {"agent": agent.state_dict(), "optimizer": optimizer.state_dict()}
        ckpt |= {"reward_rms": dict(vars(rms)), "rng": rng_state(), "state": state}
        save(run_dir / "checkpoints" / f"{phase}.pt", "ppo_checkpoint", **ckpt)
        plot(state["history"])

    def snapshot():  # the demonstrator's snapshots of rising quality, which phase 2 plays
        it, step = state["iteration"], state["global_step"]
        path = run_dir / "demonstrator" / f"ckpt_{it:05d}.pt"
        save(path, "snapshot", agent=agent.state_dict(), iteration=it, global_step=step)

    snapshot_every = args.demonstrator.snapshot_every or max(1, num_iterations // 50)
    if phase == "demonstrator" and state["iteration"] == 0:
        snapshot()  # the untrained policy: the worst demonstrator
    seed = args.seed + 7919 * state["iteration"] + (0 if phase == "demonstrator" else 104729)
    fire = fire_action(game["rom"]) if args.env.episodic_life else None
    player = Player(envs, fire, seed, device)
    relabel = reward_net is not None and args.policy.reward != "env"
    running = torch.zeros(ppo.num_envs, device=device)  # learned return of each env's game so far
    recent = deque((h[1] for h in state["history"]), maxlen=args.demonstrator.ceiling_window)
    buf = Rollout(ppo.num_steps, ppo.num_envs, device)
    bar = Progress(num_iterations, phase, state["iteration"], "iteration")
    clock = {}  # SPS counts from the end of this process's first iteration (after warm-up)
    try:
        for iteration in range(state["iteration"] + 1, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if ppo.anneal_lr else 1.0
            lr_now = ppo.learning_rate * frac
            optimizer.param_groups[0]["lr"] = lr_now
            player.rollout(agent, buf, keep_final_frames=relabel)
            learned_games = None
            if relabel:
                learned_games = relabel_rollout(buf, player.next_obs, reward_net, args, rms, running)
            with torch.no_grad():
                next_value = agent(player.next_obs)[1]
                advantages, returns = compute_gae(
                    buf.rewards, buf.values, buf.dones, next_value, player.next_done, ppo.gamma, ppo.gae_lambda
                )
            losses = ppo_update(agent, optimizer, buf, advantages, returns, ppo)
            if not math.isfinite(losses["loss"]):
                raise NonFiniteLoss(f"[{phase}] non-finite loss at iteration {iteration}: lower --ppo.learning-rate")
            state["iteration"] = iteration
            state["global_step"] += buf.actions.numel()
            log_iteration(writer, state, buf, losses, returns, learned_games, lr_now, clock)
            recent.extend(score for score, _ in buf.games)
            score = f"{np.mean(recent):.1f}" if recent else "-"
            bar.update(1, step=state["global_step"], SPS=int(state.get("sps", 0)), score=score)
            if phase == "demonstrator" and iteration % snapshot_every == 0:
                snapshot()
            if ceiling is not None and len(recent) == recent.maxlen and np.mean(recent) >= ceiling:
                print(f"[{phase}] {len(recent)}-game mean reached the ceiling {ceiling}: stop (demos stay suboptimal)")
                state["stopped_at_ceiling"] = True
                break
            if iteration % args.checkpoint_every == 0:
                checkpoint()
    except Interrupted:
        checkpoint()  # the model is as the last whole iteration left it: save that state
        raise Interrupted(f"{phase} stopped at iteration {state['iteration']}") from None
    finally:
        bar.close()
        envs.close()
    if phase == "demonstrator" and state["iteration"] % snapshot_every != 0:
        snapshot()
    state["done"] = True
    checkpoint()
    return agent, state


def log_iteration(writer, state: dict, buf, losses: dict, returns, learned_games: Optional[list], lr, clock: dict):
    """The finished games (true score; learned return with a learned reward) into the history and
    TensorBoard, with the losses and the SPS since the clock started."""
    step = state["global_step"]
    if not clock:
        clock.update(step=step, time=time.perf_counter())
    elif step > clock["step"]:
        state["sps"] = (step - clock["step"]) / (time.perf_counter() - clock["time"])
        writer.add_scalar("charts/SPS", state["sps"], step)
    for k, (score, length) in enumerate(buf.games):
        learned = learned_games[k] if learned_games and k < len(learned_games) else float("nan")
        state["history"].append((step, score, length, learned))
        writer.add_scalar("charts/episodic_return", score, step)
        writer.add_scalar("charts/episodic_length", length, step)
        if learned_games is not None:
            writer.add_scalar("trex/learned_episodic_return", learned, step)
    writer.add_scalar("charts/learning_rate", lr, step)
    for name, value in losses.items():
        writer.add_scalar(f"losses/{name}", value, step)
    var_y = returns.var()
    explained = float("nan") if var_y == 0 else float(1 - (returns - buf.values).var() / var_y)
    writer.add_scalar("losses/explained_variance", explained, step)
    if learned_games is not None:
        writer.add_scalar("trex/mean_step_reward", buf.rewards.mean().item(), step)


def rng_state() -> dict:  # saved in every PPO checkpoint, so a resumed phase draws the same numbers
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    return state | ({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- Phases
def train_demonstrator(args: Args, game: dict, device, run_dir: Path, resume: Optional[dict], plot) -> list:
    """Phase 1: PPO on the true (clipped) reward, snapshots of rising quality in demonstrator/;
    returns its history of finished games."""
    from torch.utils.tensorboard import SummaryWriter

    ceiling = args.demonstrator.return_ceiling
    ceiling = PAPER_BEST_DEMO.get(game["rom"]) if ceiling is None else ceiling
    if ceiling is None:
        print(f"[demonstrator] no paper best-demo score for {game['rom']}: no ceiling (--demonstrator.return-ceiling)")
    with SummaryWriter(str(run_dir / "demonstrator")) as writer:
        _, state = train_ppo(args, game, "demonstrator", writer, device, run_dir, plot, resume, ceiling=ceiling)
    return state["history"]


def collect_demos(args: Args, game: dict, snapshots: list, device, run_dir: Path) -> None:
    """Phase 2: stochastic full games (no life-loss episodes) from >= 12 snapshots of the
    demonstrator, [(iteration, state_dict)]; each frame stored once, into demos.npz (and a table
    of the demos into demos_table.md)."""
    episodes = args.collect.episodes_per_snapshot
    if len(snapshots) < args.collect.num_snapshots:
        episodes = max(episodes, math.ceil(args.collect.num_snapshots / len(snapshots)))
        print(f"[demos] only {len(snapshots)} snapshots: {episodes} games from each")
    env = make_envs(game, 1, life_loss=False)
    agent, collected = Agent(int(env.single_action_space.n)).to(device), []
    bar = Progress(len(snapshots) * episodes, "demos", unit="game")
    for s_i, (iteration, weights) in enumerate(snapshots):
        agent.load_state_dict(weights)
        for episode in range(episodes):
            obs, _ = env.reset(seed=emulator_seeds(args.seed + 1000 * s_i + episode, 1))
            demo_frames, demo_actions, score, done = [obs[0].copy()], [], 0.0, False
            while not done:
                if STOP["signal"]:
                    env.close()
                    raise Interrupted("demo collection interrupted (it restarts on resume)")
                action = agent.act(obs)
                obs, reward, term, trunc, info = env.step(action)
                score, done = score + float(reward[0]), bool(term[0] or trunc[0])
                demo_actions.append(int(action[0]))
                demo_frames.append((info["final_obs"] if done else obs)[0, -1:].copy())
            demo_actions.append(-1)  # the final observation has no action
            demo = (np.concatenate(demo_frames), len(demo_frames), demo_actions, score, iteration)
            collected.append(demo)
            bar.update(1, snapshot=iteration, score=f"{score:.0f}")
    bar.close()
    env.close()
    frames, lengths, actions, returns, snapshot_ids = zip(*collected)
    demos = {"frames": np.concatenate(frames), "lengths": np.array(lengths)}
    demos |= {"actions": np.concatenate(actions), "returns": np.array(returns)}
    demos["checkpoint"] = np.array(snapshot_ids)
    save(run_dir / "demos.npz", "demos", **demos)
    write_demo_table(demos, run_dir / "demos_table.md")


def train_reward(args: Args, demos: dict, mask: tuple, device, run_dir: Path, writer) -> dict:
    """Phase 3: Bradley-Terry reward learning on snippet pairs; the model of the best validation
    accuracy goes into reward_model.pt with its scores (returned)."""
    cfg, rng = args.reward, np.random.default_rng(args.seed)
    frames = torch.as_tensor(demos["frames"], device=device)
    offsets, lengths, scores = demos["offsets"], demos["lengths"], demos["scores"]
    net = RewardNet(*mask).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    live = cfg.sampling == "live"
    stride = 1 if live else cfg.stride
    lo, hi = (cfg.live_len, cfg.live_len) if live else (cfg.min_len, cfg.max_len)
    num_val = max(1, int(cfg.num_pairs * cfg.val_fraction))
    val_pairs = sample_snippet_pairs(lengths, scores, num_val, lo, hi, stride, rng)
    if live:
        total_steps = cfg.live_steps
    else:
        train_pairs = sample_snippet_pairs(lengths, scores, cfg.num_pairs, lo, hi, stride, rng)
        steps_per_epoch = math.ceil(cfg.num_pairs / cfg.batch_size)
        total_steps = cfg.epochs * steps_per_epoch
    best = {"acc": -1.0, "state": None, "step": 0}
    checks_without_gain, losses = 0, []
    bar, shown = Progress(total_steps, "reward", unit="step"), {}
    for step in range(total_steps):
        if STOP["signal"]:
            raise Interrupted("reward learning interrupted (it restarts on resume)")
        if live:
            batch = sample_snippet_pairs(lengths, scores, cfg.batch_size, lo, hi, stride, rng)
        else:
            k = step % steps_per_epoch
            if k == 0:
                order = rng.permutation(cfg.num_pairs)  # reshuffled every pass, as the reference
            batch = tuple(p[order[k * cfg.batch_size : (k + 1) * cfg.batch_size]] for p in train_pairs)
        loss = trex_loss(*pair_returns(net, frames, offsets, batch, stride))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if (step + 1) % cfg.eval_every == 0 or step + 1 == total_steps:
            mean_loss, losses = torch.stack(losses).mean().item(), []
            if not math.isfinite(mean_loss):
                raise NonFiniteLoss(f"[reward] non-finite loss at step {step + 1}: lower --reward.lr")
            acc = pair_accuracy(net, frames, offsets, val_pairs, stride)
            writer.add_scalar("reward/train_loss", mean_loss, step + 1)
            writer.add_scalar("reward/val_accuracy", acc, step + 1)
            shown = {"loss": f"{mean_loss:.3f}", "val_acc": f"{acc:.3f}"}
            checks_without_gain = 0 if acc > best["acc"] else checks_without_gain + 1
            if acc > best["acc"]:
                weights = {k: v.clone() for k, v in net.state_dict().items()}
                best = {"acc": acc, "state": weights, "step": step + 1}
            elif checks_without_gain >= cfg.patience:
                print(f"[reward] early stop at step {step + 1}: no better validation accuracy for {cfg.patience}")
                break
        bar.update(1, **shown)
    bar.close()
    net.load_state_dict(best["state"])
    predicted = demo_returns(net, frames, offsets, lengths)
    # what the policy will collect
    predicted_sigmoid = demo_returns(net, frames, offsets, lengths, torch.sigmoid)
    info = {"val_accuracy": best["acc"], "best_step": best["step"]}
    info |= {"steps_run": step + 1, "num_val_pairs": num_val}
    sigmoid_correlations = correlations(predicted_sigmoid, scores)
    info |= correlations(predicted, scores) | {f"{k}_sigmoid": v for k, v in sigmoid_correlations.items()}
    model = {"state_dict": net.state_dict(), "mask_top": mask[0], "mask_bottom": mask[1], "env_id": args.env_id}
    save(run_dir / "reward_model.pt", "reward_model", **model, info=info)
    true = demos["returns"] if np.isfinite(demos["returns"]).all() else scores
    plot_pred_vs_true(predicted, predicted_sigmoid, true, info, run_dir / "reward_pred_vs_true.png", args.env_id)
    print(f"[reward] val accuracy {best['acc']:.3f}; Spearman of predicted vs true demo returns {info['spearman']:.2f}")
    return info


def pair_accuracy(net, frames, offsets, pairs, stride, batch: int = 16) -> float:
    """Fraction of pairs whose better snippet gets the larger predicted return.
    Batches of 16 pairs: ~360 MB of floats."""
    correct = 0
    with torch.no_grad():
        for k in range(0, len(pairs[0]), batch):
            if STOP["signal"]:  # hundreds of validation pairs: answer a signal within one batch
                raise Interrupted("reward learning interrupted (it restarts on resume)")
            ra, rb, label = pair_returns(net, frames, offsets, tuple(p[k : k + batch] for p in pairs), stride)
            correct += int(((rb > ra).long() == label).sum())
    return correct / len(pairs[0])


def correlations(predicted, true) -> dict:
    from scipy.stats import pearsonr, spearmanr

    if np.ptp(predicted) == 0 or np.ptp(true) == 0:
        return {"spearman": float("nan"), "pearson": float("nan")}
    return {"spearman": float(spearmanr(predicted, true)[0]), "pearson": float(pearsonr(predicted, true)[0])}


def train_policy(args: Args, game: dict, reward_net, device, run_dir: Path, writer, resume, plot):
    """Phase 4: PPO on the learned reward f(r̂(s')) alone (the env's reward is discarded);
    the agent goes into policy.pt, which --eval-only and load_policy read. Returns the agent
    and the phase's state."""
    agent, state = train_ppo(args, game, "policy", writer, device, run_dir, plot, resume, reward_net)
    config = {"num_actions": agent.actor.out_features, "env_config": game}
    policy = {"env_id": args.env_id, "network": "Agent", "config": config}
    save(run_dir / "policy.pt", "policy", **policy, state_dict=agent.state_dict())
    return agent, state


def evaluate(args: Args, agent: Agent, game: dict, video_dir: Path, tag: str) -> dict:
    """Phase 5: the paper's protocol -- full games (no life-loss episodes), stochastic policy,
    N games per seed; each env plays a fixed quota of games, so short games do not count more.
    Videos are written after the last game: an interrupted evaluation writes nothing."""
    per_seed, episodes, videos = [], args.eval.episodes, {}
    bar = Progress(episodes * len(args.eval.seeds), tag, unit="game")
    for seed in args.eval.seeds:
        num_envs = min(args.eval.num_envs, episodes)
        quota = np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)])
        envs = make_envs(game, num_envs, life_loss=False)
        obs, _ = envs.reset(seed=emulator_seeds(seed, num_envs))
        tracker, finished, returns = GameTracker(num_envs), np.zeros(num_envs, dtype=int), []
        video = [obs[0, -1].copy()] if args.capture_video else None
        while (finished < quota).any():
            if STOP["signal"]:
                envs.close()
                raise Interrupted("evaluation interrupted (it restarts on resume)")
            obs, reward, term, trunc, info = envs.step(agent.act(obs))
            over = tracker.step(reward, info)
            if video is not None:
                video.append((info["final_obs"] if over[0] else obs)[0, -1].copy())
            for i in np.flatnonzero(over & (finished < quota)):
                returns.append(float(tracker.score[i]))
                bar.update(1, seed=seed, score=f"{tracker.score[i]:.0f}")
            if video is not None and over[0]:
                videos[video_dir / f"{tag}_seed{seed}.webm"], video = video, None
            finished += over
            tracker.pop(over)
        envs.close()
        mean, std = float(np.mean(returns)), float(np.std(returns))
        per_seed.append({"seed": seed, "mean": mean, "std": std, "returns": returns})
        print(f"[{tag}] seed {seed}: {mean:.2f} +- {std:.2f} over {len(returns)} games")
    bar.close()
    for path, frames in videos.items():
        write_video(frames, path)
    means = [p["mean"] for p in per_seed]
    summary = {"best_mean": max(means), "mean_of_means": float(np.mean(means)), "episodes_per_seed": episodes}
    return {"per_seed": per_seed} | summary


def log_games(writer, tag: str, ev: dict) -> None:
    """Each game's score of an evaluation, numbered seed by seed (tag/episodic_return)."""
    for s_i, per_seed in enumerate(ev["per_seed"]):
        for j, score in enumerate(per_seed["returns"]):
            writer.add_scalar(f"{tag}/episodic_return", score, s_i * ev["episodes_per_seed"] + j + 1)


def demo_stats(returns) -> dict:
    r = np.asarray(returns, dtype=np.float64)
    if r.size == 0 or not np.isfinite(r).all():  # no demos (--reward-model alone) or ranks without returns
        return {"best": None, "average": None, "worst": None, "num_demos": len(r)}
    return {"best": float(r.max()), "average": float(r.mean()), "worst": float(r.min()), "num_demos": len(r)}


def run_pipeline(args: Args, game: dict, run_dir: Path, device, writer, demos, reward, resume, snapshots):
    """Phases 1-5. What validate found in the run dir comes in loaded, and its phase is
    skipped: demos (demos.npz or --demos), reward (reward_model.pt or --reward-model), resume
    (checkpoints/{phase}.pt of each PPO phase), snapshots (of a finished demonstrator)."""
    histories = {phase: ckpt["state"]["history"] for phase, ckpt in resume.items()}
    stats = demo_stats(demos["returns"] if demos is not None else [])

    def plot(phase):  # learning_curve.png of both PPO phases, redrawn at every checkpoint
        return lambda history: plot_learning_curve(run_dir, args.env_id, histories | {phase: history}, stats)

    if demos is None and reward is None:
        if snapshots is None:  # 1. the demonstrator: PPO on the true reward
            resumed, curve = resume.get("demonstrator"), plot("demonstrator")
            histories["demonstrator"] = train_demonstrator(args, game, device, run_dir, resumed, curve)
            if args.stop_after == "demonstrator":
                return None
            snapshots = load_snapshots(run_dir / "demonstrator", args.collect.num_snapshots)
        # 2. ranked demos: full games of its snapshots
        collect_demos(args, game, snapshots, device, run_dir)
        demos = load(run_dir / "demos.npz", "demos")
        stats = demo_stats(demos["returns"])
    if args.stop_after in ("demonstrator", "demos"):
        return None
    if reward is None:  # 3. the reward r̂(s) from ranked snippet pairs
        train_reward(args, demos, score_mask(game["rom"], args.reward), device, run_dir, writer)
        reward = load(run_dir / "reward_model.pt", "reward_model")
    reward_net = reward["net"].to(device).requires_grad_(False)
    if args.stop_after == "reward":
        return None
    # 4. PPO on the learned reward alone
    resumed, curve = resume.get("policy"), plot("policy")
    agent, state = train_policy(args, game, reward_net, device, run_dir, writer, resumed, curve)
    histories["policy"] = state["history"]
    plot_learning_curve(run_dir, args.env_id, histories, stats)
    if args.stop_after == "policy":
        return None
    # 5. evaluation: the paper's protocol, into results.json
    ev = evaluate(args, agent, game, run_dir / "videos", "eval")
    log_games(writer, "eval", ev)
    demonstrator = histories.get("demonstrator")
    results = {"env_id": args.env_id, "seed": args.seed, "demos": stats, "reward": reward["info"]}
    step = state["global_step"]
    results["policy"] = {"global_step": step, "frames": 4 * step}
    results["policy"] |= {"sps": state.get("sps"), "reward": args.policy.reward}
    results["demonstrator"] = {"global_step": int(demonstrator[-1][0])} if demonstrator else None
    results |= {"eval": ev, "trex_score": ev["best_mean"], "device": str(device)}
    results["paper"] = PAPER_BREAKOUT if game["rom"] == "breakout" else None
    plot_learning_curve(run_dir, args.env_id, histories, stats, final_eval=ev["best_mean"])
    save(run_dir / "results.json", "results", **results)
    best, average = stats["best"], stats["average"]
    shown = "no demo scores" if best is None else f"demos best {best:g}, average {average:.2f}"
    print(f"T-REX score {ev['best_mean']:.2f} (best of {len(ev['per_seed'])} seed means); {shown}")
    return results


# ---- run management ----
def main(args: Args) -> Optional[dict]:
    try:
        game, run_dir, found = validate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if found.get("finished") is not None:
        print(f"{run_dir} holds a finished run (results.json, never overwritten): nothing to do")
        return found["finished"]
    device, writer, restore_signals = start_run(args, game, run_dir, found)
    print(f"run directory: {run_dir}")
    try:
        if args.eval_only:
            return evaluate_only(args, game, run_dir, found, device)
        demos, reward, snapshots = found["demos"], found["reward_model"], found["snapshots"]
        return run_pipeline(args, game, run_dir, device, writer, demos, reward, found["checkpoints"], snapshots)
    # a UsageError here: the collected demos are unusable
    except (UsageError, NonFiniteLoss, Interrupted) as e:
        resume = f"; resume with: {resume_command(run_dir)}" if isinstance(e, Interrupted) else ""
        message = f"{'interrupted' if resume else 'error'}: {e}{resume}"
        if resume and args.eval_only:  # its files are written after the last game, or not at all
            message = "interrupted during --eval-only: no evaluation written; the same command starts it again"
        print(message, file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    finally:
        if writer is not None:
            writer.close()
        restore_signals()
        print(f"run directory: {run_dir}")


def evaluate_only(args: Args, game: dict, run_dir: Path, found: dict, device) -> dict:
    """--eval-only RUN_DIR: RUN_DIR/policy.pt evaluated with --eval.*, into evaluations/eval_NNN.json and
    TensorBoard, both written after the last game."""
    from torch.utils.tensorboard import SummaryWriter

    agent, path = found["policy"].to(device), found["eval_path"]
    games = f"{args.eval.episodes} games x {len(args.eval.seeds)} seeds"
    print(f"evaluating {run_dir / 'policy.pt'}: {games}", flush=True)
    ev = evaluate(args, agent, game, run_dir / "videos", path.stem)
    with SummaryWriter(str(run_dir)) as writer:
        log_games(writer, path.stem, ev)
    save(path, "evaluation", env_id=agent.env_id, policy="policy.pt", eval=ev, device=str(device))
    print(f"[eval-only] best seed mean {ev['best_mean']:.2f}; written to {path}")
    return ev


class UsageError(Exception):  # bad input: main prints the one-line message and exits 2 before any work
    exit_code = 2


def resume_command(run_dir: Path) -> str:
    """The exact command that resumes this run: its own flags with --run-dir set (the default run
    dir ends in a timestamp, so the same command alone would start a new run)."""
    argv, kept = list(sys.argv[1:]), []
    while argv:
        arg = argv.pop(0)
        if arg in ("--run-dir", "--run_dir"):
            argv = argv[1:]
        elif not arg.startswith(("--run-dir=", "--run_dir=")):
            kept.append(arg)
    return shlex.join(["python", sys.argv[0], *kept, "--run-dir", str(run_dir)])


SCRIPT = os.path.basename(__file__)
MIN_DEMOS, MIN_DEMO_LEN = 2, 10
OTHER_FAMILIES = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid", "Swimmer", "Reacher", "Pusher", "Inverted")
OTHER_FAMILIES += ("CartPole", "Pendulum", "MountainCar", "Acrobot", "LunarLander", "BipedalWalker", "CarRacing")


def rom_to_camel(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


def resolve_env_id(env_id: str) -> tuple[str, float]:
    """Gymnasium Atari id -> (ale-py ROM name, default sticky-action probability); UsageError with the fix."""
    from ale_py import roms

    all_roms = roms.get_all_rom_ids()
    match = re.fullmatch(r"(ALE/)?([A-Za-z0-9]+?)(NoFrameskip|Deterministic)?(-v\d+)", env_id)
    game = match.group(2) if match else re.split(r"[-/]", env_id.removeprefix("ALE/"))[0]
    rom = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()
    if rom in all_roms:
        ale, frameskip, version = (match.groups()[0], match.group(3), match.group(4)) if match else (None, None, None)
        if ale and version == "-v5" and not frameskip:
            return rom, 0.25
        if not ale and frameskip == "NoFrameskip" and version == "-v4":
            return rom, 0.0
        good = f"{rom_to_camel(rom)}NoFrameskip-v4 or ALE/{rom_to_camel(rom)}-v5"
        raise UsageError(f"{env_id!r} is a retired or unsupported version of {rom_to_camel(rom)}: use {good}")
    if game.startswith(OTHER_FAMILIES):
        raise UsageError(f"{env_id!r} is not an Atari game: this script needs e.g. BreakoutNoFrameskip-v4")
    known = [f"{rom_to_camel(r)}NoFrameskip-v4" for r in all_roms]
    close = difflib.get_close_matches(f"{rom_to_camel(rom)}NoFrameskip-v4", known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "use e.g. BreakoutNoFrameskip-v4 or ALE/Breakout-v5"
    raise UsageError(f"unknown Atari env id {env_id!r}: {hint}")


def check_args(args: Args) -> None:
    """Every numeric flag in its range (see `ranged`), then the rules between flags; UsageError naming the flag."""
    groups = [(f"{f.name}.", getattr(args, f.name)) for f in fields(args) if is_dataclass(getattr(args, f.name))]
    for prefix, group in [("", args), *groups]:
        for f in fields(group):
            (low, high), value = f.metadata.get("range", (None, None)), getattr(group, f.name)
            if low is not None and value is not None and not low <= value <= high:
                name, (low, high) = f"--{prefix}{f.name}".replace("_", "-"), (exact(low), exact(high))
                raise UsageError(f"{name} must be in [{low}, {high}] (got {value})")
    if not args.exp_name or "/" in args.exp_name:
        raise UsageError("--exp-name must be a non-empty name without '/'")
    if any(not 0 <= s < 2**32 for s in args.eval.seeds) or not args.eval.seeds:
        raise UsageError("--eval.seeds needs one or more seeds in [0, 2**32)")
    ppo, batch = args.ppo, args.ppo.num_envs * args.ppo.num_steps
    if batch % ppo.num_minibatches or batch < ppo.num_minibatches:
        raise UsageError(f"--ppo.num-envs x --ppo.num-steps ({batch}) must be a multiple of --ppo.num-minibatches")
    for phase in ("demonstrator", "policy"):
        if getattr(args, phase).total_timesteps < batch:
            raise UsageError(f"--{phase}.total-timesteps is below one rollout ({batch} steps): raise it")
    if args.reward.min_len > args.reward.max_len:
        raise UsageError("--reward.min-len must not exceed --reward.max-len")
    if args.reward.stride > args.reward.min_len:
        raise UsageError("--reward.stride must not exceed --reward.min-len (a snippet needs an observation)")
    if args.reward.sampling == "offline" and args.reward.batch_size > args.reward.num_pairs:
        raise UsageError("--reward.batch-size must not exceed --reward.num-pairs")
    if args.stop_after and args.eval_only:
        raise UsageError("--stop-after has no meaning with --eval-only")


def exact(bound: float) -> str:
    """A range bound as written: 1e+11 stays short, but 4294967295 is not rounded to 4.29497e+09."""
    return f"{bound:g}" if float(f"{bound:g}") == bound else str(int(bound))


def validate(args: Args) -> tuple[dict, Path, dict]:
    """Every check that can fail on user input, before anything is written. Returns the game (the env settings),
    the run dir and what it holds, loaded: finished results, demos, reward model, PPO checkpoints, snapshots."""
    check_args(args)
    if args.eval_only:
        return validate_eval_only(args)
    rom, sticky = resolve_env_id(args.env_id)
    sticky = sticky if args.env.sticky_actions < 0 else args.env.sticky_actions
    game = {"rom": rom, "sticky": sticky, "noop_max": args.env.noop_max}
    game["max_episode_frames"] = args.env.max_episode_frames
    default_dir = f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = check_length(Path(args.run_dir or default_dir), "--run-dir" if args.run_dir else "--exp-name")
    check_run_dir(run_dir, args.env_id)
    if sum(score_mask(rom, args.reward)) >= 84:
        raise UsageError("--reward.mask-top + --reward.mask-bottom hide the whole frame: use fewer rows")
    found = {"finished": None, "demos": None, "reward_model": None, "checkpoints": {}, "snapshots": None}
    if (run_dir / "results.json").exists():
        finished = load(run_dir / "results.json", "results")
        refuse_changed_flags(run_dir, load(run_dir / "args.json", "args").get("args", {}), args)
        return game, run_dir, found | {"finished": finished}
    if (run_dir / "demos.npz").exists() or args.demos:
        found["demos"] = load(run_dir / "demos.npz" if (run_dir / "demos.npz").exists() else args.demos, "demos")
    if args.reward_model or (run_dir / "reward_model.pt").exists():
        found["reward_model"] = load(args.reward_model or run_dir / "reward_model.pt", "reward_model")
    for phase in ("demonstrator", "policy"):
        if (path := run_dir / "checkpoints" / f"{phase}.pt").exists():
            found["checkpoints"][phase] = load(path, "ppo_checkpoint")
    demonstrator_done = found["checkpoints"].get("demonstrator", {"state": {"done": False}})["state"]["done"]
    if found["demos"] is None and found["reward_model"] is None and demonstrator_done:
        found["snapshots"] = load_snapshots(run_dir / "demonstrator", args.collect.num_snapshots)
    return game, run_dir, found


def validate_eval_only(args: Args) -> tuple[dict, Path, dict]:
    run_dir = check_length(Path(args.eval_only), "--eval-only")
    if not (run_dir / "policy.pt").is_file():
        raise UsageError(f"--eval-only {run_dir}: no policy.pt there; pass the run dir of a finished training run")
    if not (run_dir / "args.json").is_file():  # (check_run_dir's message would name --run-dir)
        raise UsageError(f"--eval-only {run_dir}: no args.json there; pass the run dir of a finished training run")
    check_run_dir(run_dir, None)
    policy = load(run_dir / "policy.pt", "policy")["net"]
    numbers = [int(p.stem[5:]) for p in (run_dir / "evaluations").glob("eval_*.json") if p.stem[5:].isdigit()]
    eval_path = run_dir / "evaluations" / f"eval_{max(numbers, default=0) + 1:03d}.json"
    return policy.env_config, run_dir, {"policy": policy, "eval_path": eval_path}


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
        saved = load(run_dir / "args.json", "args")
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


# settings that change nothing a finished run made (where it runs, how it logs, how it resumes)
RERUN_FREE = {"run_dir", "eval_only", "track", "wandb_project_name", "wandb_entity", "cuda"}
RERUN_FREE |= {"torch_threads", "checkpoint_every", "stop_after"}


def flat_settings(d: dict, prefix: str = ""):
    """("group.name", value) of every setting in a (nested) dict of args, as args.json holds them."""
    for key, value in d.items():
        if isinstance(value, dict):
            yield from flat_settings(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def refuse_changed_flags(run_dir: Path, saved: dict, args: Args) -> None:
    """A finished run re-run with flags that differ from its args.json (beside RERUN_FREE):
    UsageError naming each (results.json is never overwritten, so they would be ignored)."""
    old = dict(flat_settings(saved if isinstance(saved, dict) else {}))
    now = dict(flat_settings(json.loads(json.dumps(asdict(args)))))
    diff, missing = [], object()
    for key, value in now.items():
        if key not in RERUN_FREE and old.get(key, missing) != value:
            diff.append(f"--{key.replace('_', '-')} {value} (was {old.get(key)})")
    if diff:
        raise UsageError(
            f"{run_dir} holds a finished run made with other flags ({', '.join(diff)} against its "
            "args.json): re-run its own command (nothing to do), --eval-only it, or pass a new --run-dir"
        )


def load_snapshots(folder: Path, keep: int) -> list:
    """The demonstrator snapshots phase 2 draws from, each loaded and checked: [(iteration, state_dict)]."""
    paths = sorted(folder.glob("ckpt_*.pt"))
    if len(paths) > keep:  # `keep` of them, spread evenly over training
        paths = [paths[i] for i in np.unique(np.linspace(0, len(paths) - 1, keep).round().astype(int))]
    if not paths:
        raise UsageError(f"{folder} holds no snapshots: delete checkpoints/demonstrator.pt to train the demonstrator")
    return [(int(s["iteration"]), s["agent"]) for s in (load(p, "snapshot") for p in paths)]


def resume_ppo(ckpt: Optional[dict], phase: str, num_iterations: int, agent, optimizer, rms, state: dict) -> bool:
    """Loads the phase's checkpoint (read by validate) into the objects; True when the phase is finished. A finished
    policy phase given a larger budget trains on; the demonstrator is never extended (the demos came from it)."""
    if ckpt is None:
        return False
    agent.load_state_dict(ckpt["agent"])
    optimizer.load_state_dict(ckpt["optimizer"])
    vars(rms).update({k: v.to(rms.mean.device) for k, v in ckpt["reward_rms"].items()})
    set_rng_state(ckpt["rng"])
    state.update(ckpt["state"])
    extend = phase == "policy" and state["done"] and state["iteration"] < num_iterations
    if state["done"] and not extend:
        return True
    state["done"] = False
    verb = "extending the finished phase" if extend else "resuming"
    print(f"[{phase}] {verb} at iteration {state['iteration']} / {num_iterations} (step {state['global_step']})")
    return False


KEYS = {  # what each torch artifact holds, besides its kind, layout version and script
    "ppo_checkpoint": ("agent", "optimizer", "reward_rms", "rng", "state"),
    "snapshot": ("agent", "iteration", "global_step"),
    "reward_model": ("state_dict", "mask_top", "mask_bottom", "env_id", "info"),
    "policy": ("env_id", "network", "config", "state_dict"),
}
FIXES = {  # what to do when one cannot be used
    "ppo_checkpoint": "delete it to redo that phase",
    "snapshot": "delete it and checkpoints/demonstrator.pt to train the demonstrator again",
    "reward_model": "pass a reward_model.pt of this script (or delete it to redo phase 3)",
    "policy": f"pass the policy.pt of a run of {SCRIPT}",
}
VERSION = 1  # of this layout: load refuses files of another (no shims for older runs)


def save(path: Path, kind: str, **payload) -> None:
    """Writes one artifact atomically. A torch file holds {kind, version, script, **payload}, which load
    checks; .json (args, results, evaluations) and .npz (demos) hold the payload alone, in the formats
    users write too."""
    if path.suffix == ".json":
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2)))
    elif path.suffix == ".npz":
        atomic_write(path, lambda tmp: np.savez_compressed(tmp.open("wb"), **payload))
    else:
        header = {"kind": kind, "version": VERSION, "script": SCRIPT}
        atomic_write(path, lambda tmp: torch.save(header | payload, tmp))


def load(path, kind: str):
    """Reads one artifact and checks it: any flaw is a UsageError naming the file and the fix. Returns the parsed
    .json, the checked demos (.npz), or a torch file's payload, with "net" built for a policy or reward model."""
    path = Path(path)
    if kind == "demos":
        name = f"demos file {str(path)!r}"
        try:
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception:  # noqa: BLE001 -- an unreadable file, or an object array inside it
            raise UsageError(f"cannot read {name}: pass an .npz in the format of docs/trex_ppo_atari.md") from None
        return check_demos(arrays, name)
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            raise UsageError(f"{path} is corrupt or unreadable: delete it (it is rewritten) or pass a new --run-dir")
    what = kind.replace("_", " ")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=kind == "policy")
    except Exception:  # noqa: BLE001 -- any unreadable file is the same user error
        obj = None
    if isinstance(obj, dict) and obj.get("script", SCRIPT) != SCRIPT:
        raise UsageError(f"{path} was not written by {SCRIPT}: load it with its own script")
    readable = isinstance(obj, dict) and (obj.get("kind"), obj.get("version")) == (kind, VERSION)
    if not readable or set(KEYS[kind]) - set(obj):
        raise UsageError(f"{path} is not a readable {what}: {FIXES[kind]}")
    try:
        if kind == "policy":
            obj["net"] = Agent(obj["config"]["num_actions"], obj["env_id"], obj["config"]["env_config"])
        elif kind == "reward_model":
            obj["net"] = RewardNet(obj["mask_top"], obj["mask_bottom"])
        if "net" in obj:
            obj["net"].load_state_dict(obj["state_dict"])
            obj["net"].eval()
    except Exception:  # noqa: BLE001 -- a dict of something else
        raise UsageError(f"{path} is not a {what} of this script: {FIXES[kind]}") from None
    return obj


def atomic_write(path: Path, write) -> None:
    """write(tmp) into `name.tmp` beside path (`name.tmp.webm` for opencv, which picks the container from the
    extension), then os.replace: a killed run never leaves half a file under an artifact's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + (".webm" if path.suffix == ".webm" else ""))
    write(tmp)
    os.replace(tmp, path)


def check_demos(d: dict, name: str) -> dict:
    """The demo arrays checked, with offsets, int64 lengths, float returns (NaN without) and scores (ranks or
    returns) added; UsageError naming the key."""
    for key in ("frames", "lengths") + (() if "ranks" in d else ("returns",)):
        if key not in d:
            raise UsageError(f"{name} lacks the key {key!r}: see the npz format in docs/trex_ppo_atari.md")
    frames, lengths = d["frames"], d["lengths"]
    if frames.dtype != np.uint8 or frames.ndim != 3 or frames.shape[1:] != (84, 84):
        raise UsageError(f"{name}: 'frames' must be uint8 (F, 84, 84), got {frames.dtype} {frames.shape}")
    if lengths.dtype.kind not in "iu" or lengths.ndim != 1 or len(lengths) < MIN_DEMOS or lengths.min() < MIN_DEMO_LEN:
        raise UsageError(f"{name}: 'lengths' must be {MIN_DEMOS}+ integers >= {MIN_DEMO_LEN} (observations per demo)")
    lengths = lengths.astype(np.int64)
    if int((lengths + 3).sum()) != len(frames):
        need = int((lengths + 3).sum())
        raise UsageError(f"{name}: 'frames' has {len(frames)} rows, 'lengths' need {need}; store n + 3 frames per demo")
    sizes = {"returns": len(lengths), "ranks": len(lengths), "checkpoint": len(lengths), "offsets": len(lengths)}
    for key, size in (sizes | {"actions": int(lengths.sum())}).items():
        if key in d and (d[key].dtype.kind not in "iuf" or d[key].shape != (size,) or not np.isfinite(d[key]).all()):
            raise UsageError(f"{name}: {key!r} must be {size} finite numbers, got {d[key].dtype} {d[key].shape}")
    offsets = np.concatenate([[0], np.cumsum(lengths + 3)[:-1]]).astype(np.int64)
    if "offsets" in d and not np.array_equal(d["offsets"], offsets):
        raise UsageError(f"{name}: 'offsets' disagree with 'lengths' (demo i starts at sum(lengths[:i] + 3))")
    scores = np.asarray(d["ranks"] if "ranks" in d else d["returns"], dtype=np.float64)
    if np.unique(scores).size < 2:
        raise UsageError(f"{name}: every demo has the same return/rank, nothing to rank: add demos of other quality")
    returns = d["returns"].astype(np.float64) if "returns" in d else np.full(len(lengths), np.nan)
    return d | {"lengths": lengths, "scores": scores, "offsets": offsets, "returns": returns}


def load_policy(path: str, device="cpu") -> Agent:
    """policy.pt -> the Agent in eval mode on `device`, with .act(obs) and .env_id (see docs/CONTRACT.md)."""
    return load(path, "policy")["net"].to(device)


def make_policy_envs(policy: Agent, num_envs: int):
    """The envs a loaded policy plays, made as in its evaluation: full games, the settings saved in policy.pt."""
    return make_envs(policy.env_config, num_envs, life_loss=False)


def write_demo_table(demos: dict, path: Path) -> None:
    lines = ["| demo | snapshot (iteration) | true return | length (steps) |", "|---|---|---|---|"]
    for i in np.argsort(demos["returns"], kind="stable"):
        lines.append(f"| {i} | {demos['checkpoint'][i]} | {demos['returns'][i]:g} | {demos['lengths'][i]} |")
    s = demo_stats(demos["returns"])
    lines += ["", f"best {s['best']}, average {s['average']:.1f}, worst {s['worst']} over {s['num_demos']} demos"]
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(lines) + "\n"))
    print("\n".join(lines))


def plot_pred_vs_true(predicted, predicted_sigmoid, true, info, path: Path, env_id: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no backend to choose, no figure to close

    fig = Figure(figsize=(8, 3.4), dpi=100)
    labels = ("sum of r̂ (paper's plot)", "sum of sigmoid(r̂) (policy reward)")
    for ax, pred, name, key in zip(fig.subplots(1, 2), (predicted, predicted_sigmoid), labels, ("", "_sigmoid")):
        ax.scatter(true, pred, s=18)
        ax.set_xlabel("true return of the demo")
        ax.set_ylabel(name, fontsize=8)
        ax.set_title(f"Spearman {info['spearman' + key]:.2f}, Pearson {info['pearson' + key]:.2f}", fontsize=9)
    fig.suptitle(f"{env_id}: learned vs true return of every demo", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_learning_curve(run_dir: Path, env_id: str, histories: dict, stats: dict, final_eval=None) -> None:
    """One panel per PPO phase (true game score, 20-game mean) with the demos and the final evaluation marked."""
    phases = [p for p in ("demonstrator", "policy") if p in histories]
    if not phases:
        return
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(phases), 3.4), dpi=100)
    for ax, phase in zip(fig.subplots(1, len(phases), squeeze=False)[0], phases):
        steps, scores = np.array([h[:2] for h in histories[phase]]).reshape(-1, 2).T
        k = min(20, len(scores))  # no finished game yet: an empty panel
        if k:
            ax.plot(steps[k - 1 :] * 4, np.convolve(scores, np.ones(k) / k, mode="valid"), label="training games")
        if stats.get("best") is not None:
            ax.axhline(stats["best"], color="gray", ls="--", lw=1, label="best demo")
            ax.axhline(stats["average"], color="gray", ls=":", lw=1, label="average demo")
        if phase == "policy" and final_eval is not None and k:
            ax.plot([steps[-1] * 4], [final_eval], "r*", ms=12, label="final evaluation")
        title = "demonstrator (true reward)" if phase == "demonstrator" else "T-REX policy (learned reward)"
        ax.set(xlabel="emulator frames", ylabel="true game score (20-game mean)", title=title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(env_id, fontsize=9)
    fig.tight_layout()
    atomic_write(run_dir / "learning_curve.png", lambda tmp: fig.savefig(tmp, format="png"))


def write_video(frames: list, path: Path, scale: int = 4) -> None:
    """84x84 grayscale frames, upscaled, as VP9 WebM (plays in browsers, TensorBoard and wandb)."""
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # not its warning about the WebM codec tag
    import cv2

    size = (84 * scale, 84 * scale)

    def write(tmp):
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"VP90"), 15, size)
        for f in frames:
            writer.write(cv2.cvtColor(cv2.resize(f, size, interpolation=cv2.INTER_NEAREST), cv2.COLOR_GRAY2BGR))
        writer.release()

    atomic_write(path, write)


def keep_freed_memory() -> None:
    """glibc keeps freed memory instead of handing it back: otherwise every large tensor of an update is mapped and
    page-faulted again (measured up to 16 % of the update time). jemalloc/tcmalloc via LD_PRELOAD do the same."""
    with contextlib.suppress(OSError):  # no glibc (macOS, Windows, musl): nothing to tune
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MB (glibc's maximum) come from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: do not give the heap's top back while less than 1 GB is free


def start_run(args: Args, game: dict, run_dir: Path, found: dict):
    """After validation: seeds, threads, the run dir (stale *.tmp removed, args.json), signals, logging. Returns
    the device, the TensorBoard writer and a function that restores the signal handlers."""
    from torch.utils.tensorboard import SummaryWriter

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    keep_freed_memory()
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.rglob("*.tmp*"):
        stale.unlink()
    if not args.eval_only:
        if game["rom"] not in SCORE_MASKS and args.reward.mask_top < 0:
            warning = f"warning: no score mask known for {game['rom']}: hiding the top {DEFAULT_MASK[0]} rows"
            print(f"{warning} (check a frame and set --reward.mask-top/--reward.mask-bottom)", file=sys.stderr)
        save(run_dir / "args.json", "args", script=SCRIPT, env_id=args.env_id, args=asdict(args))
        if args.demos and not (run_dir / "demos.npz").exists():
            save(run_dir / "demos.npz", "demos", **{k: v for k, v in found["demos"].items() if k != "scores"})
    handlers = {s: signal.signal(s, lambda num, _: STOP.update(signal=num)) for s in (signal.SIGINT, signal.SIGTERM)}
    STOP["signal"] = 0
    if args.track:
        import wandb

        settings = dict(name=run_dir.name, sync_tensorboard=True, config=asdict(args), save_code=True, resume="allow")
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, **settings)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    restore_signals = lambda: [signal.signal(s, h) for s, h in handlers.items()]  # noqa: E731
    writer = None if args.eval_only else SummaryWriter(str(run_dir))  # --eval-only: its own, after the games
    return device, writer, restore_signals


def parse_args(argv: Optional[list] = None) -> Args:
    """tyro.cli; a flag it rejects exits 2 with one line. tyro hands the rejection to a hook before it prints
    anything (the flag, the reason), so its printed box is never parsed; --help still prints and exits 0."""
    try:
        from tyro._errors import on_parse_error  # tyro's (experimental) parse-error hook
    except ImportError:  # a tyro without it prints its own box, also with exit code 2
        on_parse_error = lambda hook: contextlib.nullcontext()  # noqa: E731

    def one_line(event):  # raising here replaces tyro's box
        if hasattr(event, "tokens"):
            raise UsageError(f"unrecognized arguments: {' '.join(event.tokens)} (see --help)")
        flag = event.argument.display_name() if getattr(event, "argument", None) is not None else "a flag"
        reason = getattr(event, "message", "a bad value")
        if hasattr(event, "choices"):
            reason = f"{event.value!r} is not one of {', '.join(event.choices)}"
        raise UsageError(f"{flag}: {reason} (see --help)")

    try:
        with on_parse_error(one_line):
            return tyro.cli(Args, args=argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(parse_args())
