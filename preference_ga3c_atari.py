"""RL from human preferences on Atari with a GA3C agent, in one file.

A reward model r̂(o) is fit to a labeller's choices between short clips of the agent's own play while a GA3C
agent (A3C with batched prediction and training, Babaeizadeh et al., ICLR 2017) maximises r̂. Feedback is
pairwise (Christiano et al., NeurIPS 2017, "Deep RL from Human Preferences": a Bradley-Terry ensemble asked
about the pairs it disagrees on) or sorting clips into a red-black tree (rl-teacher-atari). The labeller is a
person in a browser (--labeler human), a synthetic labeller answering from the game score, or nobody: the
agent learns the true reward (--labeler rl, the baseline). The browser's labelling app (label store, server,
pages) is the companion file preference_labelling_app.py, imported by --labeler human only; everything else is
here: the networks, the losses, the sort tree, GA3C's threads, the teacher, the run; below the run-management
marker, what a reader of the algorithm can skip (validation, resume, logging, files).

Usage:
    python preference_ga3c_atari.py --env-id PongNoFrameskip-v4                        # synthetic, pairwise
    python preference_ga3c_atari.py --env-id PongNoFrameskip-v4 --labeler human        # label in the browser
    python preference_ga3c_atari.py --env-id PongNoFrameskip-v4 --feedback sort-tree   # rl-teacher-atari's tree
Re-running with the same --run-dir resumes. Flags, file formats and results: docs/preference_ga3c_atari.md.
"""

import contextlib
import json
import math
import os
import queue
import random
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.nn.utils.fusion import fuse_conv_bn_eval


@dataclass
class EnvArgs:
    stacked_frames: int = 4
    """frames stacked into one observation (0 = a single frame, no stacking)"""
    sticky_actions: float = -1.0
    """repeat_action_probability; -1 = 0.0 for *NoFrameskip-v4, 0.25 for ALE/*-v5"""
    noop_max: int = 30
    """up to this many no-ops at every reset"""
    max_episode_frames: int = 108_000
    """emulator frames per game before truncation"""


@dataclass
class GA3CArgs:
    workers: int = 32
    """emulators (GA3C's agents); half are stepped while the predictor acts for the other half"""
    t_max: int = 5
    """steps per training segment (n-step returns bootstrapped from V)"""
    min_batch_segments: int = 20
    """segments batched into one update (GA3C's maintainers advise 20-40)"""
    learning_rate: float = 3e-4
    """RMSProp learning rate (GA3C's default)"""
    rms_decay: float = 0.99
    """RMSProp decay"""
    rms_eps: float = 1e-5
    """RMSProp epsilon (GA3C's 0.1 swamped nearly all of this net's gradients: its FC layer barely learned)"""
    gamma: float = 0.99
    """discount factor"""
    entropy_beta: float = 0.01
    """entropy bonus weight"""
    max_grad_norm: float = 40.0
    """gradient-norm clip (0 = off)"""
    reward_clip: float = 1.0
    """rewards are clipped to [-x, x] before the returns (GA3C; 0 = off)"""
    env_threads: int = 0
    """C++ emulator threads (0 = as many as CPU cores)"""


@dataclass
class RewardArgs:
    ensemble: int = 3
    """reward predictors; each trains on its own resample of the labels and holds out its own 1/e"""
    lr: float = 3e-4
    """Adam learning rate of the predictors"""
    batch_size: int = 16
    """labels per predictor update"""
    label_buffer: int = 3000
    """train on the most recent labels only"""
    labels_per_step: float = 0.1
    """label samples trained on per agent step, asynchronously (the paper: about 1 per 10 steps)"""
    keep_pace: bool = False
    """hold the agents while the reward model's training is behind labels-per-step, so a slow machine still trains it
    at that rate per step (the agent waits); off: the agents never wait and the teacher catches up when it can"""
    pretrain_epochs: int = 200
    """passes over the pretraining labels before RL starts (the paper's 200)"""
    dropout: float = 0.0
    """dropout after every conv layer (the paper's 0.5 kept the pairwise predictor from fitting Breakout's labels;
    without it pairwise learned Breakout and Pong: see the docs)"""
    l2_init: float = 1e-3
    """initial L2 weight; adapted to keep validation loss 1.1-1.5x the training loss"""
    random_response: float = 0.1
    """assumed chance that a label is a uniformly random answer"""
    output_std: float = 0.05
    """predicted rewards are normalised to zero mean and this standard deviation"""
    mask_top: int = -1
    """rows hidden at the top of every frame (the score); -1 = the game's default"""
    mask_bottom: int = -1
    """rows hidden at the bottom of every frame; -1 = the game's default"""


@dataclass
class LabelArgs:
    budget: int = 3000
    """labels (answers) in all; the paper matches RL on Pong with about 3,300"""
    pretrain: int = 500
    """labels collected on random play before RL starts (the paper's 500)"""
    clip_length: int = 25
    """agent steps per clip (the paper: 25, 1.7 s)"""
    query: Literal["disagreement", "random"] = "disagreement"
    """pairwise: ask about the candidate pairs the ensemble disagrees on most, or random pairs (ablation)"""
    candidates: int = 10
    """pairwise: candidate pairs scored per pair asked"""
    rate_scale: float = 5e6
    """label rate decays like rate_scale / (step + rate_scale)"""
    life_penalty: float = -1.0
    """synthetic labeller: points a lost life costs a clip (the paper replaces episode ends by a penalty in all games
    but Pong, size not given); -1 = 1 point (one clipped reward) on every game but Pong, 0 on Pong"""
    store_dir: str = "runs/preference_store"
    """labels and clips, shared by an env's experiments: the app's SQLite store or {env}_synthetic/{exp_name}/"""
    host: str = "127.0.0.1"
    """--labeler human: address the labelling app binds to"""
    port: int = 8000
    """--labeler human: port of the labelling app"""
    ahead: int = 10
    """--labeler human: queries kept ready ahead of a person's answers, so answering fast never waits"""


@dataclass
class EvalArgs:
    episodes: int = 10
    """full games played with the final policy"""
    seed: int = 12345
    """seed of the evaluation games"""


@dataclass
class Args:
    exp_name: str = "preference_ga3c_atari"
    """the experiment's name; labels in the store belong to it (reused by a new run of the same name)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """`torch.backends.cudnn.deterministic`"""
    cuda: bool = True
    """use the GPU when one is available"""
    track: bool = False
    """log to Weights and Biases as well (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """record the first evaluation game to run_dir/videos/ (VP9 WebM)"""
    torch_threads: int = 0
    """CPU threads for torch (0 = torch's default)"""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """bf16 autocast for the networks (auto: bf16 on a GPU or an AVX-512 CPU); weights and losses stay fp32"""
    env_id: str = "PongNoFrameskip-v4"
    """gymnasium-style Atari id (PongNoFrameskip-v4, ALE/Pong-v5)"""
    labeler: Literal["synthetic", "human", "rl"] = "synthetic"
    """who answers: the game score, a person in the browser, or nobody (the agent learns the true reward)"""
    feedback: Literal["pairwise", "sort-tree"] = "pairwise"
    """compare pairs of clips (Christiano) or sort clips into a red-black tree (rl-teacher-atari)"""
    total_timesteps: int = 10_000_000
    """agent steps (4 frames each), random pretraining steps included; the run ends at the first batch of
    workers / 2 env steps that reaches it"""
    run_dir: Optional[str] = None
    """run directory (default runs/{env}__{exp_name}__{seed}__{time}); an existing one is resumed"""
    eval_only: Optional[str] = None
    """evaluate RUN_DIR/policy.pt and write RUN_DIR/evaluations/eval_NNN.json"""
    checkpoint_every_s: float = 300.0
    """seconds between resume checkpoints (also written at the end and on SIGINT/SIGTERM)"""
    force_new_clips: bool = False
    """delete the env's clips (and so every experiment's labels) from the store first"""
    force_new_labels: bool = False
    """delete this experiment's labels and sort tree from the store first"""
    force_new_reward_model: bool = False
    """start the reward model afresh instead of loading the run's"""
    force_new_agent: bool = False
    """start the agent afresh instead of loading the run's"""
    env: EnvArgs = field(default_factory=EnvArgs)
    ga3c: GA3CArgs = field(default_factory=GA3CArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    labels: LabelArgs = field(default_factory=LabelArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


# Rows hidden from the reward model so it cannot read the score (top, bottom) in the 84x84 frame.
SCORE_MASKS = {
    "pong": (10, 0),
    "breakout": (10, 0),
    "space_invaders": (10, 0),
    "beam_rider": (16, 11),
    "enduro": (0, 14),
    "qbert": (12, 0),
    "seaquest": (12, 16),
}
DEFAULT_MASK = (10, 0)


# --------------------------------------------------------------------------------------------------
# Environments
# --------------------------------------------------------------------------------------------------
class Game(NamedTuple):
    """The game as validation resolved it: the ROM, frames stacked per observation, the sticky-action
    probability, and the rows (top, bottom) hidden from the reward model."""

    rom: str
    stack: int
    sticky: float
    mask: tuple[int, int]


def make_envs(rom: str, num_envs: int, stack: int, sticky: float, env: EnvArgs, batch_size: int = 0, threads: int = 0):
    """AtariVectorEnv, 84x84 grey, frameskip 4 with max-pool, true (unclipped)
    rewards, same-step autoreset. Life losses are not signalled (episodic_life False):
    the agent sees one continuous game, as in the paper. batch_size < num_envs makes
    it asynchronous: recv() returns the first batch_size envs that finished."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        rom,
        num_envs,
        batch_size=batch_size,
        num_threads=threads,
        repeat_action_probability=sticky,
        reward_clipping=False,
        episodic_life=False,
        noop_max=env.noop_max,
        autoreset_mode="SameStep",
        max_num_frames_per_episode=env.max_episode_frames,
        use_fire_reset=True,
        full_action_space=False,
        stack_num=max(1, stack),
        frameskip=4,
        img_height=84,
        img_width=84,
        grayscale=True,
        maxpool=True,
    )


# --------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------
class GA3CNet(nn.Module):
    """GA3C's network: conv 16x8x8/4, conv 32x4x4/2, FC 256, policy logits and value.
    PyTorch's default init (uniform +-1/sqrt(fan_in)) is GA3C's. Input uint8 (N, S, 84, 84)."""

    def __init__(self, in_frames: int, num_actions: int, bf16: bool = False):
        super().__init__()
        self.bf16 = bf16
        self.body = nn.Sequential(
            nn.Conv2d(in_frames, 16, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(16, 32, 4, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 9 * 9, 256),
            nn.ReLU(),
        )
        self.policy = nn.Linear(256, num_actions)
        self.value = nn.Linear(256, 1)
        self.env_id, self.config = "", {"in_frames": in_frames, "num_actions": num_actions}
        self.to(memory_format=torch.channels_last)  # NHWC convs (scaled_pixels)

    def forward(self, obs):
        with torch.autocast(obs.device.type, torch.bfloat16, enabled=self.bf16):  # heads stay fp32
            hidden = self.body(scaled_pixels(obs, 1 / 255, self.bf16))
        hidden = hidden.float()
        return self.policy(hidden), self.value(hidden).squeeze(-1)

    @torch.no_grad()
    def act(self, obs) -> np.ndarray:
        """Sample actions for a batch of observations as the envs give them."""
        logits, _ = self(torch.as_tensor(obs, device=self.value.weight.device))
        return sample_actions(logits).cpu().numpy()


def scaled_pixels(obs, scale, bf16: bool):
    """uint8 frames times `scale`, made directly in the convs' dtype (no
    fp32 copy for autocast to cast) and in channels-last order (NHWC convs:
    on a CPU a GA3C update ~1.2x and a reward-ensemble update 1.4x faster)."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    obs = obs.contiguous(memory_format=torch.channels_last).to(dtype)
    return obs * (scale.to(dtype) if torch.is_tensor(scale) else scale)


def sample_actions(logits):
    """A draw from softmax(logits) by the Gumbel-max trick:
    one kernel chain, no Categorical object per batch."""
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)


class ByteDropout(nn.Module):
    """Dropout with its keep-mask read off random bytes, eight per 64-bit draw:
    nn.Dropout's per-element Bernoulli draws were ~40 % of a reward-model
    update on a CPU (5x slower than this). p is rounded to a multiple of 1/256."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.threshold = p, min(round(p * 256), 255)  # p near 1 keeps at least 1 in 256

    def forward(self, x):
        if not self.training or self.threshold == 0:
            return x
        if x.device.type != "cpu":  # the GPU's Bernoulli kernel is fast
            return F.dropout(x, self.p, True)
        n = x.numel()
        draws = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        keep = (draws.view(torch.uint8)[:n] >= self.threshold).view(x.shape)
        return x * (keep.to(x.dtype) * (256 / (256 - self.threshold)))


class RewardNet(nn.Module):
    """Christiano et al.'s Atari predictor: 4 convs (7x7/3, 5x5/2, 3x3/1,
    3x3/1) x 16 filters, batch norm, dropout and leaky ReLU (0.01) on each,
    FC 64, a scalar r̂(o). Score rows are zeroed before the first conv."""

    def __init__(self, in_frames: int, mask: tuple[int, int], dropout: float, bf16: bool = False):
        super().__init__()
        layers, channels, self.bf16 = [], in_frames, bf16
        for kernel, stride in ((7, 3), (5, 2), (3, 1), (3, 1)):
            layers += [
                nn.Conv2d(channels, 16, kernel, stride),
                nn.BatchNorm2d(16),
                ByteDropout(dropout),
                nn.LeakyReLU(0.01),
            ]
            channels = 16
        self.convs = nn.Sequential(*layers, nn.Flatten())
        self.head = nn.Sequential(nn.Linear(16 * 7 * 7, 64), nn.LeakyReLU(0.01), nn.Linear(64, 1))
        scale = torch.full((84, 1), 1 / 255)  # pixels to [0, 1]; the score rows to 0
        scale[: mask[0]] = 0.0
        scale[84 - mask[1] :] = 0.0
        self.register_buffer("scale", scale)
        self.to(memory_format=torch.channels_last)  # NHWC convs (scaled_pixels)

    def forward(self, obs):
        # bf16 convs; the head stays fp32
        with torch.autocast(obs.device.type, torch.bfloat16, enabled=self.bf16):
            features = self.convs(scaled_pixels(obs, self.scale, self.bf16)).float()
        return self.head(features).squeeze(-1)


class RewardEnsemble(nn.Module):
    """Members r̂_e plus each member's normalisation (mean, std); the reward is the
    average of the members' independently normalised outputs, scaled to `output_std`."""

    def __init__(self, size: int, in_frames: int, mask: tuple[int, int], dropout: float, output_std: float, bf16=False):
        super().__init__()
        self.members = nn.ModuleList(RewardNet(in_frames, mask, dropout, bf16) for _ in range(size))
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))
        self.output_std = output_std

    def member_rewards(self, obs):
        """(E, N) raw r̂ of every member."""
        return torch.stack([member(obs) for member in self.members])

    def forward(self, obs):
        raw = self.member_rewards(obs)
        return ((raw - self.mean[:, None]) / self.std[:, None]).mean(0) * self.output_std


class FusedEnsemble(nn.Module):
    """The reward ensemble as the trainer scores with it: batch norm folded
    into the convs and the members stacked as grouped convs, so one pass scores
    every member (about 2x faster than member by member in bf16 on a CPU)."""

    def __init__(self, model: RewardEnsemble):
        super().__init__()
        members, size = model.members, len(model.members)
        layers, first = [], True
        # (conv, batch norm, dropout, leaky ReLU) per layer
        for i in range(0, len(members[0].convs) - 1, 4):
            fused = [fuse_conv_bn_eval(m.convs[i], m.convs[i + 1]) for m in members]
            conv = nn.Conv2d(
                fused[0].in_channels * (1 if first else size),
                fused[0].out_channels * size,
                fused[0].kernel_size,
                fused[0].stride,
                groups=1 if first else size,
            )
            conv.weight.data, conv.bias.data = torch.cat([f.weight for f in fused]), torch.cat([f.bias for f in fused])
            layers, first = layers + [conv, nn.LeakyReLU(0.01)], False
        hidden, side = members[0].head[0].out_features, int((members[0].head[0].in_features // 16) ** 0.5)
        # each member's FC as a full-frame conv
        fc = nn.Conv2d(16 * size, hidden * size, side, groups=size)
        fc.weight.data = torch.cat([m.head[0].weight.view(hidden, 16, side, side) for m in members])
        fc.bias.data = torch.cat([m.head[0].bias for m in members])
        out = nn.Conv2d(hidden * size, size, 1, groups=size)
        out.weight.data = torch.cat([m.head[2].weight.view(1, hidden, 1, 1) for m in members])
        out.bias.data = torch.cat([m.head[2].bias for m in members])
        self.convs = nn.Sequential(*layers).to(model.mean.device, memory_format=torch.channels_last)
        self.head = nn.Sequential(fc, nn.LeakyReLU(0.01), out, nn.Flatten()).to(model.mean.device)
        self.bf16, self.output_std = members[0].bf16, model.output_std
        self.register_buffer("scale", members[0].scale.clone())
        self.register_buffer("mean", model.mean.clone())
        self.register_buffer("std", model.std.clone())

    def member_rewards(self, obs):
        """(E, N) raw r̂ of every member, as RewardEnsemble.member_rewards in eval mode."""
        # bf16 convs; the head stays fp32
        with torch.autocast(obs.device.type, torch.bfloat16, enabled=self.bf16):
            features = self.convs(scaled_pixels(obs, self.scale, self.bf16)).float()
        return self.head(features).T

    def forward(self, obs):
        return ((self.member_rewards(obs) - self.mean[:, None]) / self.std[:, None]).mean(0) * self.output_std


# --------------------------------------------------------------------------------------------------
# The math (pure functions)
# --------------------------------------------------------------------------------------------------
def preference_loss(sum_left, sum_right, mu_left, random_response: float = 0.1):
    """Bradley-Terry cross-entropy with a `random_response` chance of a
    uniformly random answer: P(left > right) = (1 - eps) * sigmoid(sum_left
    - sum_right) + eps / 2; mu_left = 1, 0 or 0.5 (equal)."""
    p_left = (1 - random_response) * torch.sigmoid(sum_left - sum_right) + random_response / 2
    return -(mu_left * torch.log(p_left) + (1 - mu_left) * torch.log(1 - p_left)).mean()


def sort_tree_loss(clip_sums, targets):
    """rl-teacher-atari's regression: squared error
    between a clip's summed r̂ and its rank's target."""
    return F.mse_loss(clip_sums, targets)


def quantile_targets(num_ranks: int, clip_length: int) -> torch.Tensor:
    """Target clip sums for ranks 0..M-1 (worst to best): evenly
    spaced standard-normal quantiles Phi^-1((o + 1/2) / M), scaled
    by the clip length so each step's expected reward is of order 1."""
    probs = (torch.arange(num_ranks, dtype=torch.float64) + 0.5) / num_ranks
    return (clip_length * torch.special.ndtri(probs)).float()


def desired_labels(step: int, total: int, budget: int, pretrain: int, scale: float = 5e6) -> int:
    """Labels wanted by agent step `step`: `pretrain` at the start, then a rate proportional to
    scale / (step + scale) whose integral reaches `budget` at `total` steps."""
    if total <= 0:
        return budget
    growth = math.log1p(min(step, total) / scale) / math.log1p(total / scale)
    return min(budget, pretrain + int(round((budget - pretrain) * growth)))


def disagreement(probs) -> torch.Tensor:
    """Variance across ensemble members (dim 0) of P(left > right) for each candidate pair."""
    return probs.var(dim=0, unbiased=False)


def adapt_l2(l2: float, train_loss: float, val_loss: float, low: float = 1.1, high: float = 1.5, factor: float = 1.1):
    """Christiano's adaptive L2: raise it when validation loss
    exceeds `high` x training loss, lower it below `low`."""
    if val_loss > high * train_loss:
        return l2 * factor
    if val_loss < low * train_loss:
        return l2 / factor
    return l2


def nstep_returns(rewards, bootstrap, gamma: float):
    """R_t = r_t + gamma r_{t+1} + ... + gamma^(T-t) V(s_T) for (B, T) rewards and (B,) bootstrap
    values. No episode ends: the agent never sees them (one continuous game, as in the paper)."""
    returns = torch.empty_like(rewards)
    running = bootstrap
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def a3c_loss(logits, values, actions, returns, entropy_beta: float):
    """GA3C's loss, summed over the batch: 0.5 (R - V)^2 - log pi(a|s) (R - V) - beta H(pi)."""
    log_probs = F.log_softmax(logits, dim=-1)
    advantage = (returns - values).detach()
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    policy_loss = -(log_probs.gather(-1, actions[..., None]).squeeze(-1) * advantage + entropy_beta * entropy).sum()
    value_loss = 0.5 * (returns - values).pow(2).sum()
    return policy_loss, value_loss, entropy.mean()


def clip_observations(frames, stack: int):
    """(T + S - 1, 84, 84) single frames -> (T, S, 84, 84)
    stacked observations (step t sees frames t..t+S-1)."""
    return frames.unfold(0, stack, 1).permute(0, 3, 1, 2)


def synthetic_answer(true_return_left: float, true_return_right: float) -> str:
    """The synthetic labeller prefers the clip with more
    game score; equal scores are indifference (not 'right')."""
    if true_return_left > true_return_right:
        return "left"
    return "right" if true_return_right > true_return_left else "equal"


class SortTree:
    """rl-teacher-atari's red-black sort tree. Each node holds clips judged equal (ties
    bind to a node); the in-order traversal runs from the worst to the best clip.

    A clip being inserted is compared with the node in the middle of the nodes it may still
    fall between (a binary search over the in-order sequence: every answer, about any node,
    narrows that interval, so rotations made by other insertions never mis-place it). When
    the interval is empty, the clip's node hangs between its two neighbours. Where several
    insertions are under way, each takes the least-asked node of the interval's middle half:
    the paper's walk from the root compared every new clip first with the same root clip."""

    def __init__(self, state: Optional[dict] = None):
        state = state or {"root": None, "nodes": {}, "pending": {}, "results": {}, "next_id": 0, "cursor": 0}
        self.root, self.next_id, self.cursor = state["root"], state["next_id"], state["cursor"]
        self.nodes = {int(k): dict(v) for k, v in state["nodes"].items()}
        self.results = {int(c): {int(n): a for n, a in r.items()} for c, r in state["results"].items()}
        # clip -> the node it was last asked about
        self.pending = {int(c): n for c, n in state["pending"].items() if int(c) in self.results}

    def state(self) -> dict:
        return {
            "root": self.root,
            "nodes": self.nodes,
            "pending": self.pending,
            "results": self.results,
            "next_id": self.next_id,
            "cursor": self.cursor,
        }

    def add_clip(self, clip: int) -> Optional[int]:
        """Start inserting a clip; returns the node it must
        be compared with next (None: it became the root)."""
        if self.root is None:
            self.root = self._new_node(clip, parent=None, red=False)
            return None
        self.results[clip] = {}
        return self._next(clip)

    def position(self, clip: int) -> tuple[Optional[int], Optional[str]]:
        """(node to compare with next, None) while the clip has
        nodes left to compare with, else (neighbour node, side)
        where its new node goes: the neighbour's free child."""
        order = self.in_order()
        lo, hi = self._interval(clip, order)
        if hi - lo > 1:
            return self.pending.get(clip), None
        if lo >= 0 and self.nodes[order[lo]]["right"] is None:
            return order[lo], "right"
        return order[hi], "left"  # the in-order successor of a node with a right child has no left child

    def answer(self, clip: int, node: int, answer: str) -> Optional[int]:
        """Apply an answer about (clip vs node); returns the next node to
        compare with, or None when done. An answer about a node the clip
        is no longer asked about is still a fact and narrows its interval."""
        if clip not in self.results or node not in self.nodes:
            return None
        self.pending.pop(clip, None)
        if answer == "cant_tell":
            del self.results[clip]  # a clip nobody can place is dropped
            return None
        if answer == "equal":
            self.nodes[node]["clips"].append(clip)
            del self.results[clip]
            return None
        self.results[clip][node] = answer
        return self._next(clip)

    def in_order(self) -> list[int]:
        """The nodes from the worst to the best."""
        out, stack, node = [], [], self.root
        while stack or node is not None:
            while node is not None:
                stack.append(node)
                node = self.nodes[node]["left"]
            node = stack.pop()
            out.append(node)
            node = self.nodes[node]["right"]
        return out

    def _interval(self, clip: int, order: list[int]) -> tuple[int, int]:
        """(lo, hi): the clip ranks above order[lo] and below order[hi] (-1 and len(order) at the ends).
        Answers apply in the order given; one that contradicts those before (a changed mind) is ignored."""
        index = {node: i for i, node in enumerate(order)}
        lo, hi = -1, len(order)
        for node, said in self.results[clip].items():
            i = index[node]
            if said == "left" and i < hi:  # 'left': the new clip is better
                lo = max(lo, i)
            elif said == "right" and i > lo:
                hi = min(hi, i)
        return lo, hi

    def _next(self, clip: int) -> Optional[int]:
        """The node to compare the clip with next, or None once its new node is linked in."""
        order = self.in_order()
        lo, hi = self._interval(clip, order)
        if hi - lo > 1:
            between = order[lo + 1 : hi]
            quarter = len(between) // 4
            middle, centre = between[quarter : len(between) - quarter], (len(between) - 1) / 2
            asked = {}
            for node in self.pending.values():
                asked[node] = asked.get(node, 0) + 1
            # the least-asked node of the middle half, the centre first among equals
            pick = min(range(len(middle)), key=lambda j: (asked.get(middle[j], 0), abs(quarter + j - centre)))
            self.pending[clip] = middle[pick]
            return middle[pick]
        parent, side = self.position(clip)
        del self.results[clip]
        new = self._new_node(clip, parent=parent, red=True)
        self.nodes[parent][side] = new
        self._fix_after_insert(new)
        return None

    def ranked_clips(self) -> list[tuple[int, int]]:
        """(clip, rank) for every sorted clip, rank 0 = worst; clips of one node share its rank."""
        return [(clip, rank) for rank, node in enumerate(self.in_order()) for clip in self.nodes[node]["clips"]]

    def _new_node(self, clip: int, parent: Optional[int], red: bool) -> int:
        node, self.next_id = self.next_id, self.next_id + 1
        self.nodes[node] = {"left": None, "right": None, "parent": parent, "red": red, "clips": [clip]}
        return node

    def _rotate(self, node: int, direction: str):
        """Rotate `node` down towards `direction` ('left'
        or 'right'); its other child takes its place."""
        other = "right" if direction == "left" else "left"
        pivot = self.nodes[node][other]
        self.nodes[node][other] = self.nodes[pivot][direction]
        if self.nodes[pivot][direction] is not None:
            self.nodes[self.nodes[pivot][direction]]["parent"] = node
        parent = self.nodes[node]["parent"]
        self.nodes[pivot]["parent"] = parent
        if parent is None:
            self.root = pivot
        else:
            self.nodes[parent]["left" if self.nodes[parent]["left"] == node else "right"] = pivot
        self.nodes[pivot][direction] = node
        self.nodes[node]["parent"] = pivot

    def _fix_after_insert(self, node: int):
        """The textbook red-black insert fix-up: recolour
        while the uncle is red, else one or two rotations."""
        nodes = self.nodes
        while nodes[node]["parent"] is not None and nodes[nodes[node]["parent"]]["red"]:
            parent = nodes[node]["parent"]
            grand = nodes[parent]["parent"]
            side = "left" if nodes[grand]["left"] == parent else "right"
            other = "right" if side == "left" else "left"
            uncle = nodes[grand][other]
            if uncle is not None and nodes[uncle]["red"]:
                nodes[parent]["red"] = nodes[uncle]["red"] = False
                nodes[grand]["red"] = True
                node = grand
                continue
            if nodes[parent][other] == node:
                self._rotate(parent, side)
                node, parent = parent, node
            nodes[parent]["red"], nodes[grand]["red"] = False, True
            self._rotate(grand, other)
        nodes[self.root]["red"] = False


def check_red_black(tree: SortTree) -> int:
    """Raise RuntimeError unless the tree is a valid red-black
    tree with consistent links; returns black height."""

    def check(ok: bool, problem: str):
        if not ok:
            raise RuntimeError(f"the sort tree is broken: {problem}")

    def walk(node, parent):
        if node is None:
            return 1
        record = tree.nodes[node]
        check(record["parent"] == parent, f"node {node}: parent link broken")
        check(bool(record["clips"]), f"node {node} holds no clip")
        if record["red"]:
            for child in (record["left"], record["right"]):
                check(child is None or not tree.nodes[child]["red"], f"red node {node} has a red child")
        left, right = walk(record["left"], node), walk(record["right"], node)
        check(left == right, f"black heights differ under node {node}")
        return left + (0 if record["red"] else 1)

    check(tree.root is None or not tree.nodes[tree.root]["red"], "the root is red")
    height = walk(tree.root, None)
    clips = sum(len(r["clips"]) for r in tree.nodes.values())
    check(len(tree.ranked_clips()) == clips, "a node is not reachable from the root")
    return height


# --------------------------------------------------------------------------------------------------
# GA3C: predictor (acts for the emulators) and trainer threads, sharing one network (hence policy lag)
# --------------------------------------------------------------------------------------------------
class Shared:
    """What the threads exchange: segment and clip queues, counters, locks and the stop flag."""

    def __init__(self, max_segments: int, step_limit: float = math.inf, signalled: Optional[threading.Event] = None):
        self.segments = queue.Queue(maxsize=max_segments)  # predictor -> trainer
        self.clips = queue.Queue(maxsize=256)  # predictor -> teacher
        self.games = deque(maxlen=10_000)  # (agent step, true game score, game length)
        self.stop, self.hold = threading.Event(), threading.Event()  # stop: the threads' loops poll it
        self.signalled = signalled or threading.Event()  # set by SIGINT/SIGTERM (main's handler)
        self.random_actions = True  # pretraining clips come from a random policy
        self.phase = "random play"  # named by the interrupt message
        self.steps = self.updates = self.predictions = self.trained_segments = 0
        # the predictor sends no more actions once the steps reach this (--total-timesteps)
        self.step_limit = step_limit
        # held_s: time the agents waited (--reward.keep-pace)
        self.lag, self.losses, self.held_s = 0.0, {}, 0.0
        self.update_lock = threading.Lock()
        # the teacher's latest reward model, published for the trainer
        self.reward_net: Optional[nn.Module] = None
        self.error: Optional[BaseException] = None


class UsageError(Exception):
    """Bad input: main prints the one-line message and exits 2 before any work."""


class NonFiniteLoss(Exception):
    """A loss became NaN or infinite: main exits 3, the last checkpoint is kept."""


class Interrupted(Exception):
    """SIGINT/SIGTERM: everything was saved; main exits 130."""


def start_thread(shared: Shared, target, *targs):
    """A daemon thread whose exception stops the run and is re-raised by the main thread."""

    def guarded():
        try:
            target(*targs)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            shared.error = shared.error or e
            shared.stop.set()

    thread = threading.Thread(target=guarded, daemon=True, name=target.__name__)
    thread.start()
    shared.threads = getattr(shared, "threads", []) + [thread]


def join_threads(shared: Shared):
    for thread in getattr(shared, "threads", []):
        # every loop polls the stop flag, so this never hangs (GA3C's issue #4)
        thread.join(timeout=30)


def drain(q: queue.Queue) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class ClipRecorder:
    """Records clips of `length` steps from a few envs at a time: the post-step observations' frames
    ((T + S - 1) single frames), the actions that led to them, and the true score changes.
    With `replay` (--labeler human: the game's ROM, sticky and noop settings, the envs' first seed)
    each clip also carries its env's seed, the game's number and the game's actions so far, from
    which the labelling app replays the clip in colour for the person."""

    def __init__(self, length: int, stack: int, slots: int, num_envs: int, rng, replay: Optional[dict] = None):
        # at most one clip per env at a time (--ga3c.workers 2 or 3 has fewer envs than slots)
        self.length, self.stack, self.slots = length, stack, min(slots, num_envs)
        self.num_envs, self.rng, self.replay = num_envs, rng, replay
        self.active: dict[int, dict] = {}
        self.games = [0] * num_envs  # games each env ended since its seeded reset
        self.history: list[list[int]] = [[] for _ in range(num_envs if replay else 0)]

    def observe(self, env_ids, obs, actions, rewards, game_over, life_lost, source: str) -> list[dict]:
        while len(self.active) < self.slots:
            free = [e for e in range(self.num_envs) if e not in self.active]
            self.active[int(self.rng.choice(free))] = {"frames": [], "actions": [], "rewards": [], "lives_lost": 0}
        finished = []
        for j, env in enumerate(env_ids.tolist()):
            if self.replay:  # the game's actions so far
                self.history[env].append(int(actions[j]))
                if game_over[j]:
                    self.games[env] += 1
                    self.history[env] = []
            clip = self.active.get(env)
            if clip is None:
                continue
            if game_over[j]:  # the stack restarts at a new game: start the clip again
                self.active[env] = {"frames": [], "actions": [], "rewards": [], "lives_lost": 0}
                continue
            clip["frames"] += list(obs[j]) if not clip["frames"] else [obs[j, -1]]
            clip["actions"].append(int(actions[j]))
            clip["rewards"].append(float(rewards[j]))
            clip["lives_lost"] += int(life_lost[j])
            if len(clip["actions"]) == self.length:
                finished.append(
                    {
                        "frames": np.stack(clip["frames"]),
                        "actions": np.array(clip["actions"]),
                        "true_rewards": np.array(clip["rewards"], np.float32),
                        "lives_lost": clip["lives_lost"],
                        "source": source,
                    }
                )
                if self.replay:
                    game = {"seed": self.replay["seed"] + env, "game": self.games[env]}
                    finished[-1]["replay"] = self.replay | game | {"actions": np.array(self.history[env], np.uint8)}
                del self.active[env]
        return finished


def run_predictor(envs, net, shared: Shared, t_max: int, num_actions: int, recorder: ClipRecorder, seed: int):
    """The agents' side of GA3C. The async vector env hands back the first half of
    the emulators that finished a step; one batched forward pass picks their actions
    while the other half steps. Every env's transitions are cut into segments of
    t_max steps (plus the bootstrap observation) and queued for the trainer."""
    n, device = envs.num_envs, next(net.parameters()).device
    obs, info = envs.reset(seed=seed)
    shape = obs.shape[1:]
    seg_obs = np.zeros((n, t_max + 1, *shape), np.uint8)
    seg_act, seg_rew = np.zeros((n, t_max), np.int64), np.zeros((n, t_max), np.float32)
    seg_ver, pos = np.zeros((n, t_max), np.int64), np.zeros(n, np.int64)
    acted, last_action = np.zeros(n, bool), np.zeros(n, np.int64)
    game_return, game_length, lives = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64)
    lives[info["env_id"]] = info["lives"]
    rng = np.random.default_rng(seed)
    while not shared.stop.is_set():
        spent = shared.steps >= shared.step_limit  # the budget ends within one batch of envs
        if spent or shared.hold.is_set() or (shared.random_actions and shared.clips.qsize() >= 32):
            # random play only runs while clips are wanted (its steps count in the budget)
            time.sleep(0.01)
            continue
        ids = info["env_id"]
        if shared.random_actions:
            actions = rng.integers(num_actions, size=len(ids))
        else:
            with torch.no_grad():
                logits, _ = net(torch.from_numpy(obs).to(device))
            actions = sample_actions(logits).cpu().numpy()
            shared.predictions += len(ids)
        seg_obs[ids, pos[ids]] = obs
        seg_act[ids, pos[ids]], seg_ver[ids, pos[ids]] = actions, shared.updates
        acted[ids], last_action[ids] = True, actions
        envs.send(actions)
        obs, reward, terminated, truncated, info = envs.recv()
        ids = info["env_id"]
        stepped = acted[ids]  # an env's first observation (its reset) is no transition
        ids_s, reward_s = ids[stepped], reward[stepped]
        over = (terminated | truncated)[stepped]
        # hidden from the agent, told to the labeller
        life_lost = (info["lives"][stepped] < lives[ids_s]) & ~over
        lives[ids] = info["lives"]
        shared.steps += len(ids_s)
        seg_rew[ids_s, pos[ids_s]] = reward_s
        pos[ids_s] += 1
        game_return[ids_s] += reward_s
        game_length[ids_s] += 1
        for env in ids_s[over]:
            shared.games.append((shared.steps, float(game_return[env]), int(game_length[env])))
            game_return[env], game_length[env] = 0.0, 0
        for j in np.flatnonzero(pos[ids] == t_max):
            env = ids[j]
            seg_obs[env, t_max] = obs[j]
            if not shared.random_actions:
                segment = (seg_obs[env].copy(), seg_act[env].copy(), seg_rew[env].copy(), int(seg_ver[env].min()))
                # a full queue holds the agents back, as GA3C's does
                while not shared.stop.is_set():
                    try:
                        shared.segments.put(segment, timeout=0.1)
                        break
                    except queue.Full:
                        pass
            pos[env] = 0
        source = "random" if shared.random_actions else f"policy@{shared.steps}"
        for clip in recorder.observe(ids_s, obs[stepped], last_action[ids_s], reward_s, over, life_lost, source):
            try:
                shared.clips.put_nowait(clip)
            except queue.Full:
                pass


def run_trainer(net, optimizer, reward_fn, shared: Shared, ga3c: GA3CArgs):
    """GA3C's trainer: waits for >= min_batch_segments segments, scores their steps with the
    reward (learned or true) in one batched pass, and makes one A3C update with n-step returns."""
    device = next(net.parameters()).device
    while not shared.stop.is_set():
        batch = []
        while len(batch) < ga3c.min_batch_segments and not shared.stop.is_set():
            try:
                batch.append(shared.segments.get(timeout=0.1))
            except queue.Empty:
                pass
        if shared.stop.is_set():
            return
        obs = torch.from_numpy(np.stack([b[0] for b in batch])).to(device)  # (B, T+1, S, 84, 84)
        actions = torch.from_numpy(np.stack([b[1] for b in batch])).to(device)
        true_rewards = torch.from_numpy(np.stack([b[2] for b in batch])).to(device)
        # r̂ of each post-step observation, computed once
        rewards = reward_fn(obs[:, 1:], true_rewards)
        if ga3c.reward_clip > 0:
            rewards = rewards.clamp(-ga3c.reward_clip, ga3c.reward_clip)
        # one pass: the T steps and the bootstrap observation o_T
        logits, values = net(obs.flatten(0, 1))
        logits, values = logits.view(*obs.shape[:2], -1)[:, :-1], values.view(obs.shape[:2])
        # bootstrapped from V(o_T)
        returns = nstep_returns(rewards, values[:, -1].detach(), ga3c.gamma)
        values = values[:, :-1]
        policy_loss, value_loss, entropy = a3c_loss(logits, values, actions, returns, ga3c.entropy_beta)
        loss = policy_loss + value_loss
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"the A3C loss became {loss.item()} at update {shared.updates}")
        with shared.update_lock:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if ga3c.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(net.parameters(), ga3c.max_grad_norm)
            optimizer.step()
            shared.updates += 1
        shared.trained_segments += len(batch)
        shared.lag = shared.updates - 1 - float(np.mean([b[3] for b in batch]))
        shared.losses = {
            "policy_loss": policy_loss.item() / returns.numel(),
            "value_loss": value_loss.item() / returns.numel(),
            "entropy": entropy.item(),
            "learned_reward": rewards.mean().item(),
        }


def write_json_atomic(data, path: Path):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


class SyntheticLabeller:
    """The synthetic labeller: answers each query the moment the teacher asks it, from the
    clips' true game scores less `life_penalty` per life lost in a clip (the paper's penalty for
    the episode ends the agent never sees). The teacher talks to it as to a person's label store
    (add_clip, add_query, answers_after, ...), so one Teacher serves both. Its clips and answers
    live in store_dir/{env}_synthetic/{experiment}/ (clip_N.npz, and labels.json written at
    every checkpoint): a resumed run, or a new run of the same experiment, reuses them."""

    def __init__(self, store_dir, env_id: str, experiment: str, life_penalty: float, state: Optional[dict] = None):
        self.env_dir = Path(store_dir) / f"{env_id.replace('/', '_')}_synthetic"
        self.dir = self.env_dir / experiment.replace("/", "_")
        self.life_penalty = life_penalty
        saved = self.dir / "labels.json"
        if state is None:  # (a run passes what validation read and checked)
            empty = {"clips": {}, "answers": [], "tree": None}
            state = json.loads(saved.read_text()) if saved.is_file() else empty
        # id -> (game score, lives lost)
        self.clips = {int(c): tuple(info) for c, info in state["clips"].items()}
        self.answers, self.tree = state["answers"], state["tree"]

    def add_clip(self, frames, actions, true_rewards, stack: int, source: str, lives_lost=0, replay=None) -> int:
        """Saves the clip's arrays (`replay` is for the person's app, which shows clips in colour)."""
        clip = max(self.clips, default=0) + 1
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"clip_{clip}.npz.tmp", "wb") as f:
            np.savez_compressed(f, frames=frames, actions=actions, true_rewards=true_rewards)
        os.replace(self.dir / f"clip_{clip}.npz.tmp", self.dir / f"clip_{clip}.npz")
        self.clips[clip] = (float(np.asarray(true_rewards).astype(np.float64).sum()), int(lives_lost))
        return clip

    def clip_arrays(self, clip: int) -> dict:
        with np.load(self.dir / f"clip_{clip}.npz") as z:
            return {"frames": z["frames"]}

    def add_query(self, experiment: str, kind: str, left: int, right: int, node=None) -> int:
        """Answered at once: the answer is the next one `answers_after` hands the teacher."""
        (left_points, left_lost), (right_points, right_lost) = self.clips[left], self.clips[right]
        penalty = self.life_penalty
        answer = synthetic_answer(left_points - penalty * left_lost, right_points - penalty * right_lost)
        seq = len(self.answers) + 1
        query = {"kind": kind, "left": left, "right": right, "node": node}
        self.answers.append({"seq": seq, "id": seq, **query, "answer": answer, "labeller": "synthetic"})
        return seq

    def answers_after(self, experiment: str, seq: int) -> list[dict]:
        return self.answers[max(seq, 0) :]

    def pending_queries(self, experiment: str) -> list:
        return []  # every query is answered when asked

    def count_answers(self, experiment: str) -> int:
        return len(self.answers)

    def load_tree(self, experiment: str):
        return self.tree

    def save_tree(self, experiment: str, tree: dict):
        self.tree = json.loads(json.dumps(tree))  # a copy: the tree changes on

    def sync(self):
        """Write the answers, clip scores and sort tree
        (the clips' frames were written when they came)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic({"clips": self.clips, "answers": self.answers, "tree": self.tree}, self.dir / "labels.json")

    def delete_labels(self, experiment: str) -> dict:
        counts = {"queries": len(self.answers), "answers": len(self.answers), "trees": int(self.tree is not None)}
        # its clips go too: no other experiment uses them
        shutil.rmtree(self.dir, ignore_errors=True)
        self.clips, self.answers, self.tree = {}, [], None
        return counts

    def delete_clips(self) -> dict:
        """Delete the synthetic clips and labels of every experiment of this env."""
        states = [json.loads(f.read_text()) for f in self.env_dir.glob("*/labels.json")]
        answers = sum(len(state["answers"]) for state in states)
        clips = sum(len(state["clips"]) for state in states)
        trees = sum(state["tree"] is not None for state in states)
        shutil.rmtree(self.env_dir, ignore_errors=True)
        self.clips, self.answers, self.tree = {}, [], None
        return {"clips": clips, "queries": answers, "answers": answers, "trees": trees}


# --------------------------------------------------------------------------------------------------
# Learning the reward from the labels (the teacher, in the main thread)
# --------------------------------------------------------------------------------------------------
class Teacher:
    """Turns clips into queries, answers into labels, and labels
    into reward-model updates. Pairwise: labels (left, right, mu)
    with a per-member held-out flag; sort-tree: ranks from the tree."""

    def __init__(self, args: Args, store, model: RewardEnsemble, stack: int, device, rng: np.random.Generator):
        self.args, self.store, self.model, self.stack, self.device, self.rng = args, store, model, stack, device, rng
        self.experiment, self.mode = args.exp_name, args.feedback
        self.optimizers = [torch.optim.Adam(m.parameters(), lr=args.reward.lr) for m in model.members]
        self.l2 = [args.reward.l2_init] * args.reward.ensemble
        self.pool: deque = deque(maxlen=60)  # recent clips not yet asked about
        self.frames: dict[int, torch.Tensor] = {}  # store clip id -> frames, loaded once
        self.labels: list[tuple[int, int, float, np.ndarray]] = []
        self.tree = SortTree(store.load_tree(self.experiment)) if self.mode == "sort-tree" else None
        self.seq, self.updates = 0, 0
        self.stop = threading.Event()  # the run's stop flag (train sets it): a signal cuts `train` short
        # on the device: no host sync per update
        self.train_loss = torch.ones(args.reward.ensemble, device=device)
        self.absorb_answers()

    # -- clips and queries ------------------------------------------------------------------------
    def add_clips(self, clips: list[dict]):
        self.pool.extend(clips)

    def wants_clips(self, queries: int) -> bool:
        """During random play: new clips are wanted while `queries` more are to be asked; in the sort tree,
        which takes a clip out of the pool for each query, only while the pool has room too."""
        return queries > 0 and (self.mode == "pairwise" or len(self.pool) < self.pool.maxlen)

    def outstanding(self) -> tuple[int, int]:
        return self.store.count_answers(self.experiment), len(self.store.pending_queries(self.experiment))

    def ask(self, count: int) -> int:
        """Queue up to `count` new queries; returns how many were queued."""
        if count <= 0:
            return 0
        if self.mode == "sort-tree":
            asked = 0
            # no more insertions under way than nodes: a new tree's first clips are not all compared with its root
            while asked < count and self.pool and len(self.tree.results) < max(1, len(self.tree.nodes)):
                clip = self.store_clip(self.pool.popleft())
                node = self.tree.add_clip(clip)
                if node is not None:
                    self.query_tree(clip, node)
                    asked += 1
            self.save_tree()
            return asked
        if len(self.pool) < 2:
            return 0
        pool = list(self.pool)
        # at most one pair per pooled clip now; the schedule asks the rest as clips come
        count = min(count, len(pool))
        pairs = np.array(
            [self.rng.choice(len(pool), 2, replace=False) for _ in range(count * self.args.labels.candidates)]
        )
        if self.args.labels.query == "disagreement":
            # only clips in some candidate pair are scored, once per model version
            needed = np.unique(pairs)
            stale = [pool[i] for i in needed if pool[i].get("sums_version") != self.updates]
            if stale:
                for clip, sums in zip(stale, self.member_sums([p["frames"] for p in stale]).T):
                    clip["sums"], clip["sums_version"] = sums, self.updates
            sums = torch.stack([pool[i]["sums"] for i in needed], dim=1)  # (E, needed clips)
            column = np.searchsorted(needed, pairs)
            probs = torch.sigmoid(sums[:, column[:, 0]] - sums[:, column[:, 1]])
            order = torch.argsort(disagreement(probs), descending=True).cpu().numpy()
        else:
            order = np.arange(len(pairs))
        chosen, seen = [], set()
        for i in order:
            key = tuple(sorted(pairs[i]))
            if key not in seen:
                seen.add(key)
                chosen.append(pairs[i])
            if len(chosen) == count:
                break
        for left, right in chosen:
            self.store.add_query(self.experiment, "pair", self.store_clip(pool[left]), self.store_clip(pool[right]))
        return len(chosen)

    def store_clip(self, clip: dict) -> int:
        if "id" not in clip:
            clip["id"] = self.store.add_clip(
                clip["frames"],
                clip["actions"],
                clip["true_rewards"],
                self.stack,
                clip["source"],
                clip.get("lives_lost", 0),
                clip.get("replay"),
            )
        return clip["id"]

    def query_tree(self, clip: int, node: int):
        right = int(self.rng.choice(self.tree.nodes[node]["clips"]))
        self.store.add_query(self.experiment, "tree", clip, right, node)

    def save_tree(self):
        self.store.save_tree(self.experiment, self.tree.state())

    # -- answers -> labels ------------------------------------------------------------------------
    def absorb_answers(self) -> int:
        """Read answers given since the last call (by
        anyone) into labels or tree moves; returns how many."""
        answers = self.store.answers_after(
            self.experiment, self.seq if self.tree is None else max(self.seq, self.tree.cursor)
        )
        for a in answers:
            self.seq = a["seq"]
            if a["kind"] == "pair" and self.tree is None and a["answer"] != "cant_tell":
                mu = {"left": 1.0, "right": 0.0, "equal": 0.5}[a["answer"]]
                held_out = self.rng.random(self.args.reward.ensemble) < 1 / math.e
                self.labels.append((a["left"], a["right"], mu, held_out))
            elif a["kind"] == "tree" and self.tree is not None:
                nxt = self.tree.answer(a["left"], a["node"], a["answer"])
                self.tree.cursor = a["seq"]
                # never past the budget
                if nxt is not None and sum(self.outstanding()) < self.args.labels.budget:
                    self.query_tree(a["left"], nxt)
        if answers and self.tree is not None:
            check_red_black(self.tree)  # rotations must not lose or mis-link a clip
            self.save_tree()
        del self.labels[: -self.args.reward.label_buffer]
        return len(answers)

    # -- training the predictors -----------------------------------------------------------------
    def num_examples(self) -> int:
        return len(self.labels) if self.tree is None else len(self.tree.ranked_clips())

    def clip_obs(self, clip_id: int) -> torch.Tensor:
        if clip_id not in self.frames:
            self.frames[clip_id] = torch.from_numpy(self.store.clip_arrays(clip_id)["frames"]).to(self.device)
        return clip_observations(self.frames[clip_id], self.stack)

    def member_sums(self, frames_list) -> torch.Tensor:
        """(E, clips) summed raw r̂ of each member, eval mode."""
        self.model.eval()
        with torch.no_grad():
            obs = torch.cat(
                [clip_observations(torch.as_tensor(f, device=self.device), self.stack) for f in frames_list]
            )
            raw = FusedEnsemble(self.model).member_rewards(obs)
        return raw.view(raw.shape[0], len(frames_list), -1).sum(-1)

    def train(self, updates: int) -> dict:
        """`updates` minibatch steps of every member, each
        on its own sample of its own training labels."""
        if self.mode == "pairwise" and not self.labels or self.mode == "sort-tree" and len(self.tree.nodes) < 2:
            return {}
        self.model.train()
        ranked = self.tree.ranked_clips() if self.tree is not None else None
        targets = quantile_targets(len(self.tree.nodes), self.args.labels.clip_length) if ranked else None
        pools = self.label_pools(held_out=False) if ranked is None else None
        stats, finite = {}, torch.ones((), dtype=torch.bool, device=self.device)
        for _ in range(updates):
            if self.stop.is_set():  # SIGINT/SIGTERM: answered within one update
                break
            for e, (member, optimizer) in enumerate(zip(self.model.members, self.optimizers)):
                loss = self.member_loss(e, member, ranked, targets, pools)
                l2 = sum(p.pow(2).sum() for n, p in member.named_parameters() if "weight" in n)
                optimizer.zero_grad(set_to_none=True)
                (loss + self.l2[e] * l2).backward()
                optimizer.step()
                # checked once per round: a host sync per member stalls a GPU
                finite &= torch.isfinite(loss)
                self.train_loss[e] = 0.9 * self.train_loss[e] + 0.1 * loss.detach()
            self.updates += 1
            if self.updates % 20 == 0 and self.tree is None:
                stats = self.validate()
        # raised before anything is saved or published: the last checkpoint stays intact
        if not finite:
            raise NonFiniteLoss(f"the reward model's loss became non-finite by update {self.updates}")
        return stats

    def label_pools(self, held_out: bool) -> list[np.ndarray]:
        """Per member, the indices of its training (or
        held-out) labels; all labels when it has none."""
        flags = np.array([label[3] for label in self.labels]).reshape(len(self.labels), -1) == held_out
        return [np.flatnonzero(f) if f.any() else np.arange(len(self.labels)) for f in flags.T]

    def member_loss(self, e: int, member: RewardNet, ranked, targets, pools):
        size = self.args.reward.batch_size
        if ranked is not None:  # sort-tree: regression of clip sums onto rank quantiles
            pick = self.rng.integers(len(ranked), size=size)
            clips = [ranked[i][0] for i in pick]
            goal = targets[[ranked[i][1] for i in pick]].to(self.device)
            sums = member(torch.cat([self.clip_obs(c) for c in clips])).view(size, -1).sum(-1)
            return sort_tree_loss(sums, goal)
        pick = [self.labels[i] for i in pools[e][self.rng.integers(len(pools[e]), size=size)]]
        obs = torch.cat([self.clip_obs(c) for p in pick for c in p[:2]])
        sums = member(obs).view(size, 2, -1).sum(-1)
        mu = torch.tensor([p[2] for p in pick], device=self.device)
        return preference_loss(sums[:, 0], sums[:, 1], mu, self.args.reward.random_response)

    def validate(self) -> dict:
        """Held-out loss of each member; adapts its L2
        weight (val/train loss kept within 1.1-1.5)."""
        self.model.eval()
        stats, pools = {}, self.label_pools(held_out=True)
        with torch.no_grad():
            for e, member in enumerate(self.model.members):
                if not any(label[3][e] for label in self.labels):
                    continue
                val = self.member_loss(e, member, None, None, pools).item()
                self.l2[e] = adapt_l2(self.l2[e], self.train_loss[e].item(), val)
                stats |= {f"reward/val_loss_{e}": val, f"reward/l2_{e}": self.l2[e]}
        self.model.train()
        return stats

    def normalise(self, shared: Shared):
        """Refresh each member's output mean/std on recent labelled clips, then
        publish a copy of the ensemble for the GA3C trainer to score rewards with."""
        clips = list(self.frames)[-64:]
        self.model.eval()
        with torch.no_grad():
            fused = FusedEnsemble(self.model)
            if clips:  # none yet on a resumed run: its restored mean/std are kept
                raw = fused.member_rewards(torch.cat([self.clip_obs(c) for c in clips]))
                for model in (self.model, fused):
                    model.mean.copy_(raw.mean(1))
                    model.std.copy_(raw.std(1).clamp_min(1e-6))
            # one reference assignment: the trainer never sees half an update
            shared.reward_net = fused

    def accuracy(self) -> float:
        """Share of the last 100 decisive pairwise labels
        that the normalised ensemble orders correctly."""
        decisive = [label for label in self.labels[-100:] if label[2] != 0.5]
        if not decisive:
            return float("nan")
        self.model.eval()
        with torch.no_grad():
            obs = torch.cat([self.clip_obs(c) for p in decisive for c in p[:2]])
            mean = ((self.model.member_rewards(obs) - self.model.mean[:, None]) / self.model.std[:, None]).mean(0)
            sums = mean.view(len(decisive), 2, -1).sum(-1)
        right = (sums[:, 0] > sums[:, 1]).float() == torch.tensor([p[2] for p in decisive], device=self.device)
        return right.float().mean().item()


# --------------------------------------------------------------------------------------------------
# The run: pretraining labels on random play, reward pretraining, GA3C on the learned reward, evaluation
# --------------------------------------------------------------------------------------------------
def train(args: Args, run_dir: Path, game: Game, checkpoints: dict, device, bf16: bool, store, stop) -> dict:
    """The whole run: pretraining labels, reward pretraining, GA3C on the learned (or true) reward with
    the teacher alongside, then the final policy's evaluation; returns results.json's record.
    `stop` is set by SIGINT/SIGTERM: every phase polls it, and the run saves and raises Interrupted."""
    stack, learned = game.stack, args.labeler != "rl"
    workers = args.ga3c.workers
    envs = make_envs(game.rom, workers, stack, game.sticky, args.env, workers // 2, args.ga3c.env_threads)
    num_actions = int(envs.single_action_space.n)
    net = GA3CNet(max(1, stack), num_actions, bf16).to(device)
    optimizer = torch.optim.RMSprop(
        net.parameters(), lr=args.ga3c.learning_rate, alpha=args.ga3c.rms_decay, eps=args.ga3c.rms_eps
    )
    shared = Shared(4 * args.ga3c.min_batch_segments, args.total_timesteps, stop)
    rng, teacher = np.random.default_rng(args.seed), None
    if learned:
        model = RewardEnsemble(
            args.reward.ensemble, max(1, stack), game.mask, args.reward.dropout, args.reward.output_std, bf16
        ).to(device)
        teacher = Teacher(args, store, model, max(1, stack), device, rng)
        teacher.stop = stop
    progress = restore(checkpoints, net, optimizer, teacher, shared)
    if teacher is not None:
        teacher.normalise(shared)

    def reward_fn(obs, true_rewards):
        if not learned:
            return true_rewards
        with torch.no_grad():
            return shared.reward_net(obs.flatten(0, 1)).view(true_rewards.shape)

    replay = {"rom": game.rom, "sticky": game.sticky, "noop_max": args.env.noop_max, "seed": args.seed}
    replay = replay if args.labeler == "human" else None
    recorder = ClipRecorder(args.labels.clip_length, max(1, stack), 4, workers, rng, replay)
    start_thread(shared, run_predictor, envs, net, shared, args.ga3c.t_max, num_actions, recorder, args.seed)
    log = RunLog(args, run_dir, shared, teacher, progress)
    try:
        learn(args, shared, net, optimizer, teacher, reward_fn, log)
    finally:
        # every thread polls the stop flag, so the run always ends (GA3C's issue #4 was a hang here)
        shared.stop.set()
        join_threads(shared)
        envs.close()
    if shared.error is not None:
        raise shared.error
    interrupted = stop.is_set()
    log.checkpoint(net, optimizer, quick=interrupted)
    if interrupted:
        raise Interrupted(f"during {shared.phase} at step {shared.steps}")
    save_policy(run_dir / "policy.pt", net, args, game)
    scores = evaluate(net, game, args, run_dir / "videos" if args.capture_video else None, stop)
    return log.finish(scores)


class RewardSchedule:
    """How much the reward model trains against agent steps, as one rule.

    Before RL: `pretrain_epochs` passes over the pretraining labels, the agents held
    (the paper: 200 passes). During RL: `labels_per_step / batch_size` updates of every
    member per agent step since RL began (the paper: about 1 label per 10 steps).
    `learn` looks every 0.1 s and makes at most `per_look` of the updates owed, so
    queries and logging keep flowing; the rest stay owed. With --reward.keep-pace the
    agents wait while a whole update is owed, and the run ends once none is; without it
    they never wait, and what is still owed when the step budget is spent is not made."""

    per_look = 4

    def __init__(self, reward: RewardArgs):
        self.epochs, self.batch_size, self.keep_pace = reward.pretrain_epochs, reward.batch_size, reward.keep_pace
        self.rate = reward.labels_per_step / reward.batch_size  # updates per agent step
        self.trained_until = 0  # the agent step up to which the owed updates were made

    def pretrain_updates(self, examples: int) -> int:
        return math.ceil(self.epochs * examples / self.batch_size)

    def owed(self, step: int) -> int:
        return int((step - self.trained_until) * self.rate)

    def made(self, updates: int):
        self.trained_until += updates / self.rate

    def agents_wait(self, step: int) -> bool:
        return self.keep_pace and self.owed(step) >= 1


def pretrain_on_random_play(args: Args, shared: Shared, teacher: Teacher, schedule: "RewardSchedule", log: "RunLog"):
    """The agents play at random while the labeller answers the first `--labels.pretrain` queries; then the reward
    model is pretrained on those labels with the agents held. Returns early on a signal (redone on resume)."""
    while shared.random_actions and not log.should_stop():
        teacher.absorb_answers()
        answered, pending = teacher.outstanding()
        # clips only while queries are wanted: else the queue fills and random play, which spends budget, pauses
        if teacher.wants_clips(args.labels.pretrain - answered - pending):
            teacher.add_clips(drain(shared.clips))
        # (a budget spent before the pretraining labels came: pretrain on those there are)
        if answered >= args.labels.pretrain or shared.steps >= args.total_timesteps:
            shared.hold.set()
            shared.phase = "reward pretraining"
            updates = schedule.pretrain_updates(teacher.num_examples())
            for done in range(0, updates, 5):  # Teacher.train polls the stop flag between updates
                log.status(f"pretraining the reward model on {answered} labels, update {done}/{updates}", answered)
                log.scalars(teacher.train(min(5, updates - done)), shared.steps)
                if log.should_stop():
                    break
            if log.should_stop():  # a signal: pretraining is redone on resume
                return
            teacher.normalise(shared)
            log.progress["pretrained"], shared.random_actions = True, False
            shared.hold.clear()
        else:
            teacher.ask(max(0, min(args.labels.pretrain - answered - pending, 8)))
            log.status(f"random play: waiting for {args.labels.pretrain - answered} pretraining labels", answered)
            time.sleep(0.05)


def learn(args: Args, shared: Shared, net, optimizer, teacher: Optional[Teacher], reward_fn, log: "RunLog"):
    """Pretraining labels and reward pretraining (learned
    rewards only), then GA3C with the teacher alongside."""
    schedule = RewardSchedule(args.reward)
    # 1. Labels on random play, then the predictor is pretrained on them (the paper: 500 labels, 200 epochs).
    shared.random_actions = teacher is not None and not log.progress["pretrained"]
    if shared.random_actions:
        pretrain_on_random_play(args, shared, teacher, schedule, log)

    if log.should_stop():  # a signal during random play
        return

    # 2. GA3C on the learned (or true) reward while the teacher keeps asking and training, asynchronously.
    def top_up() -> int:
        """Read new answers, then ask what the label schedule wants; returns the answers so far."""
        teacher.add_clips(drain(shared.clips))
        teacher.absorb_answers()
        answered, pending = teacher.outstanding()
        wanted = desired_labels(
            shared.steps, args.total_timesteps, args.labels.budget, args.labels.pretrain, args.labels.rate_scale
        )
        if args.labeler == "human":  # queries ready ahead of a person's answers: one who answers fast never waits
            wanted = max(wanted, answered + args.labels.ahead)
        teacher.ask(max(0, min(wanted, args.labels.budget) - answered - pending))
        return answered

    start_thread(shared, run_trainer, net, optimizer, reward_fn, shared, args.ga3c)
    shared.phase = "agent training"
    schedule.trained_until = shared.steps
    log.rl_start = (shared.steps, teacher.updates if teacher is not None else 0)
    # --reward.keep-pace: the teacher owes updates, so the agents wait (and the run ends after them)
    behind = False
    while (shared.steps < args.total_timesteps or behind) and not log.should_stop():
        pass_start, held = time.time(), shared.hold.is_set()
        time.sleep(0.1)
        if shared.steps >= args.total_timesteps:
            # the budget is spent: no more agent steps while the teacher settles what it owes
            shared.hold.set()
        if teacher is not None:
            answered = top_up()
            owed = schedule.owed(shared.steps)
            if owed > 0:
                updates = min(owed, schedule.per_look)
                if args.labeler == "human":  # a person answers meanwhile: refill between updates
                    stats = {}
                    for _ in range(updates):
                        stats |= teacher.train(1)
                        answered = top_up()
                else:
                    stats = teacher.train(updates)
                log.scalars(stats, shared.steps)
                schedule.made(updates)
                teacher.normalise(shared)
            behind = schedule.agents_wait(shared.steps)  # steps were made while it trained
            (shared.hold.set if behind or shared.steps >= args.total_timesteps else shared.hold.clear)()
            log.status(f"training the agent, step {shared.steps:,}", answered)
        shared.held_s += (time.time() - pass_start) if held else 0.0
        log.tick(net, optimizer)


def evaluate(net: GA3CNet, game: Game, args: Args, video_dir: Optional[Path] = None, stop=None) -> list[float]:
    """Play `eval.episodes` full games (all lives, true score), one per
    env, sampling from the policy; a set `stop` raises Interrupted."""
    envs = make_envs(game.rom, args.eval.episodes, game.stack, game.sticky, args.env)
    stop = stop or threading.Event()
    obs, _ = envs.reset(seed=args.eval.seed) if not stop.is_set() else (None, None)
    scores, over, frames = np.zeros(args.eval.episodes), np.zeros(args.eval.episodes, bool), []
    while not over.all():
        if stop.is_set():
            envs.close()
            raise Interrupted("during the evaluation")
        obs, reward, terminated, truncated, _ = envs.step(net.act(obs))
        scores += np.where(over, 0.0, reward)
        if video_dir is not None and not over[0]:
            frames.append(obs[0, -1])
        over |= terminated | truncated
    envs.close()
    if video_dir is not None:
        write_video(frames, video_dir / "eval_game_0.webm")
    return scores.tolist()


def write_video(frames: list, path: Path, scale: int = 4, fps: int = 15):
    """Browser-playable VP9 WebM of 84x84 grey frames, upscaled."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames[0].shape
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"VP90"), fps, (width * scale, height * scale))
    for frame in frames:
        big = cv2.resize(frame, (width * scale, height * scale), interpolation=cv2.INTER_NEAREST)
        writer.write(cv2.cvtColor(big, cv2.COLOR_GRAY2BGR))
    writer.release()


def main(argv: Optional[list[str] | Args] = None) -> int:
    try:
        args = argv if isinstance(argv, Args) else parse_args(argv)
        checked = validate(args)  # the run directory, the game, the checkpoints and labels to resume from
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir, signals = checked["run_dir"], Signals()  # SIGINT/SIGTERM set signals.stop from here on
    try:
        if checked.get("finished"):
            print(f"run directory: {run_dir}")
            print(f"{run_dir} already holds a finished run (results.json) made with these flags; nothing to do")
            return 0
        if args.eval_only:
            return evaluate_only(args, run_dir, checked["policy"], signals.stop)
        device, bf16 = prepare_run(args, checked)
        store = checked["store"]
        results = train(args, run_dir, checked["game"], checked["checkpoints"], device, bf16, store, signals.stop)
        print(
            f"evaluation: {results['eval']['mean']:.1f} +- {results['eval']['std']:.1f} over "
            f"{len(results['eval']['returns'])} games; results in {run_dir}"
        )
        return 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLoss as e:
        print(f"error: {e}; the last checkpoint in {run_dir} is intact", file=sys.stderr)
        return 3
    except Interrupted as e:
        if args.eval_only:  # nothing written: the evaluation is simply run again
            print(f"interrupted {e}: nothing was written; re-run the same command", file=sys.stderr)
        else:
            print(
                f"interrupted {e}: everything is saved; resume with: {signals.resume_command(run_dir)}", file=sys.stderr
            )
        return 130
    finally:
        signals.restore()
        if checked.get("store") is not None and args.labeler == "human":
            checked["store"].close()
        if not args.eval_only:
            print(f"run directory: {run_dir}")


# ---- run management ----------------------------------------------------------------------------------------
# Everything below is plumbing a reader of the algorithm can skip: validation, resume, logging, signals, files.
SCRIPT = "preference_ga3c_atari.py"


FORMAT_VERSION = 1  # of the files `save` writes; a file of another version (or none) is refused
KEYS = {  # what `load` requires of each kind of file
    "policy": ("env_id", "network", "config", "state_dict"),
    "agent": ("net", "optimizer", "steps", "updates", "progress"),
    "reward_model": ("model", "optimizers", "l2", "updates"),
}


def save(path: Path, kind: str, **payload):
    """The one save of every torch file (policy.pt, checkpoints/agent.pt, checkpoints/reward_model.pt):
    written atomically, tagged with this script, the kind and the format version."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"script": SCRIPT, "kind": kind, "version": FORMAT_VERSION, **payload}, tmp)
    os.replace(tmp, path)


def load(path: Path, kind: str, fix: str) -> dict:
    """The one load: what `save` wrote as `kind`, or a UsageError naming the file and `fix` when it is unreadable,
    of another script or kind, of an earlier format (no shims for files of earlier commits) or lacks a key."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a truncated or foreign file is the same user error
        data = None
    tag = data if isinstance(data, dict) else {}
    if (tag.get("script"), tag.get("kind"), tag.get("version")) != (SCRIPT, kind, FORMAT_VERSION):
        raise UsageError(f"cannot read {path} as a {kind} file of this version of {SCRIPT}: {fix}")
    missing = [k for k in KEYS[kind] if k not in data]
    if missing:
        raise UsageError(f"{path} lacks {missing}: {fix}")
    return data


class Signals:
    """SIGINT/SIGTERM set `stop`, which every loop of the run polls (a signal is answered within one env batch,
    one update or one evaluation step); `restore` puts the previous handlers back."""

    def __init__(self):
        self.stop = threading.Event()
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum, _frame):
        self.stop.set()

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @staticmethod
    def resume_command(run_dir: Path) -> str:
        """The exact command that resumes an interrupted run: its own flags with --run-dir set (the default
        run dir ends in a timestamp, so the same command alone would start a new run)."""
        argv, kept = list(sys.argv[1:]), []
        while argv:
            arg = argv.pop(0)
            if arg in ("--run-dir", "--run_dir"):
                argv = argv[1:]
            elif not arg.startswith(("--run-dir=", "--run_dir=")):
                kept.append(arg)
        return shlex.join(["python", sys.argv[0], *kept, "--run-dir", str(run_dir)])


class RunLog:
    """TensorBoard scalars, the progress bar, the labelling app's status line, periodic checkpoints and plots,
    and SIGINT/SIGTERM (stop, save, exit 130)."""

    def __init__(self, args: Args, run_dir: Path, shared: Shared, teacher: Optional[Teacher], progress: dict):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.args, self.run_dir, self.shared, self.teacher, self.progress = args, run_dir, shared, teacher, progress
        self.writer = SummaryWriter(str(run_dir))
        self.t0 = self.last_log = self.last_ckpt = self.last_status = self.last_shown = time.time()
        self.steps0 = self.last_steps = shared.steps
        self.rl_start: Optional[tuple[int, int]] = None  # (agent steps, reward updates) when GA3C began this session
        self.last_predictions = self.last_segments = 0
        self.bar = tqdm(
            total=args.total_timesteps,
            initial=shared.steps,
            unit="step",
            dynamic_ncols=True,
            mininterval=1.0 if sys.stderr.isatty() else 60.0,  # a log file gets a line a minute
        )

    def should_stop(self) -> bool:
        return self.shared.signalled.is_set() or self.shared.stop.is_set()

    def scalars(self, stats: dict, step: int):
        for key, value in stats.items():
            self.writer.add_scalar(key, value, step)

    def status(self, doing: str, answered: int):
        now = time.time()
        if self.teacher is None or now - self.last_status < 1.0:
            return
        self.last_status = now
        shown = sys.stderr.isatty() or now - self.last_shown >= 60.0  # a log file gets a line a minute
        self.bar.set_description_str(doing.partition(", step")[0], refresh=shown)  # the bar counts the steps itself
        self.last_shown = now if shown else self.last_shown
        if self.args.labeler != "human":
            return
        self.teacher.store.set_status(
            self.args.exp_name,
            {"labels": answered, "budget": self.args.labels.budget, "agent": doing, "updated": now},
        )

    def tick(self, net, optimizer):
        """Every 5 s: log; every checkpoint_every_s: checkpoint and plot."""
        now, shared, step = time.time(), self.shared, self.shared.steps
        self.bar.update(step - self.bar.n)
        while shared.games:
            game_step, score, length = shared.games.popleft()
            self.progress["curve"].append((game_step, score))
            self.writer.add_scalar("charts/episodic_return", score, game_step)
            self.writer.add_scalar("charts/episodic_length", length, game_step)
        if now - self.last_log >= 5.0:
            dt = now - self.last_log
            stats = {
                "charts/SPS": (step - self.last_steps) / dt,
                "ga3c/predictions_per_s": (shared.predictions - self.last_predictions) / dt,
                "ga3c/trainings_per_s": (shared.trained_segments - self.last_segments) / dt,
                "ga3c/policy_lag": shared.lag,
                "ga3c/updates": shared.updates,
                "charts/learning_rate": self.args.ga3c.learning_rate,
            }
            stats |= {f"losses/{k}": v for k, v in shared.losses.items()}
            if self.teacher is not None:
                answered, pending = self.teacher.outstanding()
                self.progress["labels_curve"].append((step, answered))
                stats |= {
                    "reward/updates": self.teacher.updates,  # with labels/answered: the training rate achieved
                    "reward/agents_held_s": shared.held_s,
                    "labels/answered": answered,
                    "labels/pending": pending,
                    "labels/clips": len(self.teacher.frames),
                }
                if self.teacher.tree is not None:
                    stats |= {"labels/tree_nodes": len(self.teacher.tree.nodes)}
            self.scalars(stats, step)
            self.last_log, self.last_steps = now, step
            self.last_predictions, self.last_segments = shared.predictions, shared.trained_segments
            recent = [score for _, score in self.progress["curve"][-20:]]
            self.bar.set_postfix(
                sps=round(stats["charts/SPS"]),
                score=round(float(np.mean(recent)), 1) if recent else None,
                refresh=False,
            )
        if now - self.last_ckpt >= self.args.checkpoint_every_s:
            self.checkpoint(net, optimizer)

    def checkpoint(self, net, optimizer, quick: bool = False):
        """The agent and the reward model (with the synthetic labels), and the plot; `quick` (on a signal, to
        exit within seconds) skips the label accuracy and the plot (the last periodic checkpoint's stays)."""
        ckpt_dir, shared = self.run_dir / "checkpoints", self.shared
        with shared.update_lock:
            state = {"optimizer": optimizer.state_dict(), "steps": shared.steps, "updates": shared.updates}
            save(ckpt_dir / "agent.pt", "agent", net=net.state_dict(), progress=self.progress, **state)
        if self.teacher is not None:
            t = self.teacher
            if self.args.labeler == "synthetic":
                t.store.sync()  # its answers, saved with the reward model they trained
            if t.tree is None and not quick:
                self.writer.add_scalar("reward/label_accuracy", t.accuracy(), shared.steps)
            optimizers = [o.state_dict() for o in t.optimizers]
            save(
                ckpt_dir / "reward_model.pt",
                "reward_model",
                model=t.model.state_dict(),
                optimizers=optimizers,
                l2=t.l2,
                updates=t.updates,
            )
        if not quick:
            plot_progress(self.progress, None, self.run_dir / "learning_curve.png", self.args.env_id)
        self.last_ckpt = time.time()

    def finish(self, scores: list[float]) -> dict:
        self.bar.close()
        elapsed = max(time.time() - self.t0, 1e-9)
        results = {
            "eval": {
                "mean": float(np.mean(scores)),
                "std": float(np.std(scores)),
                "returns": scores,
                "episodes": len(scores),
                "seed": self.args.eval.seed,
            },
            "env_id": self.args.env_id,
            "labeler": self.args.labeler,
            "feedback": self.args.feedback,
            "agent_steps": self.shared.steps,
            "frames": 4 * self.shared.steps,
            "updates": self.shared.updates,
            "labels": self.teacher.outstanding()[0] if self.teacher is not None else 0,
            "sps": (self.shared.steps - self.steps0) / elapsed,
            "seed": self.args.seed,
            "training_games": len(self.progress["curve"]),
        }
        if self.teacher is not None and self.rl_start is not None:  # this session's RL phase: the rate achieved
            steps, updates = self.shared.steps - self.rl_start[0], self.teacher.updates - self.rl_start[1]
            batch = self.args.reward.batch_size
            results["reward"] = {
                "updates": self.teacher.updates,
                "samples_per_step": updates * batch / max(steps, 1),
                "samples_per_step_requested": self.args.reward.labels_per_step,
                "agents_held_s": self.shared.held_s,
            }
        self.writer.add_scalar("eval/mean_return", results["eval"]["mean"], self.shared.steps)
        self.writer.close()
        plot_progress(self.progress, results["eval"]["mean"], self.run_dir / "learning_curve.png", self.args.env_id)
        write_json_atomic(results, self.run_dir / "results.json")
        return results


def plot_progress(progress: dict, final_eval: Optional[float], path: Path, env_id: str):
    """Training game scores (and the final evaluation) on top, labels given below; written during training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    if progress["curve"]:
        steps, scores = np.array(progress["curve"]).T
        top.plot(steps * 4, scores, ".", alpha=0.3, label="training games")
        window = min(20, len(scores))
        top.plot(
            steps[window - 1 :] * 4, np.convolve(scores, np.ones(window) / window, "valid"), label=f"mean of {window}"
        )
    if final_eval is not None:
        last = progress["curve"][-1][0] * 4 if progress["curve"] else 0
        top.plot([last], [final_eval], "r*", markersize=14, label="final evaluation")
    top.set_ylabel("true game score")
    if top.lines:  # (no game has ended yet at the first checkpoints of a run)
        top.legend(loc="best", fontsize=8)
    if progress["labels_curve"]:
        steps, labels = np.array(progress["labels_curve"]).T
        bottom.plot(steps * 4, labels)
    bottom.set_ylabel("labels answered")
    bottom.set_xlabel("frames")
    fig.suptitle(f"{env_id}: RL from preferences with GA3C")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


def save_policy(path: Path, net: GA3CNet, args: Args, game: Game):
    """policy.pt (docs/CONTRACT.md): the env id, the network's class and config, its weights."""
    config = {
        **net.config,
        "stacked_frames": game.stack,
        "sticky": game.sticky,
        "noop_max": args.env.noop_max,
        "max_episode_frames": args.env.max_episode_frames,
    }
    save(path, "policy", env_id=args.env_id, network="GA3CNet", config=config, state_dict=net.state_dict())


def load_policy(path, device="cpu") -> GA3CNet:
    """The trained policy (policy.pt) in eval mode; `.act(obs)` samples actions, `.env_id` names its game."""
    data = load(Path(path), "policy", "re-train it or pass the policy.pt of a run of this version")
    net = GA3CNet(data["config"]["in_frames"], data["config"]["num_actions"])
    net.load_state_dict(data["state_dict"])
    net.env_id, net.config = data["env_id"], data["config"]
    return net.to(device).eval()


def make_policy_envs(policy: GA3CNet, num_envs: int = 1):
    """The envs the policy was trained on, from the settings saved with it."""
    cfg = policy.config
    rom, _ = resolve_env_id(policy.env_id)
    env = EnvArgs(cfg["stacked_frames"], cfg["sticky"], cfg["noop_max"], cfg["max_episode_frames"])
    return make_envs(rom, num_envs, cfg["stacked_frames"], cfg["sticky"], env)


def evaluate_only(args: Args, run_dir: Path, net: GA3CNet, stop) -> int:
    """Evaluate a finished run's policy on the game and settings saved with it."""
    cfg = net.config
    game = Game(resolve_env_id(net.env_id)[0], cfg["stacked_frames"], cfg["sticky"], (0, 0))
    args.env = EnvArgs(cfg["stacked_frames"], cfg["sticky"], cfg["noop_max"], cfg["max_episode_frames"])
    out_dir = run_dir / "evaluations"
    number = 1 + max(
        [int(m.group(1)) for p in out_dir.glob("eval_*.json") if (m := re.match(r"eval_(\d+)", p.stem))] or [0]
    )
    video = out_dir / f"videos_{number:03d}" if args.capture_video else None
    scores = evaluate(net, game, args, video, stop)  # (a signal: Interrupted, nothing written)
    out_dir.mkdir(exist_ok=True)
    result = {
        "mean": float(np.mean(scores)),
        "std": float(np.std(scores)),
        "returns": scores,
        "episodes": len(scores),
        "seed": args.eval.seed,
        "env_id": net.env_id,
    }
    write_json_atomic(result, out_dir / f"eval_{number:03d}.json")
    print(
        f"evaluation: {result['mean']:.1f} +- {result['std']:.1f} over {len(scores)} games; "
        f"written to {out_dir / f'eval_{number:03d}.json'}"
    )
    return 0


def restore(checkpoints: dict, net, optimizer, teacher: Optional[Teacher], shared: Shared) -> dict:
    """Load the checkpoints that validation already read and checked; returns the progress record."""
    progress = {"pretrained": False, "curve": [], "labels_curve": []}
    agent, reward = checkpoints.get("agent"), checkpoints.get("reward")
    if agent is not None:
        net.load_state_dict(agent["net"])
        settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        optimizer.load_state_dict(agent["optimizer"])  # its running averages; the settings stay the command line's
        for group, setting in zip(optimizer.param_groups, settings):
            group.update(setting)
        shared.steps, shared.updates, progress = agent["steps"], agent["updates"], agent["progress"]
        print(f"resumed the agent at step {shared.steps:,} ({shared.updates:,} updates)")
    if teacher is not None and reward is not None:
        teacher.model.load_state_dict(reward["model"])
        for optimizer_e, state in zip(teacher.optimizers, reward["optimizers"]):
            optimizer_e.load_state_dict(state)
        teacher.l2, teacher.updates = reward["l2"], reward["updates"]
        print(f"resumed the reward model ({teacher.updates:,} updates)")
    else:
        progress["pretrained"] = False  # a fresh reward model is pretrained on the labels in the store
    return progress


def resolve_env_id(env_id: str) -> tuple[str, float]:
    """Gymnasium Atari id -> (ale-py ROM name, default sticky-action probability)."""
    import difflib

    from ale_py import roms

    all_roms = roms.get_all_rom_ids()
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5|([A-Za-z0-9]+)NoFrameskip-v4", env_id)
    if match:
        rom = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1) or match.group(2)).lower()
        if rom in all_roms:
            return rom, 0.25 if match.group(1) else 0.0
    camel = ["".join(part.capitalize() for part in r.split("_")) for r in all_roms]
    known = [f"{c}NoFrameskip-v4" for c in camel] + [f"ALE/{c}-v5" for c in camel]
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    if re.fullmatch(r"[A-Za-z0-9]+-v[0-9]+", env_id) and not close:
        hint = "this script is for Atari games (e.g. PongNoFrameskip-v4); MuJoCo ids go to filter_irl_mujoco.py"
    else:
        hint = f"did you mean {', '.join(close)}?" if close else "use e.g. PongNoFrameskip-v4 or ALE/Pong-v5"
    raise UsageError(f"unknown Atari env id {env_id!r}: {hint}")


MAX_SEED = 2**31 - 4097  # the emulators' seeds (seed + env index, up to 4096 envs) are 32-bit


def memory_bounds(args: Args) -> dict:
    """The largest values this machine's memory holds (a frame is 84x84 bytes) of --labels.budget: the teacher
    keeps every labelled clip's frames, two clips a label; --ga3c.min-batch-segments: an A3C update holds its
    segments' frames about 10 times (4 batches queued, the batch, float32 pixels); --reward.batch-size: a reward
    update holds 2 clips a label as bytes, float32 pixels and activations, about 10 bytes a pixel."""
    memory, frame, stack = (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        84 * 84,
        max(1, args.env.stacked_frames),
    )
    clip, segment = args.labels.clip_length, (args.ga3c.t_max + 1) * stack * frame
    return {
        "labels.budget": memory // (2 * (clip + stack - 1) * frame),
        "ga3c.min-batch-segments": min(100_000, memory // (10 * segment)),
        "reward.batch-size": min(4096, memory // (20 * clip * stack * frame)),
    }


def check_numbers(args: Args):
    """Every numeric flag's range and the cross-field rules; NaN fails every comparison, so it is caught too.
    Integers are bounded by what the machine can hold (memory, the emulators' 32-bit counters and seeds)."""
    g, r, lab, e = args.ga3c, args.reward, args.labels, args.env
    shapes_valid = 1 <= lab.clip_length <= 1000 and 0 <= e.stacked_frames <= 16 and 1 <= g.t_max <= 1000
    # (bounded by memory once the shapes are valid; their own rules name them otherwise)
    most = memory_bounds(args) if shapes_valid else {"labels.budget": lab.budget}
    most |= {k: most.get(k, v) for k, v in (("ga3c.min-batch-segments", 100_000), ("reward.batch-size", 4096))}
    fits = "must fit in this machine's memory"
    rules = [
        ("seed", args.seed, 0 <= args.seed <= MAX_SEED, f"0 to {MAX_SEED}"),
        ("eval.seed", args.eval.seed, 0 <= args.eval.seed <= MAX_SEED, f"0 to {MAX_SEED}"),
        ("total-timesteps", args.total_timesteps, 1 <= args.total_timesteps <= 10**12, "1 to 1e12"),
        ("checkpoint-every-s", args.checkpoint_every_s, args.checkpoint_every_s > 0, "> 0"),
        ("torch-threads", args.torch_threads, 0 <= args.torch_threads <= 1024, "0 (default) to 1024"),
        ("env.stacked-frames", e.stacked_frames, 0 <= e.stacked_frames <= 16, "0 to 16"),
        ("env.sticky-actions", e.sticky_actions, e.sticky_actions == -1 or 0 <= e.sticky_actions <= 1, "-1 or 0..1"),
        ("env.noop-max", e.noop_max, 0 <= e.noop_max <= 10_000, "0 to 10000"),
        ("env.max-episode-frames", e.max_episode_frames, 1 <= e.max_episode_frames <= 10**8, "1 to 1e8"),
        ("ga3c.workers", g.workers, 2 <= g.workers <= 4096, "2 to 4096"),
        ("ga3c.t-max", g.t_max, 1 <= g.t_max <= 1000, "1 to 1000"),
        (
            "ga3c.min-batch-segments",
            g.min_batch_segments,
            1 <= g.min_batch_segments <= most["ga3c.min-batch-segments"],
            f"1 to {most['ga3c.min-batch-segments']} (an update's segments {fits})",
        ),
        ("ga3c.learning-rate", g.learning_rate, 0 < g.learning_rate <= 1, "in (0, 1]"),
        ("ga3c.rms-decay", g.rms_decay, 0 <= g.rms_decay < 1, "in [0, 1)"),
        ("ga3c.rms-eps", g.rms_eps, 0 < g.rms_eps <= 10, "in (0, 10]"),
        ("ga3c.gamma", g.gamma, 0 <= g.gamma <= 1, "in [0, 1]"),
        ("ga3c.entropy-beta", g.entropy_beta, 0 <= g.entropy_beta <= 10, "in [0, 10]"),
        ("ga3c.max-grad-norm", g.max_grad_norm, 0 <= g.max_grad_norm < math.inf, ">= 0 (0 = off)"),
        ("ga3c.reward-clip", g.reward_clip, 0 <= g.reward_clip < math.inf, ">= 0 (0 = off)"),
        ("ga3c.env-threads", g.env_threads, 0 <= g.env_threads <= 1024, "0 (one per core) to 1024"),
        ("reward.ensemble", r.ensemble, 1 <= r.ensemble <= 64, "1 to 64"),
        ("reward.lr", r.lr, 0 < r.lr <= 1, "in (0, 1]"),
        (
            "reward.batch-size",
            r.batch_size,
            1 <= r.batch_size <= most["reward.batch-size"],
            f"1 to {most['reward.batch-size']} (a reward update's clips {fits})",
        ),
        ("reward.label-buffer", r.label_buffer, 1 <= r.label_buffer <= 10**9, "1 to 1e9"),
        ("reward.labels-per-step", r.labels_per_step, 0 <= r.labels_per_step <= 100, "0 to 100"),
        ("reward.pretrain-epochs", r.pretrain_epochs, 0 <= r.pretrain_epochs <= 100_000, "0 to 100000"),
        ("reward.dropout", r.dropout, 0 <= r.dropout < 1, "in [0, 1)"),
        ("reward.l2-init", r.l2_init, 0 <= r.l2_init <= 1, "in [0, 1]"),
        ("reward.random-response", r.random_response, 0 <= r.random_response < 1, "in [0, 1)"),
        ("reward.output-std", r.output_std, 0 < r.output_std <= 100, "in (0, 100]"),
        ("reward.mask-top", r.mask_top, -1 <= r.mask_top < 84, "-1 (game default) to 83"),
        ("reward.mask-bottom", r.mask_bottom, -1 <= r.mask_bottom < 84, "-1 (game default) to 83"),
        (
            "labels.budget",
            lab.budget,
            1 <= lab.budget <= most["labels.budget"],
            f"1 to {most['labels.budget']} (the labelled clips' frames, kept in memory, {fits})",
        ),
        ("labels.pretrain", lab.pretrain, 1 <= lab.pretrain <= lab.budget, f"1 to --labels.budget ({lab.budget})"),
        ("labels.clip-length", lab.clip_length, 1 <= lab.clip_length <= 1000, "1 to 1000"),
        ("labels.candidates", lab.candidates, 1 <= lab.candidates <= 1000, "1 to 1000"),
        ("labels.rate-scale", lab.rate_scale, 0 < lab.rate_scale < math.inf, "> 0"),
        (
            "labels.life-penalty",
            lab.life_penalty,
            lab.life_penalty == -1 or 0 <= lab.life_penalty <= 1e6,
            "-1 or 0..1e6",
        ),
        ("labels.port", lab.port, 0 <= lab.port <= 65535, "0 to 65535"),
        ("labels.ahead", lab.ahead, 1 <= lab.ahead <= 1000, "1 to 1000"),
        ("eval.episodes", args.eval.episodes, 1 <= args.eval.episodes <= 256, "1 to 256"),
    ]
    for name, value, ok, allowed in rules:
        if not ok:
            raise UsageError(f"--{name} {value} is out of range: use {allowed}")
    if args.labeler != "rl" and args.feedback == "pairwise" and args.labels.query == "disagreement" and r.ensemble < 2:
        raise UsageError("--labels.query disagreement needs --reward.ensemble >= 2 (or use --labels.query random)")


# settings that change nothing a finished run made (where it runs, logs and serves, how it resumes)
RERUN_FREE = {"run_dir", "eval_only", "track", "wandb_project_name", "wandb_entity", "cuda", "torch_threads"}
RERUN_FREE |= {"checkpoint_every_s", "force_new_clips", "force_new_labels", "force_new_reward_model"}
RERUN_FREE |= {"force_new_agent", "labels.host", "labels.port"}


def flat_settings(d: dict, prefix: str = ""):
    """("group.name", value) of every setting in a (nested) dict of args, as args.json holds them."""
    for key, value in d.items():
        if isinstance(value, dict):
            yield from flat_settings(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def refuse_changed_flags(run_dir: Path, saved: dict, args: Args):
    """A finished run re-run with flags that differ from its args.json (beside RERUN_FREE): a UsageError
    naming each as --flag NEW (was OLD); a finished result is never redone or extended."""
    old, missing = dict(flat_settings(saved)), object()
    now = dict(flat_settings(json.loads(json.dumps(asdict(args)))))
    diff = [
        f"--{key.replace('_', '-')} {value} (was {old[key]})"
        for key, value in now.items()
        if key not in RERUN_FREE and old.get(key, missing) is not missing and old[key] != value
    ]
    if diff:
        raise UsageError(
            f"{run_dir} holds a finished run made with other flags ({', '.join(diff)} against its "
            "args.json): re-run its own command (nothing to do), --eval-only it, or pass a new --run-dir"
        )


def check_path_length(path: Path, flag: str) -> Path:
    """The path, or a UsageError when the file system cannot hold it (255 bytes a name, 4095 a path, as on Linux)."""
    if any(len(os.fsencode(part)) > 255 for part in path.parts) or len(os.fsencode(str(path.absolute()))) > 4095:
        limits = "255 bytes a name, 4095 a path"
        raise UsageError(f"{flag}: {str(path)[:60]}... is too long for the file system ({limits}): shorten it")
    return path


def validate(args: Args) -> dict:
    """Every check that can fail on user input, before anything is created; returns what it loaded."""
    check_numbers(args)
    if not args.exp_name or "/" in args.exp_name or args.exp_name in (".", ".."):
        raise UsageError("--exp-name must be a non-empty name without '/' (and not '.' or '..')")
    if args.eval_only:
        run_dir = check_path_length(Path(args.eval_only), "--eval-only")
        if not (run_dir / "policy.pt").is_file():
            raise UsageError(f"{run_dir / 'policy.pt'} not found: pass the run directory of a finished run")
        try:
            policy = load_policy(run_dir / "policy.pt")
        except (RuntimeError, KeyError, TypeError, ValueError) as e:  # tagged, but weights of another shape
            raise UsageError(
                f"{run_dir / 'policy.pt'} does not fit GA3CNet ({type(e).__name__}): re-train it"
            ) from None
        return {"run_dir": run_dir, "policy": policy}
    rom, sticky_default = resolve_env_id(args.env_id)
    default_mask = SCORE_MASKS.get(rom, DEFAULT_MASK)
    mask = tuple(v if v >= 0 else d for v, d in zip((args.reward.mask_top, args.reward.mask_bottom), default_mask))
    if sum(mask) >= 84:
        raise UsageError("--reward.mask-top + --reward.mask-bottom hide the whole frame: use fewer rows")
    run_dir = Path(
        args.run_dir or f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    )
    check_path_length(run_dir, "--run-dir" if args.run_dir else "--exp-name (in the default run directory)")
    check_path_length(Path(args.labels.store_dir), "--labels.store-dir")
    sticky = sticky_default if args.env.sticky_actions < 0 else args.env.sticky_actions
    ctx = {
        "run_dir": run_dir,
        "game": Game(rom, args.env.stacked_frames, sticky, mask),
        "life_penalty": (0.0 if rom == "pong" else 1.0) if args.labels.life_penalty < 0 else args.labels.life_penalty,
    }
    if (run_dir / "args.json").is_file():
        try:
            recorded = json.loads((run_dir / "args.json").read_text())
        except (OSError, ValueError):
            raise UsageError(f"{run_dir / 'args.json'} is not readable JSON: pick a new --run-dir") from None
        if recorded.get("script") != SCRIPT:
            raise UsageError(f"{run_dir} belongs to {recorded.get('script', 'another script')}: pick a new --run-dir")
        if recorded.get("env_id") != args.env_id:
            raise UsageError(f"{run_dir} is a run on {recorded.get('env_id')}, not {args.env_id}: pick a new --run-dir")
        if (run_dir / "results.json").is_file():
            refuse_changed_flags(run_dir, recorded, args)
            return ctx | {"finished": True}
    elif run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UsageError(f"{run_dir} exists and is not a run of this script: pick a new --run-dir")
    for place in (run_dir, Path(args.labels.store_dir)):
        probe = place
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            raise UsageError(f"cannot write to {place} ({probe} is not a writable directory): choose another path")
    ctx["checkpoints"] = checkpoints = {}
    fix = "delete it to start that part afresh (or pass a new --run-dir)"
    if not args.force_new_agent and (run_dir / "checkpoints" / "agent.pt").is_file():
        checkpoints["agent"] = load(run_dir / "checkpoints" / "agent.pt", "agent", fix)
    if (
        args.labeler != "rl"
        and not args.force_new_reward_model
        and (run_dir / "checkpoints" / "reward_model.pt").is_file()
    ):
        reward = load(run_dir / "checkpoints" / "reward_model.pt", "reward_model", fix)
        if len(reward["l2"]) != args.reward.ensemble:
            raise UsageError(
                f"the run's reward model has {len(reward['l2'])} members, not --reward.ensemble "
                f"{args.reward.ensemble}: pass that or --force-new-reward-model"
            )
        checkpoints["reward"] = reward
    if args.labeler == "human":
        import socket

        try:  # the labelling app: a companion file, needed by --labeler human only
            import preference_labelling_app as app
        except ImportError as e:
            fix = "preference_labelling_app.py and its folder preference_labelling_app_pages/ beside this script"
            raise UsageError(f"--labeler human needs {fix} ({e})") from None
        ctx["app"] = app

        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the app's server does
            try:
                probe.bind((args.labels.host, args.labels.port))
            except OSError as e:
                raise UsageError(
                    f"cannot serve on {args.labels.host}:{args.labels.port} ({e.strerror}): pass another --labels.port"
                ) from None
    ctx["store"] = check_labels(args, ctx)
    return ctx


def check_labels(args: Args, ctx: dict):
    """The labels a run reads, checked before anything is written: the synthetic labeller (read here, its store
    checked file by file) or the SQLite label store (read-only; opened in prepare_run); None for --labeler rl."""
    fix = "delete it, pass --force-new-labels, or pass another --labels.store-dir"
    if args.labeler == "synthetic":
        store_dir, experiment = Path(args.labels.store_dir), args.exp_name.replace("/", "_")
        saved = store_dir / f"{args.env_id.replace('/', '_')}_synthetic" / experiment / "labels.json"
        check_path_length(saved, "--exp-name (or --labels.store-dir)")
        state = {"clips": {}, "answers": [], "tree": None}
        if saved.is_file() and not (args.force_new_labels or args.force_new_clips):  # (those delete it unread)
            try:
                state = check_synthetic_labels(saved)
            except ValueError as e:
                raise UsageError(f"{e}: {fix}") from None
        return SyntheticLabeller(store_dir, args.env_id, args.exp_name, ctx["life_penalty"], state)
    if args.labeler == "human" and not args.force_new_clips:
        try:
            ctx["app"].check_store(args.labels.store_dir, args.env_id)
        except ValueError as e:
            raise UsageError(
                f"{e}: delete it, pass --force-new-clips (a new store), or another --labels.store-dir"
            ) from None
    return None


def check_synthetic_labels(path: Path) -> dict:
    """labels.json of the synthetic labeller, checked key by key (a ValueError names the file and the problem);
    every clip it names must have its clip_N.npz beside it holding frames, actions and true_rewards."""

    def need(ok: bool, problem: str):
        if not ok:
            raise ValueError(f"{path} {problem}")

    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not readable JSON ({type(e).__name__})") from None
    need(isinstance(state, dict) and set(state) == {"clips", "answers", "tree"}, "lacks clips, answers or tree")
    clips, answers, tree = state["clips"], state["answers"], state["tree"]
    need(isinstance(clips, dict) and isinstance(answers, list), "holds clips or answers of the wrong type")
    for clip, info in clips.items():
        need(clip.isdigit() and isinstance(info, list) and len(info) == 2, f"has a malformed clip {clip!r}")
        need(all(isinstance(v, (int, float)) and math.isfinite(v) for v in info), f"clip {clip}: non-finite score")
        npz = path.parent / f"clip_{clip}.npz"
        try:
            with np.load(npz) as z:
                arrays = set(z.files)
        except Exception as e:  # noqa: BLE001 - missing, truncated (BadZipFile) or foreign: the same user error
            raise ValueError(f"{npz} cannot be read ({type(e).__name__})") from None
        need({"frames", "actions", "true_rewards"} <= arrays, f"names clip {clip}, whose {npz.name} lacks arrays")
    fields = {"seq", "id", "kind", "left", "right", "node", "answer", "labeller"}
    for i, a in enumerate(answers, 1):
        need(isinstance(a, dict) and set(a) == fields and a["seq"] == i, f"answer {i} is malformed")
        need(str(a["left"]) in clips and str(a["right"]) in clips, f"answer {i} names a clip it does not hold")
        known = a["kind"] in ("pair", "tree") and a["answer"] in ("left", "right", "equal", "cant_tell")
        need(known, f"answer {i} has an unknown kind or answer")
    if tree is not None:
        try:
            check_red_black(SortTree(tree))
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            raise ValueError(f"{path} holds a broken sort tree ({type(e).__name__})") from None
    return state


def prepare_run(args: Args, ctx: dict):
    """Create the run directory, open the labels (applying --force-new-*), start the labelling app;
    returns the device and whether the networks run in bf16; ctx["store"] is the labeller's store (None for rl)."""
    run_dir = ctx["run_dir"]
    print(f"run directory: {run_dir}")
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    fast_bf16 = device.type == "cuda" or torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    bf16 = args.precision == "bf16" or args.precision == "auto" and fast_bf16
    store = ctx["store"]
    if args.labeler == "human":
        if ctx["app"].check_store(args.labels.store_dir, args.env_id, raises=False):  # --force-new-clips only
            for path in Path(args.labels.store_dir).glob(f"{args.env_id.replace('/', '_')}.sqlite*"):
                path.unlink()  # an unreadable store is replaced
        store = ctx["store"] = ctx["app"].LabelStore(args.labels.store_dir, args.env_id)
    if store is not None and args.force_new_clips:
        print(
            f"--force-new-clips: deleting every clip of {args.env_id} and every experiment's labels in "
            f"{args.labels.store_dir}: {store.delete_clips()}"
        )
    elif store is not None and args.force_new_labels:
        print(
            f"--force-new-labels: deleting the labels and sort tree of experiment {args.exp_name!r}: "
            f"{store.delete_labels(args.exp_name)}"
        )
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    for stale in list(run_dir.glob("*.tmp*")) + list((run_dir / "checkpoints").glob("*.tmp")):
        stale.unlink()  # left by a write that was killed
    if not (run_dir / "args.json").exists():
        record = {"script": SCRIPT, **{k: v for k, v in asdict(args).items() if not k.startswith("_")}}
        write_json_atomic(record, run_dir / "args.json")
    for name, flag in (("agent", args.force_new_agent), ("reward_model", args.force_new_reward_model)):
        if flag and (run_dir / "checkpoints" / f"{name}.pt").exists():
            print(f"--force-new-{name.replace('_', '-')}: the run's {name}.pt is replaced at the next checkpoint")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.labeler == "human":
        server = ctx["app"].serve_labelling_app(store, args.exp_name, args.feedback, args.labels.host, args.labels.port)
        host, port = server.server_address[:2]
        token = f"?token={server.access_token}" if server.access_token else ""
        print(f"labelling app: http://{host}:{port}/{token}  (answer with the buttons or the arrow keys)")
        if token:
            print(
                f"warning: the labelling app listens on {args.labels.host}, reachable beyond this machine; "
                "it answers only requests carrying the token above"
            )
    return device, bf16


RETIRED_FLAGS = {  # an old spelling (or a sibling's) -> the flag its one-line hint names (docs/CONTRACT.md)
    "--threads": "--torch-threads (the same flag in every script)",
    "--checkpoint-frequency": "--checkpoint-every-s (this script counts seconds)",
    "--checkpoint-every": "--checkpoint-every-s (this script counts seconds)",
}


def parse_args(argv: Optional[list[str]] = None) -> Args:
    """tyro.cli; a flag it rejects raises a one-line UsageError (exit 2). tyro hands the rejection to a hook before it
    prints anything (the flag, the reason), so its printed box is never parsed; --help still prints and exits 0."""
    try:
        from tyro._errors import on_parse_error  # tyro's (experimental) parse-error hook
    except ImportError:  # a tyro without it prints its own box, also with exit code 2
        on_parse_error = lambda hook: contextlib.nullcontext()  # noqa: E731

    def one_line(event):  # raising here replaces tyro's box
        retired = [t.split("=")[0] for t in getattr(event, "tokens", None) or () if t.split("=")[0] in RETIRED_FLAGS]
        if retired:
            raise UsageError(f"{retired[0]} was renamed: use {RETIRED_FLAGS[retired[0]]}")
        if getattr(event, "tokens", None):
            raise UsageError(f"unrecognized arguments: {' '.join(event.tokens)} (see --help)")
        flag = event.argument.display_name() if getattr(event, "argument", None) is not None else "a flag"
        if getattr(event, "choices", None):
            reason = f"{event.value!r} is not one of {', '.join(event.choices)}"
        elif getattr(event, "reason", None) == "too_few_values":
            reason = "a value is missing"
        else:  # (the first line: for a union, tyro lists each member's failure below it)
            reason = (getattr(event, "message", None) or "a bad value").splitlines()[0]
        raise UsageError(f"{flag}: {reason} (see --help)")

    with on_parse_error(one_line):
        return tyro.cli(Args, args=argv)


if __name__ == "__main__":
    sys.exit(main())
