"""SimPLe: learn a video-prediction world model of an Atari game from real play, and train PPO inside it.

Each epoch: train an action-conditioned next-frame model (conv encoder-decoder with skips, per-pixel 256-way
softmax, a 3-class reward head, optionally a 128-bit stochastic latent with an LSTM prior) on all real frames;
train PPO only inside that model (16 simulated envs x 50 steps from real start frames); collect 6,400 real steps
with the policy; evaluate in the real game. 16 collections x 6,400 = 102,400 agent steps (the paper's "100K").
Kaiser et al. (2020), "Model-Based Reinforcement Learning for Atari", ICLR. Defaults: tensor2tensor/rl
(rlmb_base_stochastic_discrete); frame-stacked, not recurrent; differences in docs/simple_worldmodel_atari.md.
    python simple_worldmodel_atari.py --env-id PongNoFrameskip-v4       # the paper's loop; --run-dir X resumes
    bash benchmarks/simple_worldmodel_atari.sh quick                    # every phase, CPU quick configuration
    python simple_worldmodel_atari.py --mode model-free                 # the baseline: PPO on the real game
    python simple_worldmodel_atari.py --eval-only runs/X [--eval.grid]  # -> runs/X/evaluations/eval_NNN.json
    python simple_worldmodel_atari.py --mode play --world-model runs/X/world_model.pt   # play inside the model
Run dir: args.json, TensorBoard events, data/collection_NNN.npz, world_model.pt, policy.pt, checkpoints/state.pt,
wm_strip.png (real / predicted / difference), learning_curve.png and .csv (per epoch: world-model error vs copy,
returns), results.json, videos/ (--capture-video).
Progress: a bar on a terminal; stderr to a file or pipe: a line every 30 s (env PROGRESS_EVERY_S).
"""

import contextlib
import dataclasses
import difflib
import functools
import json
import math
import os
import random
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

# ale_py, tensorboard, cv2 and matplotlib are imported where they are used: importing this file (tests) and
# rejecting bad input stay fast.
SCRIPT = os.path.basename(__file__)


def ranged(default, lo, hi):
    """A numeric flag's default and its allowed range [lo, hi], checked before any work."""
    return field(default=default, metadata={"range": (lo, hi)})


@dataclass
class EnvArgs:
    """The real game (ale-py AtariVectorEnv, 105x80 RGB frames, stack 4, frameskip 4)."""

    sticky_actions: float = ranged(-1.0, -1.0, 1.0)
    """repeat_action_probability; -1 = 0.0 for *NoFrameskip-v4, 0.25 for ALE/*-v5"""
    noop_max: int = ranged(8, 0, 10_000)
    """up to this many no-ops at every reset of the real game (the reference's max_num_noops)"""
    max_episode_frames: int = ranged(108_000, 100, 10**8)
    """emulator frames per real game before truncation"""
    num_envs: int = ranged(16, 1, 1024)
    """parallel real envs for collection (each plays steps-per-epoch / num-envs steps per collection)"""


@dataclass
class LoopArgs:
    """The SimPLe loop and its real-step budget."""

    epochs: int = ranged(15, 1, 1000)
    """SimPLe epochs (world model -> PPO in the model -> real collection -> evaluation)"""
    real_steps: int = ranged(96_000, 1, 10**9)
    """agent steps collected by the policy over all epochs; one more equal collection of random play comes first"""


@dataclass
class WorldModelArgs:
    """Phase 1: the world model (next frame + reward from 4 frames and an action)."""

    model: Literal["stochastic-discrete", "deterministic"] = "stochastic-discrete"
    """deterministic trunk, or the trunk with a 128-bit latent (inference net in training, LSTM prior at play)"""
    hidden_size: int = ranged(96, 1, 4096)
    """channels after the input embedding"""
    compress_steps: int = ranged(6, 1, 7)
    """encoder blocks (conv 4x4 stride 2 each) and as many decoder blocks"""
    filter_double_steps: int = ranged(3, 0, 7)
    """the first this-many encoder blocks double the channels (the last decoder blocks halve them)"""
    hidden_layers: int = ranged(2, 0, 64)
    """3x3 conv layers at the bottleneck"""
    dropout: float = ranged(0.15, 0.0, 0.99)
    """dropout before every encoder and decoder block"""
    residual_dropout: float = ranged(0.5, 0.0, 0.99)
    """dropout of the bottleneck conv layers"""
    target_frames: int = ranged(6, 1, 256)
    """frames predicted per training sequence after the 4 context frames (scheduled sampling acts on them)"""
    batch_size: int = ranged(4, 1, 4096)
    """sequences per optimiser step"""
    optimizer: Literal["adafactor", "adam"] = "adafactor"
    """adafactor as the reference; adam learns small models faster (the CPU quick configuration uses it)"""
    learning_rate: float = ranged(2e-3, 1e-12, 10.0)
    """peak learning rate of the world-model optimiser"""
    warmup_steps: int = ranged(2000, 1, 10**9)
    """linear learning-rate warm-up, then constant"""
    max_grad_norm: float = ranged(1.0, 1e-9, 1e9)
    """gradient-norm clip"""
    loss_cutoff: float = ranged(0.03, 0.0, 10.0)
    """per-pixel cross-entropy below this gives no gradient: loss = relu(xent - cutoff)"""
    input_noise: float = ranged(0.0, 0.0, 1.0)
    """share of input pixels set to the median colour in training (0 = off; the deterministic reference: 0.05)"""
    train_steps: int = ranged(15_000, 0, 10**9)
    """optimiser steps per epoch"""
    epoch_multiplier: int = ranged(3, 1, 1000)
    """train_steps x this at epochs 0, 1, 4, 9 and 14"""
    ss_exp_steps: int = ranged(10_000, 1, 10**9)
    """scheduled sampling: inverse-exponential ramp length (steps)"""
    ss_lin_steps: int = ranged(40_000, 1, 10**9)
    """scheduled sampling: inverse-linear ramp length (steps)"""
    ss_max_prob: float = ranged(1.0, 0.0, 1.0)
    """scheduled sampling: final probability of feeding back the model's own frame (0 = always the real frame)"""
    bits: int = ranged(128, 8, 4096)
    """latent bits (a multiple of 8: the prior predicts 8 bits at a time)"""
    bit_noise: float = ranged(0.2, 0.0, 10.0)
    """std of the Gaussian noise added to the bit logits in training"""
    bit_flip: float = ranged(0.1, 0.0, 0.5)
    """bit dropout: probability of flipping each bit in training"""
    discretize_warmup: int = ranged(40_000, 1, 10**9)
    """steps over which the share of hard bits (vs continuous tanh) rises to 1"""
    prior_max_sampling: float = ranged(0.5, 0.0, 1.0)
    """final probability of replacing the posterior bits by the LSTM prior's in training"""
    prior_warmup: int = ranged(40_000, 1, 10**9)
    """steps over which that probability rises linearly"""
    latent_use_max: float = ranged(0.8, 0.0, 1.0)
    """final share of examples that use the latent in training (the rest train without it)"""
    latent_use_warmup: int = ranged(20_000, 1, 10**9)
    """steps over which that share rises"""
    lstm_size: int = ranged(128, 1, 65_536)
    """LSTM prior state size"""
    inference_filters: int = ranged(128, 1, 65_536)
    """filters of the inference net's first conv (the second has 4x)"""
    pixel_temperature: float = ranged(0.0, 0.0, 100.0)
    """sampling temperature of predicted pixels fed back in simulation (0 = argmax, the reference)"""
    latent_temperature: float = ranged(1.0, 0.0, 100.0)
    """sampling temperature of the LSTM prior's bits in simulation"""
    eval_sequences: int = ranged(16, 1, 10**6)
    """held-out real sequences for the open-loop evaluation"""
    eval_horizon: int = ranged(50, 1, 10**6)
    """open-loop steps of that evaluation (metrics at 1, 12 and this)"""


@dataclass
class PPOArgs:
    """Phase 2: PPO inside the world model (and on the real game in model-free mode)."""

    iterations: int = ranged(1000, 0, 10**9)
    """PPO iterations in the model per epoch (x3 on the last epoch, x2 on epochs 1, 7, 11)"""
    num_envs: int = ranged(16, 1, 65_536)
    """simulated envs (model-free mode: the real --env.num-envs are used)"""
    num_steps: int = ranged(50, 2, 100_000)
    """rollout length; every simulated rollout starts from fresh real frames"""
    learning_rate: float = ranged(1e-4, 1e-12, 10.0)
    """Adam learning rate (beta1 0.85, beta2 0.997, eps 1e-6), constant"""
    gamma: float = ranged(0.99, 0.0, 1.0)
    """discount factor"""
    gae_lambda: float = ranged(0.95, 0.0, 1.0)
    """GAE lambda"""
    clip_coef: float = ranged(0.1, 1e-6, 10.0)
    """PPO ratio clip"""
    vf_coef: float = ranged(1.0, 0.0, 1e6)
    """value loss weight"""
    ent_coef: float = ranged(0.01, 0.0, 1e6)
    """entropy bonus weight"""
    update_epochs: int = ranged(3, 1, 1000)
    """passes over a rollout: (num_steps - 1) x update_epochs // minibatch_steps minibatches"""
    minibatch_steps: int = ranged(20, 1, 100_000)
    """time indices per minibatch (x all envs)"""
    max_grad_norm: float = ranged(0.5, 1e-9, 1e9)
    """gradient-norm clip"""
    dropout: float = ranged(0.1, 0.0, 0.99)
    """policy dropout before the dense layer"""
    collect_temperature: float = ranged(1.0, 0.0, 100.0)
    """policy sampling temperature when collecting real frames"""


@dataclass
class EvalArgs:
    """Phase 4: evaluation in the real game (and --eval-only)."""

    episodes: int = ranged(8, 0, 10**6)
    """full real games per evaluation (0 = no evaluation)"""
    num_envs: int = ranged(8, 1, 1024)
    """parallel envs of the evaluation"""
    temperature: float = ranged(0.5, 0.0, 100.0)
    """policy sampling temperature: logits / T (0 = argmax); the paper found 0.5 usually best"""
    noop_max: int = ranged(8, 0, 10_000)
    """up to this many no-ops at every reset of an evaluation game"""
    max_steps: int = ranged(0, 0, 10**8)
    """agent steps per evaluation game (0 = full games; the reference's periodic evaluation used 1000)"""
    grid: bool = False
    """--eval-only: evaluate every --eval.grid-temperatures x --eval.grid-noops pair (the reference's grid)"""
    grid_temperatures: list[float] = field(default_factory=lambda: [0.5, 0.0, 1.0])
    """sampling temperatures of the grid"""
    grid_noops: list[int] = field(default_factory=lambda: [8, 0])
    """max no-ops of the grid"""
    debug_steps: int = ranged(200, 1, 10**6)
    """--eval-only --capture-video with a world_model.pt: steps of the model / real / difference video"""
    policy: Literal["trained", "uniform-random"] = "trained"
    """--eval-only: the run's policy.pt, or uniform-random actions in its envs (the random baseline, same games)"""


@dataclass
class PlayArgs:
    """--mode play: the player."""

    zoom: int = ranged(4, 1, 32)
    """window zoom"""
    fps: int = ranged(20, 1, 1000)
    """frames per second when the wait mode is off"""
    wait: bool = True
    """the game advances only on a key press (the reference's WAIT mode; the c key toggles it)"""
    keys: Optional[str] = None
    """scripted key presses instead of the keyboard (no window is opened), e.g. 'ddx aq'"""
    screenshot: Optional[str] = None
    """write the last frame shown (model / real / difference) to this PNG"""


@dataclass
class Args:
    exp_name: str = SCRIPT[: -len(".py")]
    """the name of this experiment"""
    seed: int = ranged(1, 0, 2**31 - 1)
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use the GPU when one is available"""
    track: bool = False
    """log to Weights and Biases as well (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project"""
    wandb_entity: Optional[str] = None
    """the wandb entity"""
    capture_video: bool = False
    """record the first game of each evaluation to run_dir/videos/ (VP9 WebM)"""
    torch_threads: int = ranged(0, 0, 1024)
    """CPU threads for torch (0 = torch's default)"""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """world model's convolutions in bf16 autocast (weights, optimiser, heads, LSTM prior, losses stay fp32);
    auto = bf16 on a CUDA GPU with bf16 or an AVX-512 CPU (paper-size model 1.45x faster on one), else fp32"""
    env_id: str = "PongNoFrameskip-v4"
    """gymnasium-style Atari id (PongNoFrameskip-v4, ALE/Pong-v5)"""
    mode: Literal["simple", "model-free", "world-model-only", "play"] = "simple"
    """simple (SimPLe), model-free (PPO on the real game), world-model-only (random play), play (in --world-model)"""
    run_dir: Optional[str] = None
    """run directory (default runs/{env_id}__{exp_name}__{seed}__{time}); an existing one is resumed"""
    eval_only: Optional[str] = None
    """a run directory: evaluate its policy.pt with the --eval.* flags, write evaluations/eval_NNN.json"""
    world_model: Optional[str] = None
    """a world_model.pt of this script for the same game: kept fixed (no world-model training)"""
    checkpoint_every: int = ranged(200, 1, 10**9)
    """world-model steps or PPO iterations between resume checkpoints"""
    env: EnvArgs = field(default_factory=EnvArgs)
    loop: LoopArgs = field(default_factory=LoopArgs)
    wm: WorldModelArgs = field(default_factory=WorldModelArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)
    play: PlayArgs = field(default_factory=PlayArgs)


FRAME_SHAPE = (105, 80, 3)  # SimPLe's frames: 210x160 RGB downscaled x2 (area), height, width, channels
STACK = 4


class UsageError(Exception):
    """Bad input: main prints one line and exits 2 before any work."""


class NonFiniteLoss(Exception):
    """A loss became NaN/inf: main prints the phase and step and exits 3."""


class Interrupted(Exception):
    """SIGINT/SIGTERM: the phase saved its state; main exits 130."""


STOP = {"signal": 0}  # set by SIGINT/SIGTERM (SignalGuard, below): the running phase stops at its next step


# --------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------
class Policy(nn.Module):
    """The reference's small CNN policy: 4 RGB frames (12 channels) / 255 -> conv 32 5x5/2 -> conv
    32 5x5/2 -> dropout -> dense 128 -> policy logits and value. (The reference also feeds a
    loop-epoch embedding; not here.)"""

    def __init__(self, num_actions: int, frame_shape: tuple = FRAME_SHAPE, dropout: float = 0.1):
        super().__init__()
        height, width, channels = frame_shape
        self.config = {"num_actions": num_actions, "frame_shape": list(frame_shape), "dropout": dropout}
        self.env_config: dict = {}
        self.convs = nn.Sequential(
            nn.Conv2d(STACK * channels, 32, 5, 2), nn.ReLU(), nn.Conv2d(32, 32, 5, 2), nn.ReLU(), nn.Flatten()
        )
        flat = self.convs(torch.zeros(1, STACK * channels, height, width)).shape[1]
        self.dense = nn.Sequential(nn.Dropout(dropout), nn.Linear(flat, 128), nn.ReLU())
        self.logits = nn.Linear(128, num_actions)
        self.value = nn.Linear(128, 1)

    def forward(self, obs):
        """obs (B, 4, H, W, C) uint8 -> logits (B, A), value (B,)."""
        x = obs.permute(0, 1, 4, 2, 3).flatten(1, 2).float() / 255.0
        h = self.dense(self.convs(x))
        return self.logits(h), self.value(h).squeeze(-1)

    def to_file(self) -> dict:
        """What policy.pt holds besides its tags (load_policy rebuilds the policy from it)."""
        env = {"env_id": self.env_config["env_id"], "env_config": self.env_config}
        return {"network": "Policy", **env, "config": self.config, "state_dict": self.state_dict()}

    @torch.no_grad()
    def act(self, obs, temperature: float = 1.0):
        """numpy observations (B, 4, 105, 80, 3) uint8 -> numpy actions (B,) from logits / T."""
        device = next(self.parameters()).device
        logits, _ = self(torch.as_tensor(np.asarray(obs), device=device))
        return sample_logits(logits, temperature).cpu().numpy()


@functools.lru_cache(maxsize=64)
def timing_signal_2d(channels: int, height: int, width: int, device: str) -> torch.Tensor:
    """Sinusoidal position signal (channels, height, width): a quarter of the channels each for
    sin/cos of the row and of the column, at geometric timescales 1 .. 1e4; the rest are 0."""
    n = channels // 4
    sig = torch.zeros(channels, height, width, device=device)
    if n == 0:
        return sig
    scales = torch.exp(-math.log(1e4) * torch.arange(n, device=device) / max(n - 1, 1))
    rows = torch.arange(height, device=device)[:, None] * scales  # (H, n)
    cols = torch.arange(width, device=device)[:, None] * scales  # (W, n)
    sig[0:n] = rows.sin().T[:, :, None]
    sig[n : 2 * n] = rows.cos().T[:, :, None]
    sig[2 * n : 3 * n] = cols.sin().T[:, None, :]
    sig[3 * n : 4 * n] = cols.cos().T[:, None, :]
    return sig


def add_timing(x: torch.Tensor) -> torch.Tensor:
    return x + timing_signal_2d(x.shape[1], x.shape[2], x.shape[3], str(x.device)).to(x.dtype)


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map, at every position."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Injection(nn.Module):
    """x <- x * sigmoid(Dense(v)) + Dense(v): how actions ("multi_additive") and bits enter a map."""

    def __init__(self, in_dim: int, channels: int):
        super().__init__()
        self.dense = nn.Linear(in_dim, 2 * channels)

    def forward(self, x, v):
        mul, add = self.dense(v).chunk(2, dim=-1)
        return x * torch.sigmoid(mul)[:, :, None, None] + add[:, :, None, None]


class InferenceNet(nn.Module):
    """Posterior over the bits, training only: (4 context frames, true next frame, action) -> bit
    logits. Two 8x8 stride-4 convs, each pooled over space by an attention-weighted mean."""

    def __init__(self, channels: int, num_actions: int, cfg: WorldModelArgs):
        super().__init__()
        f = cfg.inference_filters
        self.num_actions = num_actions
        self.embed = nn.Conv2d((STACK + 1) * channels, cfg.hidden_size, 1)
        self.inject = Injection(num_actions, cfg.hidden_size)
        self.conv1 = nn.Conv2d(cfg.hidden_size, f, 8, 4, 2)
        self.conv2 = nn.Conv2d(f, 4 * f, 8, 4, 2)
        self.attn1, self.attn2 = nn.Conv2d(f, 1, 1), nn.Conv2d(4 * f, 1, 1)
        self.to_bits = nn.Linear(5 * f, cfg.bits)

    @staticmethod
    def attention_pool(y, attn):
        weights = torch.softmax(attn(y).flatten(2), dim=-1)  # (B, 1, H*W)
        return (y.flatten(2) * weights).sum(-1)

    def forward(self, frames, target, actions):
        x = add_timing(self.embed(standardize_frames(torch.cat([frames, target[:, None]], dim=1))))
        x = self.inject(x, F.one_hot(actions, self.num_actions).float())
        y1 = F.relu(self.conv1(x))
        y2 = F.relu(self.conv2(y1))
        return self.to_bits(torch.cat([self.attention_pool(y1, self.attn1), self.attention_pool(y2, self.attn2)], 1))


class BitPrior(nn.Module):
    """Autoregressive LSTM prior over the bits, 8 at a time (a 256-way softmax per step), its state
    initialised from the flattened bottleneck. Trained by teacher forcing on the posterior's clean
    bits, sampled at play."""

    GROUP = 8

    def __init__(self, context_dim: int, bits: int, size: int):
        super().__init__()
        self.steps = bits // self.GROUP
        self.init_state = nn.Linear(context_dim, 2 * size)
        self.embed = nn.Embedding(2**self.GROUP + 1, size)  # the last index is the start token
        self.cell = nn.LSTMCell(size, size)
        self.out = nn.Linear(size, 2**self.GROUP)

    def _start(self, context):
        h, c = self.init_state(context).chunk(2, dim=-1)
        prev = torch.full((context.shape[0],), 2**self.GROUP, dtype=torch.long, device=context.device)
        return (torch.tanh(h), c), prev

    def loss(self, context, bits):
        groups = bits_to_groups(bits, self.GROUP)
        state, prev = self._start(context)
        total = 0.0
        for k in range(self.steps):
            state = self.cell(self.embed(prev), state)
            total = total + F.cross_entropy(self.out(state[0]), groups[:, k])
            prev = groups[:, k]
        return total / self.steps

    @torch.no_grad()
    def sample(self, context, temperature: float):
        state, prev = self._start(context)
        groups = []
        for _ in range(self.steps):
            state = self.cell(self.embed(prev), state)
            logits = self.out(state[0])
            prev = sample_logits(logits, temperature)
            groups.append(prev)
        return groups_to_bits(torch.stack(groups, dim=1), self.GROUP)


class WorldModel(nn.Module):
    """Next frame and reward from 4 stacked frames and an action (the paper's figure: frame-stacked,
    no recurrence).

    standardise + 1x1 embed + position signal -> `compress_steps` x [dropout, pad to even, conv
    4x4/2, ReLU, LN], saving each block's input (before its dropout) -> action injection ->
    (stochastic: bits injected) -> 3x3 conv layers, each on a dropped-out input -> decoder: per block
    [dropout, action injection, deconv 4x4/2 + ReLU, crop, LN(x + skip), position signal] -> 1x1
    conv to 256 logits per pixel and channel. Reward: 3 classes (-1, 0, +1) from the spatial means
    of the bottleneck (after the 3x3 layers) and of the final features."""

    def __init__(self, num_actions: int, frame_shape: tuple, cfg: WorldModelArgs):
        super().__init__()
        height, width, channels = frame_shape
        self.cfg, self.num_actions, self.frame_shape = cfg, num_actions, tuple(frame_shape)
        self.stochastic = cfg.model == "stochastic-discrete"
        chans = [cfg.hidden_size]
        for i in range(cfg.compress_steps):
            chans.append(chans[-1] * 2 if i < cfg.filter_double_steps else chans[-1])
        mid = chans[-1]
        self.embed = nn.Conv2d(STACK * channels, cfg.hidden_size, 1)
        self.encoder = nn.ModuleList(nn.Conv2d(chans[i], chans[i + 1], 4, 2, 1) for i in range(cfg.compress_steps))
        self.encoder_norms = nn.ModuleList(ChannelNorm(chans[i + 1]) for i in range(cfg.compress_steps))
        self.action_in = Injection(num_actions, mid)
        self.middle = nn.ModuleList(nn.Conv2d(mid, mid, 3, padding=1) for _ in range(cfg.hidden_layers))
        self.middle_norms = nn.ModuleList(ChannelNorm(mid) for _ in range(cfg.hidden_layers))
        rev = list(reversed(range(cfg.compress_steps)))
        self.decoder_actions = nn.ModuleList(Injection(num_actions, chans[i + 1]) for i in rev)
        self.decoder = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 4, 2, 1) for i in rev)
        self.decoder_norms = nn.ModuleList(ChannelNorm(chans[i]) for i in rev)
        self.frame_head = nn.Conv2d(cfg.hidden_size, channels * 256, 1)
        self.reward_head = nn.Sequential(nn.Linear(mid + cfg.hidden_size, 128), nn.ReLU(), nn.Linear(128, 3))
        if self.stochastic:
            bh, bw = height, width
            for _ in range(cfg.compress_steps):
                bh, bw = (bh + 1) // 2, (bw + 1) // 2
            self.inference = InferenceNet(channels, num_actions, cfg)
            self.bits_in = Injection(cfg.bits, mid)
            self.prior = BitPrior(mid * bh * bw, cfg.bits, cfg.lstm_size)

    bf16 = False  # set from --precision: convolutions under bf16 autocast; heads, LSTM prior and losses in fp32

    def forward(self, frames, actions, target=None, step: int = 0, latent_temperature: float = 1.0):
        """frames (B, 4, H, W, C) uint8, actions (B,) -> frame logits (B, H, W, C, 256), reward
        logits (B, 3), auxiliary loss (the prior's cross-entropy; 0 outside stochastic training).
        The posterior is used only in training mode with a target frame; otherwise the bits come
        from the LSTM prior."""
        with torch.autocast(frames.device.type, torch.bfloat16, enabled=self.bf16):
            logits, features, aux = self.trunk(frames, actions, target, step, latent_temperature)
        return logits.float(), self.reward_head(features.float()), aux

    def trunk(self, frames, actions, target, step: int, latent_temperature: float):
        cfg = self.cfg
        a = F.one_hot(actions, self.num_actions).float()
        x = add_timing(self.embed(standardize_frames(frames)))
        skips = []
        for conv, norm in zip(self.encoder, self.encoder_norms):
            skips.append(x)  # the block's input before its dropout
            x = F.dropout(x, cfg.dropout, self.training)
            x = F.pad(x, (0, x.shape[3] % 2, 0, x.shape[2] % 2))
            x = norm(F.relu(conv(add_timing(x))))
        x = self.action_in(x, a)
        aux = x.new_zeros(())
        if self.stochastic:
            x, aux = self.inject_latent(x, frames, actions, target, step, latent_temperature)
        for i, (conv, norm) in enumerate(zip(self.middle, self.middle_norms)):
            y = F.relu(conv(F.dropout(x, cfg.residual_dropout, self.training)))
            x = y if i == 0 else norm(x + y)
        # the reward head's first input, after the 3x3 layers (the reference takes it before them; there the head
        # never learned the block game's rare reward in test_reward_head_learns_a_rare_state_dependent_reward_...:
        # its accuracy stayed at always-0's 87 %, against 95 % here)
        x_mid = x.mean((2, 3))
        for inject, deconv, norm, skip in zip(self.decoder_actions, self.decoder, self.decoder_norms, reversed(skips)):
            x = inject(F.dropout(x, cfg.dropout, self.training), a)
            x = F.relu(deconv(x))[:, :, : skip.shape[2], : skip.shape[3]]
            x = add_timing(norm(x + skip))
        # the 1x1 conv applied as what it is, a linear map of each pixel's features, so that each sub-pixel's 256
        # logits are contiguous for the softmax and argmax (as a conv they were not, and copying them back cost
        # a third of a CPU training step)
        logits = F.linear(x.permute(0, 2, 3, 1), self.frame_head.weight.flatten(1), self.frame_head.bias)
        B, H, W, _ = logits.shape
        logits = logits.view(B, H, W, -1, 256)
        return logits, torch.cat([x_mid, x.mean((2, 3))], dim=1), aux

    def inject_latent(self, x, frames, actions, target, step, latent_temperature):
        with torch.autocast(x.device.type, enabled=False):  # the LSTM prior stays fp32
            return self._inject_latent(x, frames, actions, target, step, latent_temperature)

    def _inject_latent(self, x, frames, actions, target, step, latent_temperature):
        cfg, B, x = self.cfg, x.shape[0], x.float()
        context = x.flatten(1)
        if not (self.training and target is not None):
            return self.bits_in(x, self.prior.sample(context, latent_temperature)), x.new_zeros(())
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.bf16):  # the inference net's convolutions
            post_logits = self.inference(frames, target, actions).float()
        bits, soft = discrete_latent(post_logits, cfg.bit_noise, cfg.bit_flip, training=True)
        hard = torch.rand(B, device=x.device) < min(1.0, step / max(1, cfg.discretize_warmup))
        bits = torch.where(hard[:, None], bits, soft)  # warm-up: continuous tanh for a falling share of examples
        prior_loss = self.prior.loss(context, torch.where(post_logits > 0, 1.0, -1.0).detach())
        from_prior = torch.rand(B, device=x.device) < cfg.prior_max_sampling * min(1.0, step / max(1, cfg.prior_warmup))
        if from_prior.any():  # the prior's bits on the forward pass, the posterior's gradient (straight-through)
            sampled = self.prior.sample(context.detach(), 1.0)
            bits = torch.where(from_prior[:, None], sampled + bits - bits.detach(), bits)
        use = torch.rand(B, device=x.device) < cfg.latent_use_max * inverse_lin_decay(step, cfg.latent_use_warmup)
        return torch.where(use[:, None, None, None], self.bits_in(x, bits), x), prior_loss

    def to_file(self) -> dict:
        """What world_model.pt holds besides its tags (world_model_from rebuilds the model from it)."""
        shape, config = list(self.frame_shape), asdict(self.cfg)
        sizes = {"num_actions": self.num_actions, "frame_shape": shape, "config": config}
        return {"network": "WorldModel", **sizes, "state_dict": self.state_dict()}

    @torch.no_grad()
    def predict(self, frames, actions, pixel_temperature: float = 0.0, latent_temperature: float = 1.0):
        """Next frame (B, H, W, C) uint8 and reward (B,) in {-1, 0, 1}, for the simulated env."""
        logits, reward_logits, _ = self(frames, actions, latent_temperature=latent_temperature)
        pixels = sample_logits(logits, pixel_temperature)  # (B, H, W, C)
        return pixels.to(torch.uint8), reward_logits.argmax(-1).float() - 1.0


# --------------------------------------------------------------------------------------------------
# The math (pure functions)
# --------------------------------------------------------------------------------------------------
def standardize_frames(frames: torch.Tensor) -> torch.Tensor:
    """(B, n, H, W, C) uint8 -> (B, n*C, H, W): each frame to zero mean and unit std
    (the std floored at 1/sqrt(size))."""
    x = frames.float()
    mean = x.mean(dim=(2, 3, 4), keepdim=True)
    std = x.std(dim=(2, 3, 4), keepdim=True, correction=0).clamp_min(1.0 / math.sqrt(x[0, 0].numel()))
    x = (x - mean) / std
    return x.permute(0, 1, 4, 2, 3).flatten(1, 2)


def discrete_latent(logits, noise_std: float, flip_prob: float, training: bool):
    """Bit logits -> (bits in {-1, +1} with a straight-through gradient through tanh, the tanh).
    Training adds N(0, noise_std) to the logits and flips each bit with probability flip_prob."""
    if training and noise_std > 0:
        logits = logits + noise_std * torch.randn_like(logits)
    soft = torch.tanh(logits)
    hard = torch.where(soft > 0, 1.0, -1.0)
    bits = soft + (hard - soft).detach()
    if training and flip_prob > 0:
        bits = torch.where(torch.rand_like(bits) < flip_prob, -bits, bits)
    return bits, soft


def bits_to_groups(bits: torch.Tensor, group: int) -> torch.Tensor:
    """(B, n*group) bits in {-1, +1} -> (B, n) integers in [0, 2**group): bit k of a group is 2**k."""
    b = (bits > 0).long().view(bits.shape[0], -1, group)
    return (b << torch.arange(group, device=bits.device)).sum(-1)


def groups_to_bits(groups: torch.Tensor, group: int) -> torch.Tensor:
    """Inverse of bits_to_groups."""
    b = (groups[..., None] >> torch.arange(group, device=groups.device)) & 1
    return (b.float() * 2 - 1).flatten(1)


def sample_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Index per row of the last axis: argmax at temperature 0, else a sample of softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    flat = logits.reshape(-1, logits.shape[-1]) / temperature
    return torch.multinomial(torch.softmax(flat.float(), -1), 1).view(logits.shape[:-1])


def inverse_exp_decay(step: float, max_step: int, min_value: float = 0.01) -> float:
    """Rises exponentially from min_value at step 0 to 1 at max_step (tensor2tensor's name)."""
    return math.exp(math.log(min_value) / max_step) ** max(max_step - step, 0)


def inverse_lin_decay(step: float, max_step: int, min_value: float = 0.01) -> float:
    """Rises linearly from min_value at step 0 to 1 at max_step."""
    return min(step / max_step, 1.0) * (1.0 - min_value) + min_value


def scheduled_sampling_prob(step: float, exp_steps: int, lin_steps: int, max_prob: float) -> float:
    """Probability of feeding the model its own frame instead of the real one (prob_inverse_lin)."""
    return max_prob * inverse_exp_decay(step, exp_steps) * inverse_lin_decay(step, lin_steps)


def clipped_pixel_loss(logits: torch.Tensor, target: torch.Tensor, cutoff: float):
    """Per-pixel cross-entropy (logits (..., 256), target (...) long) -> (mean of relu(xent - cutoff),
    mean xent). Pixels already predicted to within the cutoff give no gradient."""
    xent = F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="none")
    return F.relu(xent - cutoff).mean(), xent.mean().detach()


def background_noise(frames: torch.Tensor, prob: float) -> torch.Tensor:
    """Replace each pixel of uint8 frames (..., C) with probability prob by the batch's median
    ("background") colour: next_frame_pixel_noise's input noise, so no single pixel is relied on."""
    if prob <= 0:
        return frames
    background = frames.reshape(-1, frames.shape[-1]).median(dim=0).values
    mask = torch.rand(frames.shape[:-1], device=frames.device) < prob
    return torch.where(mask[..., None], background, frames)


def reward_to_class(rewards: torch.Tensor) -> torch.Tensor:
    """Game reward -> class: clip to [-1, 1], round; class = that + 1 (0: -1, 1: 0, 2: +1)."""
    return torch.round(torch.clamp(torch.as_tensor(rewards, dtype=torch.float32), -1, 1)).long() + 1


def real_steps_schedule(real_steps: int, epochs: int, num_envs: int) -> dict:
    """Accounting of real play: per_epoch = ceil(real_steps / epochs) agent steps, rounded up to a
    multiple of num_envs; collections = 1 random + 1 per epoch.
    96,000 / 15 -> 16 x 6,400 = 102,400 (the paper's "100K")."""
    per_epoch = math.ceil(math.ceil(real_steps / epochs) / num_envs) * num_envs
    return {
        "per_epoch": per_epoch,
        "per_env": per_epoch // num_envs,
        "collections": epochs + 1,
        "total": per_epoch * (epochs + 1),
    }


WM_MULTIPLIER_EPOCHS = (0, 1, 4, 9, 14)  # epochs whose world-model steps are x epoch_multiplier
PPO_X2_EPOCHS = (1, 7, 11)  # epochs whose PPO iterations are x2 (the last epoch: x3)


def world_model_steps(epoch: int, train_steps: int, multiplier: int) -> int:
    return train_steps * (multiplier if epoch in WM_MULTIPLIER_EPOCHS else 1)


def ppo_iterations(epoch: int, epochs: int, iterations: int) -> int:
    return iterations * (3 if epoch == epochs - 1 else 2 if epoch in PPO_X2_EPOCHS else 1)


def compute_gae(rewards, values, dones, last_value, gamma: float, lam: float):
    """(T, N) rewards/values/dones (dones[t]: the game ended at step t), last_value (N,)
    -> advantages, returns."""
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[0])):
        keep = 1.0 - dones[t].float()
        next_value = last_value if t == rewards.shape[0] - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_value * keep - values[t]
        running = delta + gamma * lam * keep * running
        adv[t] = running
    return adv, adv + values


# --------------------------------------------------------------------------------------------------
# Environments: the real game, its collected data, the game simulated by the world model
# --------------------------------------------------------------------------------------------------
def make_envs(rom: str, num_envs: int, sticky: float, noop_max: int, max_frames: int):
    """ale-py's C++ vector env, SimPLe's frames: 105x80 RGB, 4-stack, frameskip 4 with max-pool.

    Returns uint8 observations (num_envs, 4, 105, 80, 3). No reward clipping (the true score is
    logged; the reward head learns sign(r)), a lost life is not an episode end, no FIRE at reset
    (the reference presses none), same-step autoreset (a done step returns the new game's first
    stack, whose older frames are zeros)."""
    from ale_py.vector_env import AtariVectorEnv

    game = {"repeat_action_probability": sticky, "noop_max": noop_max, "max_num_frames_per_episode": max_frames}
    rules = {"reward_clipping": False, "episodic_life": False, "use_fire_reset": False, "full_action_space": False}
    frames = {"frameskip": 4, "maxpool": True, "stack_num": STACK, "grayscale": False}
    size = {"img_height": FRAME_SHAPE[0], "img_width": FRAME_SHAPE[1]}
    return AtariVectorEnv(rom, num_envs, **game, **rules, **frames, **size, autoreset_mode="SameStep")


def make_policy_envs(policy, num_envs: int = 1):
    """The real envs `policy` (from load_policy) was trained on, made as in training."""
    c = policy.env_config
    return make_envs(c["rom"], num_envs, c["sticky"], c["noop_max"], c["max_episode_frames"])


def real_envs(args: Args, ctx: dict) -> dict:
    """The real envs of the collections, made on first use (a resumed run starts new games)."""
    if ctx.get("real") is None:
        c = ctx["env_config"]
        envs = make_envs(c["rom"], args.env.num_envs, c["sticky"], c["noop_max"], c["max_episode_frames"])
        obs, _ = envs.reset(seed=int(ctx["rng"].integers(0, 2**31 - 1)))
        n = obs.shape[0]
        ctx["real"] = {"envs": envs, "obs": obs, "episodes": []}
        ctx["real"].update(ep_return=np.zeros(n), ep_length=np.zeros(n, dtype=np.int64))
    return ctx["real"]


def step_real(real: dict, action: np.ndarray):
    """One step of the real envs; each finished game's (score, length) goes to real["episodes"]."""
    obs, reward, term, trunc, _ = real["envs"].step(action)
    done = term | trunc
    real["ep_return"] += reward
    real["ep_length"] += 1
    for i in np.flatnonzero(done):
        real["episodes"].append((float(real["ep_return"][i]), int(real["ep_length"][i])))
        real["ep_return"][i], real["ep_length"][i] = 0.0, 0
    real["obs"] = obs
    return obs, reward, done


def valid_starts(dones: np.ndarray, targets: int) -> np.ndarray:
    """Start indices t of windows in one env's timeline (frames f[t .. t+3+targets]) that are true
    game sequences.

    dones[j] marks transition j (obs j -> obs j+1) as the end of a game. Stack t equals f[t:t+4]
    only if no game ended in transitions t-3 .. t-1, and its targets are true successors only if
    none ended in t .. t+targets-1."""
    T = len(dones)
    if targets > T:
        return np.zeros(0, dtype=np.int64)
    bad = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(dones.astype(np.int64))])  # bad[j] = dones before j
    t = np.arange(0, T - targets + 1)
    lo = np.maximum(t - 3, 0)
    return t[(bad[t + targets] - bad[lo]) == 0]


class RealData:
    """Every real collection: per env a frame timeline f (T+4 frames: the first stack, then each new
    frame), actions, rewards and game ends. Env 0 of each collection is held out for the world-model
    evaluation (when a collection has more than one env)."""

    def __init__(self):
        self.collections: list[dict] = []

    def add(self, collection: dict):
        self.collections.append(collection)

    @property
    def real_steps(self) -> int:
        return sum(c["actions"].size for c in self.collections)

    def windows(self, targets: int, held_out: bool, latest_only: bool = False) -> np.ndarray:
        """(collection, env, start) of every valid window with `targets` predicted frames."""
        out = []
        chosen = range(len(self.collections))[-1:] if latest_only else range(len(self.collections))
        for c in chosen:
            n_envs = self.collections[c]["actions"].shape[1]
            envs = [0] if held_out else (range(1, n_envs) if n_envs > 1 else [0])
            for e in envs:
                for t in valid_starts(self.collections[c]["dones"][:, e], targets):
                    out.append((c, e, t))
        return np.array(out, dtype=np.int64).reshape(-1, 3)

    def sequences(self, windows: np.ndarray, targets: int):
        """Frames (B, 4+targets, H, W, C) uint8, actions (B, targets), reward classes (B, targets)."""
        frames, actions, rewards = [], [], []
        for c, e, t in windows:
            col = self.collections[c]
            frames.append(col["frames"][t : t + STACK + targets, e])
            actions.append(col["actions"][t : t + targets, e])
            rewards.append(col["rewards"][t : t + targets, e])
        rewards = reward_to_class(torch.as_tensor(np.stack(rewards)))
        return torch.as_tensor(np.stack(frames)), torch.as_tensor(np.stack(actions)).long(), rewards

    def start_stacks(self, n: int, rng: np.random.Generator, flip_first: bool = True) -> torch.Tensor:
        """n random real 4-frame stacks from the latest collection (training envs), as the
        reference; with flip_first, env 0 starts from the first stack of that collection (a game
        start on the first epoch)."""
        w = self.windows(0, held_out=False, latest_only=True)
        picks = w[rng.integers(0, len(w), size=n)]
        if flip_first:
            picks[0] = w[0]
        return self.sequences(picks, 0)[0]


class SimulatedEnv:
    """A batch of envs inside the world model: each keeps a 4-frame stack; a step appends the
    predicted frame; the reward is the reward head's class - 1; done is always False (every
    rollout starts with a reset)."""

    def __init__(self, model: WorldModel, pixel_temperature: float, latent_temperature: float):
        self.model, self.pixel_t, self.latent_t = model, pixel_temperature, latent_temperature
        self.stacks = None

    def reset(self, stacks: torch.Tensor) -> torch.Tensor:
        self.stacks = stacks.clone()
        return self.stacks

    def step(self, actions: torch.Tensor):
        frame, reward = self.model.predict(self.stacks, actions, self.pixel_t, self.latent_t)
        self.stacks = torch.cat([self.stacks[:, 1:], frame[:, None]], dim=1)
        return self.stacks, reward, torch.zeros_like(reward, dtype=torch.bool)


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------
PROGRESS_EVERY_S = float(os.environ.get("PROGRESS_EVERY_S", "30"))  # plain lines off a terminal


class Progress:
    """A tqdm bar on a terminal; when stderr is not one (a log file, a pipe), a plain line on stderr
    every PROGRESS_EVERY_S seconds: `[phase] step/total unit, rate unit/s, latest values`."""

    def __init__(self, total: int, desc: str, initial: int = 0, unit: str = "it"):
        from tqdm import tqdm

        self.tty = sys.stderr.isatty()
        bar = {"total": total, "initial": initial, "desc": desc, "unit": unit}
        self.bar = tqdm(**bar, dynamic_ncols=True, disable=not self.tty)
        self.total, self.desc, self.unit, self.n, self.postfix = total, desc, unit, initial, {}
        self.n0, self.t0 = initial, time.time()
        self.last = self.t0

    def update(self, n: int = 1, **postfix):
        """n more done; postfix: the latest values to show (loss, return, ...)."""
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


def make_wm_optimizer(model: WorldModel, cfg: WorldModelArgs):
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    return torch.optim.Adafactor(model.parameters(), lr=cfg.learning_rate)


def world_model_loss(model: WorldModel, frames, actions, reward_classes, cfg: WorldModelArgs, step: int):
    """Loss over `targets` next frames with scheduled sampling: the first 4 frames are real; each
    next input frame is, per example, the model's argmax prediction with probability
    scheduled_sampling_prob, else the real one."""
    targets = actions.shape[1]
    p_own = scheduled_sampling_prob(step, cfg.ss_exp_steps, cfg.ss_lin_steps, cfg.ss_max_prob)
    stack = background_noise(frames[:, :STACK], cfg.input_noise)
    loss, xent, reward_acc = 0.0, 0.0, 0.0
    for k in range(targets):
        real = frames[:, STACK + k]
        logits, reward_logits, aux = model(stack, actions[:, k], target=real, step=step)
        pixel_loss, pixel_xent = clipped_pixel_loss(logits, real.long(), cfg.loss_cutoff)
        loss = loss + pixel_loss + F.cross_entropy(reward_logits, reward_classes[:, k]) + aux
        xent = xent + pixel_xent
        reward_acc = reward_acc + (reward_logits.argmax(-1) == reward_classes[:, k]).float().mean()
        own = logits.detach().argmax(-1).to(torch.uint8)
        feed = torch.where((torch.rand(real.shape[0], device=real.device) < p_own)[:, None, None, None], own, real)
        stack = torch.cat([stack[:, 1:], feed[:, None]], dim=1)
    return loss / targets, {"pixel_xent": xent / targets, "reward_accuracy": reward_acc / targets, "ss_prob": p_own}


def train_world_model(model, optimizer, scheduler, data: RealData, cfg: WorldModelArgs, state, steps: int, ctx):
    """Phase 1 of an epoch: `steps` optimiser steps on random windows of all real data collected so
    far (a resumed run starts at state["phase_step"])."""
    device, rng, writer = ctx["device"], ctx["rng"], ctx["writer"]
    windows = data.windows(cfg.target_frames, held_out=False)
    if len(windows) == 0:
        raise UsageError(
            f"no real sequence of {STACK + cfg.target_frames} frames without a game end: collect "
            "more steps per env (--loop.real-steps) or lower --wm.target-frames"
        )
    model.train()
    bar = Progress(steps, f"epoch {state['epoch']} world model", state["phase_step"], "step")
    t_log, step_log = time.time(), state["wm_step"]
    while state["phase_step"] < steps:
        batch = data.sequences(windows[rng.integers(0, len(windows), cfg.batch_size)], cfg.target_frames)
        frames, actions, rewards = (t.to(device) for t in batch)
        loss, info = world_model_loss(model, frames, actions, rewards, cfg, state["wm_step"])
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"world-model loss is {loss.item()} at world-model step {state['wm_step']}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        state["wm_step"] += 1
        state["phase_step"] += 1
        step, shown = state["wm_step"], {}
        if step % 20 == 0 or state["phase_step"] == steps:
            scalars = {"loss": loss, "pixel_xent": info["pixel_xent"], "grad_norm": grad_norm}
            scalars["train_reward_accuracy"] = info["reward_accuracy"]
            for key, value in scalars.items():
                writer.add_scalar(f"world_model/{key}", float(value.detach()), step)
            writer.add_scalar("world_model/scheduled_sampling_prob", info["ss_prob"], step)
            writer.add_scalar("world_model/steps_per_s", (step - step_log) / (time.time() - t_log), step)
            t_log, step_log = time.time(), step
            shown = {"loss": f"{float(loss.detach()):.3f}"}
            shown["xent"] = f"{float(info['pixel_xent']):.3f}"
        bar.update(1, **shown)
        checkpoint(ctx, state, state["phase_step"])
    bar.close()


@torch.no_grad()
def evaluate_world_model(model: WorldModel, data: RealData, cfg: WorldModelArgs, rng, device):
    """Open-loop rollouts of the model on held-out real sequences (the reference's
    evaluate_world_model), beside the copy-the-last-frame baseline (and reward always 0). Frame
    error: mean squared pixel error in [0, 1] averaged over the first h steps; reward accuracy
    likewise; h in (1, 12, eval_horizon). Returns the metrics and the first sequence's (real,
    predicted) frames for wm_strip.png."""
    horizon, windows = cfg.eval_horizon, np.zeros((0, 3), dtype=np.int64)
    while horizon >= 1:  # the longest horizon (<= eval_horizon) that the held-out play allows
        windows = data.windows(horizon, held_out=True)
        if len(windows):
            break
        horizon //= 2
    if not len(windows):
        return {}, None
    picks = windows[rng.choice(len(windows), size=min(cfg.eval_sequences, len(windows)), replace=False)]
    frames, actions, rewards = (t.to(device) for t in data.sequences(picks, horizon))
    model.eval()
    sim = SimulatedEnv(model, cfg.pixel_temperature, cfg.latent_temperature)
    stack = sim.reset(frames[:, :STACK])
    predicted, model_err, copy_err, model_acc, copy_acc = [], [], [], [], []
    for k in range(horizon):
        if STOP["signal"]:
            raise Interrupted("world-model evaluation interrupted (it restarts on resume)")
        stack, reward, _ = sim.step(actions[:, k])
        real = frames[:, STACK + k].float()
        predicted.append(stack[:, -1])
        model_err.append(((stack[:, -1].float() - real) / 255.0).pow(2).mean().item())
        copy_err.append(((frames[:, STACK - 1].float() - real) / 255.0).pow(2).mean().item())
        model_acc.append((reward + 1 == rewards[:, k]).float().mean().item())
        copy_acc.append((rewards[:, k] == 1).float().mean().item())
    out = {"horizon": horizon, "sequences": len(picks)}
    for h in sorted({1, min(12, horizon), horizon}):
        out[f"frame_mse_{h}"] = float(np.mean(model_err[:h]))
        out[f"copy_frame_mse_{h}"] = float(np.mean(copy_err[:h]))
        out[f"reward_accuracy_{h}"] = float(np.mean(model_acc[:h]))
        out[f"copy_reward_accuracy_{h}"] = float(np.mean(copy_acc[:h]))
    return out, (frames[0, STACK:].cpu().numpy(), torch.stack(predicted, 1)[0].cpu().numpy())


def ppo_update(policy: Policy, optimizer, rollout: dict, cfg: PPOArgs) -> dict:
    """PPO on one rollout (T, N): advantages normalised over the rollout; (T-1) x update_epochs //
    minibatch_steps minibatches, each `minibatch_steps` random time indices x all envs (the
    reference's optimisation batches)."""
    T = rollout["actions"].shape[0]
    adv = rollout["advantages"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy.train()
    stats = {}
    for _ in range(max(1, (T - 1) * cfg.update_epochs // cfg.minibatch_steps)):
        idx = torch.randperm(T, device=adv.device)[: cfg.minibatch_steps]
        logits, value = policy(rollout["obs"][idx].flatten(0, 1))
        dist = torch.distributions.Categorical(logits=logits)
        logp = dist.log_prob(rollout["actions"][idx].flatten())
        ratio = (logp - rollout["logprobs"][idx].flatten()).exp()
        a = adv[idx].flatten()
        pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
        v_loss = 0.5 * (value - rollout["returns"][idx].flatten()).pow(2).mean()
        entropy = dist.entropy().mean()
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"PPO loss is {loss.item()}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        stats = {
            "policy_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy.item(),
            "clipfrac": ((ratio - 1).abs() > cfg.clip_coef).float().mean().item(),
        }
    return stats


def rollout_and_update(policy, optimizer, env_step, obs, cfg: PPOArgs, num_steps: int, stop=False):
    """num_steps of `env_step(actions) -> (obs, reward, done)` from obs, then one PPO update. With
    stop, a pending SIGINT/SIGTERM ends the rollout (Interrupted) before the policy changes."""
    policy.eval()
    buf = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "dones")}
    for _ in range(num_steps):
        if stop and STOP["signal"]:
            raise Interrupted("PPO in the model interrupted in a rollout (redone on resume)")
        with torch.no_grad():
            logits, value = policy(obs)
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        buf["obs"].append(obs)
        buf["actions"].append(action)
        buf["logprobs"].append(dist.log_prob(action))
        buf["values"].append(value)
        obs, reward, done = env_step(action)
        buf["rewards"].append(reward)
        buf["dones"].append(done)
    with torch.no_grad():
        last_value = policy(obs)[1]
    rollout = {k: torch.stack(v) for k, v in buf.items()}
    rollout["advantages"], rollout["returns"] = compute_gae(
        rollout["rewards"], rollout["values"], rollout["dones"], last_value, cfg.gamma, cfg.gae_lambda
    )
    return obs, rollout, ppo_update(policy, optimizer, rollout, cfg)


def train_policy_in_model(policy, optimizer, model, data: RealData, args: Args, state: dict, iterations: int, ctx):
    """Phase 2: PPO inside the world model. Every iteration resets the simulated envs to real
    4-frame stacks drawn from the latest collection and rolls out num_steps steps; the reward is
    the reward head's. Returns the last iteration's mean simulated return."""
    cfg, device, writer = args.ppo, ctx["device"], ctx["writer"]
    model.eval()
    sim = SimulatedEnv(model, args.wm.pixel_temperature, args.wm.latent_temperature)
    desc = f"epoch {state['epoch']} PPO in the model"
    bar = Progress(iterations, desc, state["phase_step"], "iteration")
    while state["phase_step"] < iterations:
        t0 = time.time()
        with redone_on_resume(ctx):
            obs = sim.reset(data.start_stacks(cfg.num_envs, ctx["rng"]).to(device))
            try:
                ppo = (policy, optimizer, sim.step, obs, cfg, cfg.num_steps)
                _, rollout, stats = rollout_and_update(*ppo, stop=True)
            except NonFiniteLoss as e:
                it = state["ppo_iter"] + 1
                raise NonFiniteLoss(f"{e} in PPO inside the model at iteration {it}") from None
        state["ppo_iter"] += 1
        state["phase_step"] += 1
        sim_return = rollout["rewards"].sum(0).mean().item()
        it = state["ppo_iter"]
        writer.add_scalar("sim/rollout_return", sim_return, it)
        writer.add_scalar("sim/SPS", cfg.num_envs * cfg.num_steps / max(time.time() - t0, 1e-9), it)
        for key, value in stats.items():
            writer.add_scalar(f"losses/{key}", value, it)
        state["last_sim_return"] = sim_return
        sps = cfg.num_envs * cfg.num_steps / max(time.time() - t0, 1e-9)
        bar.update(1, SPS=f"{sps:.0f}", sim_return=f"{sim_return:.2f}")
        checkpoint(ctx, state, state["phase_step"])
    bar.close()
    return state.get("last_sim_return")


def collect_real(policy: Policy, real: dict, steps: int, temperature: float, rng, random_policy: bool) -> dict:
    """Phase 3: play `steps` real agent steps per env with the policy at the collection temperature,
    or uniformly at random. Returns the collection (frame timeline, actions, rewards, game ends)."""
    obs = real["obs"]
    policy.eval()  # no dropout when acting
    frames = [obs[:, k] for k in range(STACK)]
    actions, rewards, dones = [], [], []
    t0 = time.time()
    bar = Progress(steps, f"collect {'random' if random_policy else 'policy'} play", unit="step")
    for _ in range(steps):
        if STOP["signal"]:
            raise Interrupted("real collection interrupted (it restarts on resume)")
        if random_policy:
            action = rng.integers(0, policy.config["num_actions"], size=obs.shape[0])
        else:
            action = policy.act(obs, temperature)
        obs, reward, done = step_real(real, action)
        frames.append(obs[:, -1])
        actions.append(action)
        rewards.append(reward)
        dones.append(done)
        latest = {"score": f"{real['episodes'][-1][0]:.0f}"} if real["episodes"] else {}
        bar.update(1, **latest)
    bar.close()
    real["sps"] = steps * obs.shape[0] / max(time.time() - t0, 1e-9)
    actions, rewards = np.stack(actions).astype(np.int64), np.stack(rewards).astype(np.float32)
    return {"frames": np.stack(frames), "actions": actions, "rewards": rewards, "dones": np.stack(dones)}


def evaluate_policy(policy, num_envs, episodes, temperature, noop_max, seed, video_path=None, max_steps=0) -> dict:
    """Phase 4: real games in the envs the policy was trained on, each env a fixed quota of games,
    logits / T; full games (up to max_episode_frames) or, with max_steps, games truncated after that
    many agent steps (scored as they stand)."""
    if episodes == 0:
        return {}
    n = min(num_envs, episodes)
    policy.eval()
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    c = policy.env_config
    frames_cap = min(c["max_episode_frames"], 4 * max_steps) if max_steps else c["max_episode_frames"]
    envs = make_envs(c["rom"], n, c["sticky"], noop_max, frames_cap)
    if STOP["signal"]:  # making the envs takes seconds on a busy machine: a signal then skips their reset
        envs.close()
        raise Interrupted("evaluation interrupted (it restarts on resume)")
    obs, _ = envs.reset(seed=seed)
    ret, done_count, returns, video = np.zeros(n), np.zeros(n, dtype=int), [], [] if video_path else None
    counts = np.zeros(policy.config["num_actions"], dtype=np.int64)
    bar = Progress(episodes, f"evaluate T={temperature}", unit="game")
    while (done_count < quota).any():
        if STOP["signal"]:
            envs.close()
            raise Interrupted("evaluation interrupted (it restarts on resume)")
        action = policy.act(obs, temperature)
        counts += np.bincount(action, minlength=len(counts))
        obs, reward, term, trunc, _ = envs.step(action)
        if video is not None:
            video.append(obs[0, -1])
        ret += reward
        for i in np.flatnonzero(term | trunc):
            if done_count[i] < quota[i]:
                returns.append(float(ret[i]))
                bar.update(1, score=f"{ret[i]:.0f}")
            done_count[i] += 1
            if i == 0 and video is not None:
                write_video(video, video_path)
                video = None
            ret[i] = 0.0
    envs.close()
    bar.close()
    mean, std = float(np.mean(returns)), float(np.std(returns))
    settings = {"temperature": temperature, "noop_max": noop_max, "max_steps": max_steps}
    shares = (counts / counts.sum()).tolist()  # how often each action was chosen (of the game's minimal set)
    return {"mean": mean, "std": std, "returns": returns, "action_shares": shares, **settings}


FORMAT_VERSION = 2  # of the files `save` writes; a file of a version its kind cannot use is refused:
# version 2 changed the world model's layers (each skip taken before its block's dropout, dropout on the 3x3
# convs' inputs, as the reference), so version-1 world models and checkpoints compute something else
READABLE_VERSIONS = {"world_model": {2}, "checkpoint": {2}, "policy": {1, 2}, "collection": {1, 2}}


def save(path: Path, kind: str, **payload):
    """The one save of every artifact (policy, world_model, checkpoint .pt; collection .npz of arrays): written
    atomically, tagged with this script, the kind and the format version (`load`, below, checks the tag)."""
    tmp = path.with_name(path.name + ".tmp")
    tagged = {"script": SCRIPT, "kind": kind, "version": FORMAT_VERSION, **payload}
    if path.suffix == ".npz":
        with open(tmp, "wb") as f:
            np.savez(f, **tagged)
    else:
        torch.save(tagged, tmp)
    os.replace(tmp, path)


def run_simple(args: Args, ctx: dict, state: dict, modules: dict) -> dict:
    """The SimPLe loop (the reference's order): a random collection first, then per epoch train the
    world model on all real data, train PPO inside it, collect real steps with the policy, evaluate
    the policy in the real game. world-model-only: the world model and random collections only. A
    killed run restarts at the epoch, phase and step it was in: `todo` skips the phases its epoch
    had finished, and each phase resumes at its saved step."""
    data, model, policy, history = ctx["data"], modules["model"], modules["policy"], state["history"]
    phases = ("world_model", "policy", "collect", "evaluate")  # one epoch, in order
    if args.mode == "world-model-only":
        phases = ("world_model", "collect")

    def todo(phase: str) -> bool:
        return phase in phases and phases.index(phase) >= state["phase"]

    if not data.collections:
        collect_phase(policy, data, args, ctx, random_policy=True)
    start = state["epoch"]  # 0, or the epoch a killed run was in
    for epoch in range(start, args.loop.epochs):
        if todo("world_model"):
            wm_eval = world_model_phase(epoch, modules, data, args, ctx, state)
            history.append({"epoch": epoch, "world_model": wm_eval, "world_model_steps": state["wm_step"]})
            end_phase(state, phases, ctx, modules)
        if todo("policy"):
            opt = modules["ppo_opt"]
            iterations = ppo_iterations(epoch, args.loop.epochs, args.ppo.iterations)
            sim_return = train_policy_in_model(policy, opt, model, data, args, state, iterations, ctx)
            history[-1].update(sim_return=sim_return, ppo_iterations=state["ppo_iter"])
            end_phase(state, phases, ctx, modules)
        if todo("collect"):
            rewards = collect_phase(policy, data, args, ctx, random_policy=args.mode == "world-model-only")
            history[-1]["collect_rewards"] = rewards
            end_phase(state, phases, ctx, modules)
        if todo("evaluate"):
            ev = evaluate_phase(epoch, policy, data, args, ctx)
            history[-1].update(eval=ev, real_steps=data.real_steps)
            save(ctx["run_dir"] / "policy.pt", "policy", **policy.to_file())
            end_phase(state, phases, ctx, modules)
    final = history[-1] if history else {}
    world_model, ev = final.get("world_model"), final.get("eval")
    return {"real_steps": data.real_steps, "world_model": world_model, "eval": ev, "history": history}


def world_model_phase(epoch: int, modules: dict, data: RealData, args: Args, ctx: dict, state: dict) -> dict:
    """Train the world model (unless --world-model fixed it), save it, evaluate it open loop."""
    model = modules["model"]
    if args.world_model is None:
        steps = world_model_steps(epoch, args.wm.train_steps, args.wm.epoch_multiplier)
        train_world_model(model, modules["wm_opt"], modules["wm_sched"], data, args.wm, state, steps, ctx)
    save(ctx["run_dir"] / "world_model.pt", "world_model", env_id=args.env_id, **model.to_file())
    with redone_on_resume(ctx):
        wm_eval, strip = evaluate_world_model(model, data, args.wm, ctx["rng"], ctx["device"])
    for key, value in wm_eval.items():
        ctx["writer"].add_scalar(f"world_model/eval_{key}", value, epoch)
    write_strip(ctx["run_dir"], strip, args.env_id, epoch)
    print(f"[epoch {epoch}] world model: " + ", ".join(f"{k} {v:.4g}" for k, v in wm_eval.items()))
    return wm_eval


def collect_phase(policy: Policy, data: RealData, args: Args, ctx: dict, random_policy: bool) -> float:
    """Play one collection in the real game, save it as data/collection_NNN.npz, add it to the data. Returns the
    sum of its game rewards (what the reward head can learn from: on Freeway, the road crossings)."""
    with redone_on_resume(ctx):  # the first collection makes the real envs: redone alike
        real, steps = real_envs(args, ctx), ctx["schedule"]["per_env"]
        temperature = args.ppo.collect_temperature
        collection = collect_real(policy, real, steps, temperature, ctx["rng"], random_policy)
    save(ctx["run_dir"] / "data" / f"collection_{len(data.collections):03d}.npz", "collection", **collection)
    data.add(collection)
    writer = ctx["writer"]
    for ret, length in real["episodes"]:
        writer.add_scalar("charts/episodic_return", ret, data.real_steps)
        writer.add_scalar("charts/episodic_length", length, data.real_steps)
    real["episodes"].clear()
    writer.add_scalar("charts/SPS", real["sps"], data.real_steps)
    writer.add_scalar("charts/real_steps", data.real_steps, len(data.collections))
    writer.add_scalar("charts/collection_rewards", float(collection["rewards"].sum()), data.real_steps)
    who = "random" if random_policy else "policy"
    print(
        f"[collect] {who} play: {data.real_steps} real agent steps in all "
        f"({len(data.collections)} collections, {real['sps']:.0f} steps/s; rewards in this one: "
        f"{collection['rewards'].sum():g})"
    )
    return float(collection["rewards"].sum())


def evaluate_phase(epoch: int, policy: Policy, data: RealData, args: Args, ctx: dict) -> dict:
    """The epoch's evaluation in the real game, logged against the real steps collected so far."""
    cfg = args.eval
    video = ctx["run_dir"] / "videos" / f"eval_epoch{epoch:02d}.webm" if args.capture_video else None
    seed = args.seed + 10_000 + epoch
    with redone_on_resume(ctx):
        games = (cfg.num_envs, cfg.episodes, cfg.temperature, cfg.noop_max)
        ev = evaluate_policy(policy, *games, seed, video)
    if ev:
        ctx["writer"].add_scalar("eval/episodic_return", ev["mean"], data.real_steps)
        print(
            f"[epoch {epoch}] real score {ev['mean']:.2f} +- {ev['std']:.2f} over {len(ev['returns'])} games "
            f"({data.real_steps} real steps so far)"
        )
    return ev


def run_model_free(args: Args, ctx: dict, state: dict, modules: dict) -> dict:
    """The baseline: PPO (same network and settings) on the real game, as many real agent steps."""
    policy, optimizer, cfg, device, writer = (
        modules["policy"],
        modules["ppo_opt"],
        args.ppo,
        ctx["device"],
        ctx["writer"],
    )
    real = real_envs(args, ctx)
    num_envs = real["obs"].shape[0]
    iterations = -(-ctx["schedule"]["total"] // (num_envs * cfg.num_steps))  # the first rollout reaching it

    def env_step(action):
        obs, reward, done = step_real(real, action.cpu().numpy())
        for score, _ in real["episodes"]:
            writer.add_scalar("charts/episodic_return", score, state["real_steps"])
            state["recent"] = (state.get("recent", []) + [score])[-20:]
        real["episodes"].clear()
        state["real_steps"] += num_envs
        reward = torch.as_tensor(reward, dtype=torch.float32, device=device)
        return torch.as_tensor(obs, device=device), reward, torch.as_tensor(done, device=device)

    obs = torch.as_tensor(real["obs"], device=device)
    bar = Progress(iterations, "model-free PPO", state["ppo_iter"], "iteration")
    while state["ppo_iter"] < iterations:
        t0 = time.time()
        try:
            obs, _, stats = rollout_and_update(policy, optimizer, env_step, obs, cfg, cfg.num_steps)
        except NonFiniteLoss as e:
            raise NonFiniteLoss(f"{e} in model-free PPO at iteration {state['ppo_iter'] + 1}") from None
        state["ppo_iter"] += 1
        sps = num_envs * cfg.num_steps / max(time.time() - t0, 1e-9)
        writer.add_scalar("charts/SPS", sps, state["real_steps"])
        for key, value in stats.items():
            writer.add_scalar(f"losses/{key}", value, state["real_steps"])
        score = f"{np.mean(state['recent']):.1f}" if state.get("recent") else "-"
        bar.update(1, step=state["real_steps"], SPS=f"{sps:.0f}", score=score)
        checkpoint(ctx, state, state["ppo_iter"])
    bar.close()
    save(ctx["run_dir"] / "policy.pt", "policy", **policy.to_file())
    e = args.eval
    video = ctx["run_dir"] / "videos" / "eval_final.webm" if args.capture_video else None
    ev = evaluate_policy(policy, e.num_envs, e.episodes, e.temperature, e.noop_max, args.seed + 10_000, video)
    if ev:
        writer.add_scalar("eval/episodic_return", ev["mean"], state["real_steps"])
        print(f"[model-free] real score {ev['mean']:.2f} +- {ev['std']:.2f} after {state['real_steps']} real steps")
    return {"real_steps": state["real_steps"], "eval": ev}


def main(args: Args) -> None:
    try:
        run = start_run(args)  # validation; --eval-only and --mode play run there; None: nothing left to train
        if run is None:
            return
        ctx, state, modules = run
        with SignalGuard(ctx, state, modules):  # SIGINT/SIGTERM: the phase stops, the state is saved
            if args.mode == "model-free":
                result = run_model_free(args, ctx, state, modules)
            else:
                result = run_simple(args, ctx, state, modules)
        finish(args, ctx, state, result)
    except UsageError as e:  # bad input, found before any work or only with the collected data
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except NonFiniteLoss as e:
        print(f"error: {e}; lower the learning rate or re-run to resume from the last checkpoint", file=sys.stderr)
        raise SystemExit(3) from None
    except Interrupted as e:
        if args.eval_only:  # nothing was written: the evaluation is simply run again
            again = "the same command starts it again"
            print(f"interrupted during --eval-only: no evaluation written; {again}", file=sys.stderr)
            raise SystemExit(130) from None
        run_dir = ctx["run_dir"]
        print(f"interrupted ({e}): state saved; re-run with --run-dir {run_dir} to resume", file=sys.stderr)
        print(f"run directory: {run_dir}")
        raise SystemExit(130) from None


# ---- run management ----
PAPER_SIMPLE = {"pong": 12.8, "breakout": 16.4, "freeway": 16.7}  # SD-long, mean of 5 runs, 100K (iris SimPLe.json)

# --wm settings that shape the networks or the optimiser: a run dir is resumed only with the same ones
ARCHITECTURE = "model optimizer hidden_size compress_steps filter_double_steps hidden_layers bits lstm_size".split()
ARCHITECTURE += ["inference_filters"]


def field_ranges(cls, prefix: str = ""):
    """(dotted name, (lo, hi)) of every numeric field of Args and its nested phase dataclasses."""
    for f in dataclasses.fields(cls):
        if "range" in f.metadata:
            yield prefix + f.name, f.metadata["range"]
        elif isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
            yield from field_ranges(f.type, f"{f.name}.")


LIMITS = dict(field_ranges(Args))  # allowed ranges (inclusive); the generated bad-input tests loop over these


def numeric_fields(obj, prefix: str = ""):
    """(dotted name, value) of every int/float field of Args and its nested phase dataclasses."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from numeric_fields(value, f"{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield prefix + f.name, value


def start_run(args: Args):
    """Validation, then --eval-only or --mode play (run here), or the training run's set-up: (ctx, state, modules),
    resumed from checkpoints/state.pt when the run dir has one. None when nothing is left to train."""
    ctx = validate(args)
    if args.eval_only:
        with stop_on_signals():
            return eval_only(args, ctx)
    if args.mode == "play":
        return play(args, ctx)
    print(f"run directory: {ctx['run_dir']}")
    if ctx.get("finished"):
        print(f"{ctx['run_dir']} holds a finished run (results.json); nothing to do")
        return None
    with stop_on_signals():  # a signal during the set-up is kept in STOP: the run stops at its first step
        setup_run(args, ctx)
        try:
            modules, state = build_modules(args, ctx)
        except (RuntimeError, KeyError) as e:  # a checkpoint of other network shapes (another version of this file)
            raise UsageError(
                f"a saved network ({ctx['run_dir']}/checkpoints/state.pt or --world-model) does not fit this "
                f"script's networks ({type(e).__name__}): pass a new --run-dir or another world model"
            ) from None
    return ctx, state, modules


def resolve_env_id(env_id: str) -> tuple[str, float]:
    """'PongNoFrameskip-v4' / 'ALE/Pong-v5' -> (ale-py ROM name, default sticky-action probability)."""
    from ale_py import roms

    known = roms.get_all_rom_ids()
    m = re.fullmatch(r"(ALE/)?([A-Za-z0-9]+?)(NoFrameskip-v4|-v5)", env_id)
    if m and (m.group(1) is None) == (m.group(3) == "NoFrameskip-v4"):
        rom = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(2)).lower()
        if rom in known:
            return rom, 0.25 if m.group(3) == "-v5" else 0.0
    camel = ["".join(p.capitalize() for p in r.split("_")) for r in known]
    ids = [f"{c}NoFrameskip-v4" for c in camel] + [f"ALE/{c}-v5" for c in camel]
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "this script takes Atari ids like PongNoFrameskip-v4"
    raise UsageError(f"unknown Atari env id {env_id!r}: {hint}")


def validate(args: Args) -> dict:
    """Every check that can fail on user input, before anything is created. Returns what it loaded."""
    for name, value in numeric_fields(args):
        lo, hi = LIMITS[name]
        if not (math.isfinite(value) and lo <= value <= hi):
            raise UsageError(f"--{name.replace('_', '-')} must be in [{lo}, {hi}] (got {value})")
    if not args.exp_name or "/" in args.exp_name or args.exp_name in (".", ".."):  # a part of the run dir's name
        raise UsageError("--exp-name must be a non-empty name without '/' (and not '.' or '..')")
    empty = [name for name in ("run_dir", "eval_only", "world_model") if getattr(args, name) == ""]
    if empty:  # ("" would mean: the default run dir, training instead of an evaluation, no world model)
        raise UsageError(f"--{empty[0].replace('_', '-')} is empty: pass a path")
    if args.wm.filter_double_steps > args.wm.compress_steps:
        raise UsageError("--wm.filter-double-steps must be <= --wm.compress-steps")
    grid = args.eval.grid_temperatures + args.eval.grid_noops
    if not grid or not all(math.isfinite(v) and 0 <= v <= 10_000 for v in grid) or not args.eval.grid_noops:
        raise UsageError("--eval.grid-temperatures and --eval.grid-noops need values in [0, 10000]")
    if args.wm.bits % BitPrior.GROUP:
        raise UsageError(f"--wm.bits must be a multiple of {BitPrior.GROUP} (got {args.wm.bits})")
    if args.eval_only:
        return validate_eval_only(args)
    if args.eval.policy != "trained":
        raise UsageError("--eval.policy uniform-random is for --eval-only RUN_DIR (the random baseline in its envs)")
    rom, sticky_default = resolve_env_id(args.env_id)
    sticky = sticky_default if args.env.sticky_actions < 0 else args.env.sticky_actions
    if args.mode == "play":
        if not args.world_model:
            raise UsageError("--mode play needs --world-model PATH (a world_model.pt of this script)")
        ck = check_world_model(args.world_model, args, rom, check_type=False)
        return {"rom": rom, "sticky": sticky, "world_model_ck": ck}
    schedule = real_steps_schedule(args.loop.real_steps, args.loop.epochs, args.env.num_envs)
    if args.mode == "model-free" and schedule["total"] < args.env.num_envs * args.ppo.num_steps:
        raise UsageError("model-free: fewer real steps than one rollout: raise --loop.real-steps")
    if args.mode != "model-free" and schedule["per_env"] < STACK + args.wm.target_frames:
        raise UsageError(
            f"{schedule['per_env']} real steps per env per collection cannot hold a training sequence of "
            f"{STACK + args.wm.target_frames} frames: raise --loop.real-steps or lower --env.num-envs"
        )
    if args.mode != "model-free" and args.ppo.minibatch_steps > args.ppo.num_steps:
        raise UsageError("--ppo.minibatch-steps must be <= --ppo.num-steps")
    default = f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    flag = "--run-dir" if args.run_dir else "--exp-name (in the default run directory)"
    run_dir = check_path_length(Path(args.run_dir or default), flag)
    ctx = {"rom": rom, "sticky": sticky, "schedule": schedule, "run_dir": run_dir}
    check_run_dir(args, ctx)
    if args.world_model:
        if args.mode != "simple":
            raise UsageError("--world-model is for --mode simple or play")
        ctx["world_model_ck"] = check_world_model(args.world_model, args, rom)
    return ctx


def check_path_length(path: Path, flag: str) -> Path:
    """The path, or a UsageError when the file system cannot hold it (255 bytes a name, 4095 a path, as on Linux)."""
    if any(len(os.fsencode(part)) > 255 for part in path.parts) or len(os.fsencode(str(path.absolute()))) > 4095:
        limits = "255 bytes a name, 4095 a path"
        raise UsageError(f"{flag} {str(path)[:60]}... is too long for the file system ({limits}): shorten it")
    return path


def check_run_dir(args: Args, ctx: dict):
    run_dir = ctx["run_dir"]
    saved = run_dir / "args.json"
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file: pass a directory")
    if saved.exists():
        try:
            old = json.loads(saved.read_text())
        except (OSError, ValueError):
            raise UsageError(f"{saved} is unreadable: delete it or pass a new --run-dir") from None
        if old.get("script") != SCRIPT:
            raise UsageError(f"{run_dir} was made by {old.get('script')!r}, not this script: pass a new --run-dir")
        if old.get("env_id") != args.env_id or old.get("mode") != args.mode:
            raise UsageError(f"{run_dir} is a {old.get('mode')} run on {old.get('env_id')}: pass a new --run-dir")
        if (run_dir / "results.json").exists():
            refuse_changed_flags(run_dir, old, args)
        changed = [k for k in ARCHITECTURE if old.get("wm", {}).get(k) != getattr(args.wm, k)]
        if changed:
            raise UsageError(
                f"{run_dir} was trained with other --wm.{changed[0].replace('_', '-')}: resume with "
                "the same world-model settings or pass a new --run-dir"
            )
        ctx["finished"] = (run_dir / "results.json").exists()
        state_file = run_dir / "checkpoints" / "state.pt"
        fix = "delete it to restart the run's training"
        ctx["resume"] = None  # a finished run is not resumed, so its checkpoint is not read
        if state_file.exists() and not ctx["finished"]:
            ctx["resume"] = load(state_file, "checkpoint", fix)
            check_saved_networks_fit(args, ctx)
        ctx["data"] = load_collections(run_dir)
    probe = run_dir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the run dir {run_dir} ({probe} is not writable): pass a writable --run-dir")


# settings that change nothing a finished run made (where it runs, how it logs, how it resumes)
RERUN_FREE = {"run_dir", "eval_only", "track", "wandb_project_name", "wandb_entity", "cuda"}
RERUN_FREE |= {"torch_threads", "checkpoint_every"}


def flat_settings(d: dict, prefix: str = ""):
    """("group.name", value) of every setting in a (nested) dict of args, as args.json holds them."""
    for key, value in d.items():
        if isinstance(value, dict):
            yield from flat_settings(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def refuse_changed_flags(run_dir: Path, saved: dict, args: Args):
    """A finished run re-run with flags that differ from its args.json (beside RERUN_FREE and the
    player's): UsageError naming each (a finished result is never redone or extended)."""
    old = dict(flat_settings(saved))
    now = dict(flat_settings(json.loads(json.dumps(asdict(args)))))
    diff, missing = [], object()
    for key, value in now.items():
        if key not in RERUN_FREE and not key.startswith("play.") and old.get(key, missing) != value:
            diff.append(f"--{key.replace('_', '-')} {value} (was {old.get(key)})")
    if diff:
        raise UsageError(
            f"{run_dir} holds a finished run made with other flags ({', '.join(diff)} against its "
            "args.json): re-run its own command (nothing to do), --eval-only it, or pass a new --run-dir"
        )


def check_saved_networks_fit(args: Args, ctx: dict):
    """The resume checkpoint's networks must load into this file's networks (another version may differ)."""
    saved = ctx["resume"]["modules"]
    num_actions = num_actions_of(ctx["rom"])
    nets = {"policy": Policy(num_actions, FRAME_SHAPE, args.ppo.dropout)}
    if args.mode != "model-free" and args.world_model is None:
        nets["model"] = WorldModel(num_actions, FRAME_SHAPE, args.wm)
    try:
        for name, net in nets.items():
            net.load_state_dict(saved[name])
    except (RuntimeError, KeyError):
        raise UsageError(
            f"{ctx['run_dir']}/checkpoints/state.pt holds networks that do not fit this file's "
            "(another version of the script?): pass a new --run-dir"
        ) from None


WORLD_MODEL_KEYS = {"env_id": str, "network": str, "num_actions": int, "frame_shape": list}
WORLD_MODEL_KEYS |= {"config": dict, "state_dict": dict}  # besides its tags (WorldModel.to_file)


def check_world_model(path: str, args: Args, rom: str, check_type: bool = True) -> dict:
    """--world-model checked like every artifact: readable, each key present with its type, the
    network and sizes of this script and game, every weight a finite float32 tensor of the shape
    its config's network needs."""
    fix = "pass a world_model.pt of this script"
    ck = load(path, "world_model", "pass a world_model.pt from a run dir of this script")
    for key, kind in WORLD_MODEL_KEYS.items():
        if not isinstance(ck.get(key), kind) or isinstance(ck.get(key), bool):
            raise UsageError(f"{path} has no valid {key!r} (a {kind.__name__}): {fix}")
    env_id = ck["env_id"]
    if env_id != args.env_id:
        other = f"{path} is a world model of {env_id}, not {args.env_id}"
        raise UsageError(f"{other}: pass --env-id {env_id}")
    n = num_actions_of(rom)
    sizes = (ck["network"], tuple(ck["frame_shape"]), ck["num_actions"])
    if sizes != ("WorldModel", FRAME_SHAPE, n):
        holds = f"{ck['network']!r} of frames {ck['frame_shape']} and {ck['num_actions']} actions"
        raise UsageError(f"{path} holds a {holds}, not a WorldModel of {FRAME_SHAPE}, {n}: {fix}")
    missing = {f.name for f in dataclasses.fields(WorldModelArgs)} - set(ck["config"])
    if missing:
        raise UsageError(f"{path}: its 'config' has no {sorted(missing)[0]!r}: {fix}")
    try:
        cfg = WorldModelArgs(**ck["config"])
    except TypeError:
        raise UsageError(f"{path}: its 'config' is not this script's --wm: {fix}") from None
    for f in dataclasses.fields(WorldModelArgs):
        value, (lo, hi) = getattr(cfg, f.name), f.metadata.get("range", (None, None))
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if lo is not None and not (number and math.isfinite(value) and lo <= value <= hi):
            raise UsageError(f"{path}: config[{f.name!r}] {value!r} is not in [{lo}, {hi}]: {fix}")
    if cfg.model not in ("stochastic-discrete", "deterministic") or cfg.bits % BitPrior.GROUP:
        raise UsageError(f"{path}: config holds model {cfg.model!r} and {cfg.bits} bits: {fix}")
    if check_type and cfg.model != args.wm.model:
        raise UsageError(f"{path} is a {cfg.model} world model: pass --wm.model {cfg.model}")
    weights = ck["state_dict"]
    for name, value in weights.items():
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            raise UsageError(f"{path}: state_dict[{name!r}] is not a float32 tensor: {fix}")
        if not torch.isfinite(value).all():
            raise UsageError(f"{path}: state_dict[{name!r}] holds NaN or inf weights: {fix}")
    try:
        expected = WorldModel(n, FRAME_SHAPE, cfg).state_dict()
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"{path}: its 'config' builds no WorldModel: {fix}") from None
    for name in sorted(expected.keys() | weights.keys()):
        want, got = (tuple(sd[name].shape) if name in sd else None for sd in (expected, weights))
        if want != got:
            raise UsageError(f"{path}: state_dict[{name!r}] is {got}, not {want}: {fix}")
    return ck


def load_collections(run_dir: Path) -> RealData:
    data = RealData()
    for path in sorted((run_dir / "data").glob("collection_*.npz")):
        ck = load(path, "collection", "delete it (and later collections) to collect it again")
        data.add({k: ck[k] for k in ("frames", "actions", "rewards", "dones")})
    return data


def load_policy(path, device="cpu") -> Policy:
    """policy.pt of this script -> the Policy in eval mode with .act(obs) and .env_config (for make_policy_envs)."""
    ck = load(path, "policy", "pass one of its run dirs")
    policy = Policy(**{**ck["config"], "frame_shape": tuple(ck["config"]["frame_shape"])})
    policy.load_state_dict(ck["state_dict"])
    policy.env_config = ck["env_config"]
    return policy.to(device).eval()


def validate_eval_only(args: Args) -> dict:
    run_dir = check_path_length(Path(args.eval_only), "--eval-only")
    path = run_dir / "policy.pt"
    if not path.exists():
        raise UsageError(f"{path} does not exist: pass --eval-only a run dir of this script that has a policy.pt")
    policy = load_policy(path)
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f"{run_dir} is not writable: evaluations/ goes there")
    return {"run_dir": run_dir, "policy": policy}


def eval_only(args: Args, ctx: dict):
    """--eval-only: the run's policy.pt in the real game (--eval.*, or the grid) -> evaluations/eval_NNN.json."""
    run_dir = ctx["run_dir"]
    out_dir = run_dir / "evaluations"
    taken = [int(p.stem[5:]) for p in out_dir.glob("eval_*.json") if p.stem[5:].isdigit()]
    n = max(taken, default=0) + 1  # eval_001.json first, as every script; nothing is overwritten
    cfg, policy = args.eval, ctx["policy"]
    if cfg.policy == "uniform-random":
        policy = UniformRandomPolicy(policy.config["num_actions"], policy.env_config, args.seed)
    video = run_dir / "videos" / f"eval_only_{n:03d}.webm" if args.capture_video else None
    pairs = [(cfg.temperature, cfg.noop_max)]
    if cfg.grid:
        pairs = [(t, k) for t in cfg.grid_temperatures for k in cfg.grid_noops]
    games = f" of at most {cfg.max_steps} steps" if cfg.max_steps else " (full games)"
    settings = f" at each of {len(pairs)} settings" if cfg.grid else ""
    what = "uniform-random actions (the random baseline)" if cfg.policy == "uniform-random" else run_dir / "policy.pt"
    print(f"evaluating {what}: {cfg.episodes} games{games}{settings}", flush=True)
    grid = []
    for i, (temperature, noops) in enumerate(pairs):
        first_video = video if i == 0 else None
        ev = evaluate_policy(
            policy, cfg.num_envs, cfg.episodes, temperature, noops, args.seed, first_video, cfg.max_steps
        )
        grid.append(ev)
        mean = ev.get("mean", float("nan"))
        print(f"eval T={temperature} max no-ops={noops}: {mean:.2f} over {cfg.episodes} games{games}")
    out = {**grid[0], "grid": grid} if cfg.grid else grid[0]
    out.update(env_id=policy.env_config["env_id"], seed=args.seed, episodes=cfg.episodes, policy=cfg.policy)
    if args.capture_video and cfg.policy == "trained" and (run_dir / "world_model.pt").exists():
        model = world_model_from(load(run_dir / "world_model.pt", "world_model", "pass a run dir of this script"))
        frames = model_vs_real_frames(model, policy, cfg.debug_steps, cfg.temperature, args.seed)
        write_video(frames, run_dir / "videos" / f"debug_model_real_diff_{n:03d}.webm")
        out["debug_video"] = f"videos/debug_model_real_diff_{n:03d}.webm"
    out_dir.mkdir(exist_ok=True)
    write_json(out_dir / f"eval_{n:03d}.json", out)
    print(f"-> {out_dir}/eval_{n:03d}.json")


class UniformRandomPolicy:
    """The random baseline: uniform actions, played through evaluate_policy in a trained policy's envs."""

    def __init__(self, num_actions: int, env_config: dict, seed: int):
        self.config, self.env_config = {"num_actions": num_actions}, env_config
        self.rng = np.random.default_rng(seed)

    def eval(self):
        return self

    def act(self, obs, temperature: float = 1.0):
        return self.rng.integers(0, self.config["num_actions"], size=len(obs))


@torch.no_grad()
def model_vs_real_frames(model: WorldModel, policy: Policy, steps: int, temperature: float, seed: int):
    """The evaluator's debug video: the policy plays the real game while the model, started from the same real
    stack, runs open loop on the same actions. Frames: [model | real | max(|model - real| - 10, 0)]."""
    c = policy.env_config
    envs = make_envs(c["rom"], 1, c["sticky"], 0, c["max_episode_frames"])
    obs, _ = envs.reset(seed=seed)
    sim = SimulatedEnv(model.eval(), 0.0, 1.0)
    sim.reset(torch.as_tensor(obs))
    frames = []
    for _ in range(steps):
        action = policy.act(obs, temperature)
        obs, _, term, trunc, _ = envs.step(action)
        stack, _, _ = sim.step(torch.as_tensor(action))
        model_frame, real_frame = stack[0, -1].numpy(), obs[0, -1]
        diff = np.clip(np.abs(model_frame.astype(np.int16) - real_frame.astype(np.int16)) - 10, 0, 255)
        frames.append(np.concatenate([model_frame, real_frame, diff.astype(np.uint8)], axis=1))
        if term[0] or trunc[0]:
            break
    envs.close()
    return frames


KEY_MEANINGS = {"w": "UP", "s": "DOWN", "a": "LEFT", "d": "RIGHT", " ": "FIRE", "n": "NOOP"}


def key_action(key: Optional[str], meanings: list[str]) -> int:
    """A key -> the index of the game's action of that meaning (w/s/a/d = UP/DOWN/LEFT/RIGHT, space = FIRE);
    a key the game has no action for, or none, is NOOP (index 0)."""
    meaning = KEY_MEANINGS.get(key or "n", "NOOP")
    return meanings.index(meaning) if meaning in meanings else 0


def player_image(model_frame, real_frame, texts: list[str], wait: bool, zoom: int) -> np.ndarray:
    """Three columns [model | real | max(|model - real| - 10, 0)], zoomed, under a 27-px header per column
    (green while the wait mode is on, red when off)."""
    import cv2

    diff = np.clip(np.abs(model_frame.astype(np.int16) - real_frame.astype(np.int16)) - 10, 0, 255).astype(np.uint8)
    columns = []
    for frame, text in zip((model_frame, real_frame, diff), texts):
        big = cv2.resize(frame, (frame.shape[1] * zoom, frame.shape[0] * zoom), interpolation=cv2.INTER_NEAREST)
        header = np.zeros((27, big.shape[1], 3), np.uint8)
        header[:] = (0, 160, 0) if wait else (160, 0, 0)
        cv2.putText(header, text, (3, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * max(1, zoom / 2), (255, 255, 255), 1)
        columns.append(np.concatenate([header, big]))
    return np.concatenate(columns, axis=1)


def play(args: Args, ctx: dict):
    """The player: a person plays the world model with the keyboard while the real game gets the same actions.
    w/a/s/d/space act, n = NOOP, x = restart the model from the real game's current frames, r = reset both,
    c = wait mode on/off, q or Esc = quit."""
    import cv2

    cfg, model, meanings = args.play, world_model_from(ctx["world_model_ck"]), action_meanings(ctx["rom"])
    envs = make_envs(ctx["rom"], 1, ctx["sticky"], 0, args.env.max_episode_frames)
    obs, _ = envs.reset(seed=args.seed)
    sim = SimulatedEnv(model, args.wm.pixel_temperature, args.wm.latent_temperature)
    sim_obs = sim.reset(torch.as_tensor(obs))
    scripted = iter(cfg.keys) if cfg.keys is not None else None
    wait, totals, last, steps = cfg.wait, [0.0, 0.0], [0.0, 0.0], 0
    while True:
        texts = [f"model c:{totals[0]:.0f} r:{last[0]:.0f}", f"real c:{totals[1]:.0f} r:{last[1]:.0f}", f"fc:{steps}"]
        image = player_image(sim_obs[0, -1].numpy(), obs[0, -1], texts, wait, cfg.zoom)
        if scripted is None:
            cv2.imshow(f"{args.env_id}: model | real | difference", image[:, :, ::-1])
            code = cv2.waitKey(0 if wait else max(1, 1000 // cfg.fps))
            key = None if code < 0 else ("q" if code == 27 else chr(code & 0xFF).lower())
        else:
            key = next(scripted, "q")
        if key == "q":
            break
        if key == "c":
            wait = not wait
        elif key == "x":
            sim_obs = sim.reset(torch.as_tensor(obs))
        elif key == "r":
            obs, _ = envs.reset()
            sim_obs, totals, steps = sim.reset(torch.as_tensor(obs)), [0.0, 0.0], 0
        elif key is not None or not wait:
            action = key_action(key, meanings)
            obs, reward, term, trunc, _ = envs.step(np.array([action]))
            sim_obs, sim_reward, _ = sim.step(torch.tensor([action]))
            last = [float(sim_reward[0]), float(reward[0])]
            totals = [totals[0] + last[0], totals[1] + last[1]]
            steps += 1
            if term[0] or trunc[0]:  # the real game is over: it restarted, so does the model
                sim_obs = sim.reset(torch.as_tensor(obs))
    envs.close()
    if scripted is None:
        cv2.destroyAllWindows()
    if cfg.screenshot:
        cv2.imwrite(cfg.screenshot, image[:, :, ::-1])
    print(f"played {steps} steps: model total {totals[0]:.0f}, real total {totals[1]:.0f}")


def world_model_from(ck: dict) -> WorldModel:
    model = WorldModel(ck["num_actions"], tuple(ck["frame_shape"]), WorldModelArgs(**ck["config"]))
    model.load_state_dict(ck["state_dict"])
    return model.eval()


def setup_run(args: Args, ctx: dict):
    run_dir = ctx["run_dir"]
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "data").mkdir(exist_ok=True)
    for stale in run_dir.rglob("*.tmp"):
        stale.unlink()
    write_json(run_dir / "args.json", {"script": SCRIPT, **asdict(args)})
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    ctx["device"] = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    fast_bf16 = (
        torch.cuda.is_bf16_supported()
        if ctx["device"].type == "cuda"
        else torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    )
    ctx["bf16"] = args.precision == "bf16" or (args.precision == "auto" and fast_bf16)
    ctx["rng"] = np.random.default_rng(args.seed)
    ctx.setdefault("data", RealData())
    ctx["checkpoint_every"] = args.checkpoint_every
    ctx["env_config"] = {"env_id": args.env_id, "rom": ctx["rom"], "sticky": ctx["sticky"]}
    ctx["env_config"].update(noop_max=args.env.noop_max, max_episode_frames=args.env.max_episode_frames)
    if args.track:
        import wandb

        names = {"project": args.wandb_project_name, "entity": args.wandb_entity, "name": run_dir.name}
        wandb.init(**names, config=asdict(args), sync_tensorboard=True, save_code=True, resume="allow")
    from torch.utils.tensorboard import SummaryWriter

    ctx["writer"] = SummaryWriter(str(run_dir))


def action_meanings(rom: str) -> list[str]:
    from ale_py import ALEInterface, LoggerMode, roms

    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.loadROM(roms.get_rom_path(rom))
    return [str(a).split(".")[-1] for a in ale.getMinimalActionSet()]


@functools.lru_cache(maxsize=None)
def num_actions_of(rom: str) -> int:
    return len(action_meanings(rom))


def build_modules(args: Args, ctx: dict):
    device, num_actions = ctx["device"], num_actions_of(ctx["rom"])
    policy = Policy(num_actions, FRAME_SHAPE, args.ppo.dropout).to(device)
    policy.env_config = ctx["env_config"]
    ppo_opt = torch.optim.Adam(policy.parameters(), lr=args.ppo.learning_rate, betas=(0.85, 0.997), eps=1e-6)
    modules = {"policy": policy, "ppo_opt": ppo_opt}
    if args.mode != "model-free":
        wm_cfg = WorldModelArgs(**ctx["world_model_ck"]["config"]) if args.world_model else args.wm
        model = WorldModel(num_actions, FRAME_SHAPE, wm_cfg).to(device)
        model.bf16 = ctx["bf16"]
        if args.world_model:
            model.load_state_dict(ctx["world_model_ck"]["state_dict"])
        opt = make_wm_optimizer(model, args.wm)
        warmup = args.wm.warmup_steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        modules.update(model=model, wm_opt=opt, wm_sched=sched)
    ctx["modules"] = modules
    state = {"epoch": 0, "phase": 0, "phase_step": 0, "wm_step": 0, "ppo_iter": 0, "real_steps": 0, "history": []}
    ck = ctx.get("resume")
    if ck is not None:
        state = ck["state"]
        for name, module in modules.items():
            module.load_state_dict(ck["modules"][name])
        set_rng_states(ck["rng"], ctx)
        print(f"resuming at epoch {state['epoch']}, phase {state['phase']}, step {state['phase_step']}")
    return modules, state


def end_phase(state: dict, phases: tuple, ctx: dict, modules: dict):
    """Marks the phase done (the next epoch after the last phase), saves the resume state, redraws the curve."""
    state["phase"] += 1
    state["phase_step"] = 0
    if state["phase"] == len(phases):
        state["phase"], state["epoch"] = 0, state["epoch"] + 1
    save_state(ctx, state, modules)
    plot_learning_curve(state["history"], ctx["run_dir"] / "learning_curve.png", ctx["env_config"]["env_id"])
    write_learning_curve_csv(state["history"], ctx["run_dir"] / "learning_curve.csv")


def checkpoint(ctx: dict, state: dict, step: int):
    """A pending SIGINT/SIGTERM stops the phase (SignalGuard saves the state); every checkpoint_every steps save it."""
    if STOP["signal"]:
        raise Interrupted(f"signal {STOP['signal']}")
    if step % ctx["checkpoint_every"] == 0:
        save_state(ctx, state, ctx["modules"])


def save_state(ctx: dict, state: dict, modules: dict):
    ctx["modules"] = modules
    states = {k: m.state_dict() for k, m in modules.items()}
    save(ctx["run_dir"] / "checkpoints" / "state.pt", "checkpoint", state=state, modules=states, rng=rng_states(ctx))


def load(path, kind: str, fix: str) -> dict:
    """The one load: what `save` wrote, or a UsageError naming the file and the fix when it is unreadable or not
    a `kind` of this script's current format."""
    try:
        if Path(path).suffix == ".npz":
            with np.load(path) as z:
                ck = {k: z[k] for k in z.files}
            ck.update({k: ck[k].item() for k in ("script", "kind", "version") if k in ck})
        else:
            ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 -- any unreadable file is the same user error
        ck = None
    tag = ck if isinstance(ck, dict) else {}
    if (tag.get("script"), tag.get("kind")) != (SCRIPT, kind) or tag.get("version") not in READABLE_VERSIONS[kind]:
        raise UsageError(f"cannot read {path} as a {kind} file of this script's version: {fix}")
    return ck


def write_json(path: Path, obj):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def rng_states(ctx: dict) -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": ctx["rng"].bit_generator.state,
    }


def set_rng_states(states: dict, ctx: dict):
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    ctx["rng"].bit_generator.state = states["generator"]


@contextlib.contextmanager
def redone_on_resume(ctx: dict):
    """A step that a signal may cut short (Interrupted): the RNG states go back to the step's start,
    so the state saved is the one before it and the resumed run redoes it as an unbroken run."""
    saved = rng_states(ctx)
    try:
        yield
    except Interrupted:
        set_rng_states(saved, ctx)
        raise


@contextlib.contextmanager
def stop_on_signals():
    """While inside, SIGINT/SIGTERM set STOP (the running loop stops at its next step)."""
    STOP["signal"] = 0
    old = {s: signal.signal(s, SignalGuard._stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class SignalGuard:
    """SIGINT/SIGTERM set STOP; the running phase stops at its next step (Interrupted) and the state is saved here.
    On the way out the real envs and the writer are closed."""

    def __init__(self, ctx: dict, state: dict, modules: dict):
        self.ctx, self.state, self.modules = ctx, state, modules

    def __enter__(self):  # (STOP keeps a signal that came during the set-up, see start_run)
        self.old = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _stop(signum, _frame):
        STOP["signal"] = signum

    def __exit__(self, exc_type, *_):
        for s, h in self.old.items():
            signal.signal(s, h)
        if exc_type is Interrupted:
            save_state(self.ctx, self.state, self.modules)
        self.ctx["writer"].close()
        if self.ctx.get("real"):
            self.ctx["real"]["envs"].close()


def finish(args: Args, ctx: dict, state: dict, result: dict):
    result.update(env_id=args.env_id, mode=args.mode, seed=args.seed, device=str(ctx["device"]))
    result.update(schedule=ctx["schedule"], world_model_steps=state["wm_step"], ppo_iterations=state["ppo_iter"])
    result.update(paper_simple_sd_long=PAPER_SIMPLE.get(ctx["rom"]))
    write_json(ctx["run_dir"] / "results.json", result)
    print(f"run directory: {ctx['run_dir']}")


def write_video(frames: list, path: Path, scale: int = 4, fps: int = 15):
    """RGB frames -> VP9 WebM (browser-playable) through opencv's VP90 writer."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"VP90"), fps, (w * scale, h * scale))
    for f in frames:
        writer.write(cv2.resize(f[:, :, ::-1], (w * scale, h * scale), interpolation=cv2.INTER_NEAREST))
    writer.release()


def write_strip(run_dir: Path, strip, env_id: str, epoch: int, steps: int = 10, scale: int = 2):
    """wm_strip.png: rows real / predicted (open loop from real frames) / |difference|, the first `steps` steps."""
    if strip is None:
        return
    import cv2

    real, pred = strip
    idx = np.unique(np.linspace(0, len(real) - 1, min(steps, len(real))).astype(int))
    diff = np.abs(real[idx].astype(np.int16) - pred[idx].astype(np.int16)).astype(np.uint8)
    rows = [np.concatenate(list(x), axis=1) for x in (real[idx], pred[idx], diff)]
    img = np.concatenate(rows, axis=0)
    img = cv2.resize(img, (img.shape[1] * scale, img.shape[0] * scale), interpolation=cv2.INTER_NEAREST)
    header = np.full((24, img.shape[1], 3), 255, np.uint8)
    title = f"{env_id} epoch {epoch}: real / predicted / diff, steps {idx[0] + 1}..{idx[-1] + 1}"
    cv2.putText(header, title, (4, 17), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1)
    ok, png = cv2.imencode(".png", np.concatenate([header, img])[:, :, ::-1])
    tmp = run_dir / "wm_strip.png.tmp"
    tmp.write_bytes(png.tobytes())
    os.replace(tmp, run_dir / "wm_strip.png")


def learning_curve_rows(history: list) -> list[dict]:
    """One flat row per epoch: world-model steps, open-loop errors (eval_*: model and copy per horizon), the last
    simulated return, the real score (mean, std, games) and the real steps so far; blank where not reached."""
    rows = []
    for h in history:
        row = {k: h.get(k) for k in ("epoch", "world_model_steps", "ppo_iterations", "real_steps")}
        row.update({f"wm_{k}": v for k, v in (h.get("world_model") or {}).items()})
        ev = h.get("eval") or {}
        row.update(sim_return=h.get("sim_return"), collect_rewards=h.get("collect_rewards"))
        row.update(eval_mean=ev.get("mean"), eval_std=ev.get("std"), eval_games=len(ev["returns"]) if ev else None)
        shares = ev.get("action_shares")
        row["eval_action_shares"] = " ".join(f"{x:.3f}" for x in shares) if shares else None
        rows.append(row)
    return rows


def write_learning_curve_csv(history: list, path: Path):
    import csv
    import io

    rows = learning_curve_rows(history)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.getvalue())
    os.replace(tmp, path)


def plot_learning_curve(history: list, path: Path, env_id: str):
    """Two panels: world-model open-loop frame error vs the copy baseline; real score and in-model return."""
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    wm = [(h["epoch"], h["world_model"]) for h in history if h.get("world_model")]
    if wm:
        hz = wm[-1][1]["horizon"]
        ax1.plot([e for e, _ in wm], [m.get(f"frame_mse_{hz}") for _, m in wm], "o-", label=f"model, {hz} steps")
        ax1.plot([e for e, _ in wm], [m.get(f"copy_frame_mse_{hz}") for _, m in wm], "s--", label="copy last frame")
        ax1.legend(fontsize=7)
    ax1.set(xlabel="epoch", ylabel="open-loop frame MSE (log)", yscale="log", title="world model (held-out real play)")
    ev = [(h.get("real_steps"), h["eval"]["mean"]) for h in history if h.get("eval")]
    if ev:
        ax2.plot([s for s, _ in ev], [m for _, m in ev], "o-", label="real score (full games)")
        ax2.plot(ev[-1][0], ev[-1][1], "r*", ms=12, label="final evaluation")
        ax2.legend(fontsize=7)
    ax2.set(xlabel="real agent steps", ylabel="score", title="policy")
    fig.suptitle(env_id, fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def parse_args(argv: Optional[list[str]] = None) -> Args:
    """tyro.cli; a flag it rejects exits 2 with one line naming it. tyro hands the rejection to a hook before it
    prints anything (the flag, the reason), so its printed box is never parsed; --help still prints and exits 0."""
    try:
        from tyro._errors import on_parse_error  # tyro's (experimental) parse-error hook
    except ImportError:  # a tyro without it prints its own box, also with exit code 2
        on_parse_error = lambda hook: contextlib.nullcontext()  # noqa: E731

    def one_line(event):  # raising here replaces tyro's box
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

    try:
        with on_parse_error(one_line):
            return tyro.cli(Args, args=argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(parse_args())
