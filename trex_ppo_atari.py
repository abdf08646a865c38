"""T-REX on Atari: the whole pipeline (demonstrator -> ranked demos -> learned reward -> PPO -> evaluation) in one file.

T-REX learns a state-only reward r̂(s) from a handful of *ranked*, suboptimal demonstrations with a
Bradley-Terry loss on snippet pairs (the better demo's snippet must get the larger summed reward), then
trains PPO on sigmoid(r̂(s')) alone. Because r̂ only has to explain the ranking, the policy can beat the
best demonstration. Paper: Brown, Goo, Nagarajan, Niekum (2019), "Extrapolating Beyond Suboptimal
Demonstrations via Inverse Reinforcement Learning from Observations", ICML (arXiv 1904.06387).

Defaults follow the official Atari code (hiwonjoon/ICML2019-TREX: reward net, masks, 6000 offline pairs,
snippets of 50-100 observations with stride 2, Adam 5e-5, sigmoid reward on the post-step observation)
and CleanRL's ppo_atari.py for PPO. Deliberate differences (see docs/trex_ppo_atari.md): snippet length
50-100 *inclusive* (the reference's randint excludes 100), pairs of demos with *equal* returns are never
made, validation pairs with early stopping, the reward at an episode end is computed on the true final
observation (not the auto-reset frame), and demos store every frame once.

Usage:
    python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4            # full pipeline, paper budgets
    python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \\
        --demo-total-timesteps 8192 --policy-total-timesteps 8192 --reward-num-pairs 300 \\
        --reward-epochs 1 --eval-episodes 2 --max-episode-frames 4000   # all 5 phases, minutes on a laptop CPU
    python trex_ppo_atari.py ... --run-dir runs/X        # re-run with the same run dir: resumes phase + checkpoint
    python trex_ppo_atari.py ... --run-dir runs/Y --policy-total-timesteps N   # Y: a copy of a finished run dir
                                                         # without results.json: the policy phase trains on to N
    python trex_ppo_atari.py --demos my_demos.npz        # own demos (skips phases 1-2), format: see load_demos
    python trex_ppo_atari.py --reward-model runs/X/reward_model.pt   # skips phase 3
    python trex_ppo_atari.py ... --stop-after reward     # stop after a phase (re-run later to continue)

Run directory: args.json, events.out.tfevents.* (reward/policy/eval; the demonstrator's in demonstrator/),
demonstrator/ckpt_XXXXX.pt (policy snapshots of rising quality), demos.npz + demos_table.md,
reward_model.pt + reward_pred_vs_true.png, checkpoints/{demonstrator,policy}.pt (resume state),
learning_curve.png, videos/ (--capture-video), results.json (demo stats, reward correlations, evaluation).
"""


import ctypes
import difflib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

# tensorboard, matplotlib, scipy, tqdm, cv2 and ale_py are imported inside the functions that use them, so
# that importing this file (tests) and rejecting bad input (exit 2) stay fast.


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use the GPU when one is available (falls back to the CPU)"""
    track: bool = False
    """log to Weights and Biases as well (needs wandb installed)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record the first evaluation episode (the agent's 84x84 view, upscaled) to run_dir/videos/"""
    torch_threads: int = 0
    """CPU threads for torch (0 = torch's default: all cores, or OMP_NUM_THREADS). On a quiet 2-core CPU the
    default ran the policy phase at 252 SPS vs 150 with 1 thread; on a CPU shared with other jobs use 1:
    oversubscribed OpenMP threads made the CNN ~38x slower on our busy 2-core machine"""

    # Pipeline
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium-style Atari id (BreakoutNoFrameskip-v4, ALE/Breakout-v5)"""
    run_dir: Optional[str] = None
    """run directory (default runs/{env_id}__{exp_name}__{seed}__{time}); an existing one is resumed"""
    demos: Optional[str] = None
    """npz of your own demonstrations (skips phases 1-2); format in `load_demos`"""
    reward_model: Optional[str] = None
    """a reward_model.pt saved by this script (skips phase 3, and phases 1-2 unless --demos is given)"""
    stop_after: Optional[Literal["demonstrator", "demos", "reward", "policy"]] = None
    """stop after this phase; re-running with the same --run-dir continues"""
    checkpoint_every: int = 10
    """PPO iterations between resume checkpoints (also saved at the end and on SIGINT/SIGTERM)"""

    # Environment (ale_py.vector_env.AtariVectorEnv, every semantic choice explicit)
    sticky_actions: float = -1.0
    """repeat_action_probability; -1 = 0.0 for *NoFrameskip-v4, 0.25 for ALE/*-v5"""
    noop_max: int = 30
    """up to this many no-ops at every reset"""
    max_episode_frames: int = 108_000
    """emulator frames per game before truncation (27,000 agent steps)"""
    episodic_life: bool = True
    """PPO phases: a lost life ends the learner's episode (the game itself goes on; scores are full games)"""

    # PPO (both the demonstrator and the T-REX policy; CleanRL ppo_atari.py / baselines ppo2 atari defaults)
    num_envs: int = 8
    """parallel environments"""
    num_steps: int = 128
    """steps per environment per rollout"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over the phase"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs per rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.1
    """PPO clip range (also used for the value clip)"""
    clip_vloss: bool = True
    """clipped value loss"""
    ent_coef: float = 0.01
    """entropy bonus"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """gradient-norm clip"""
    target_kl: Optional[float] = None
    """stop the epochs early above this approximate KL"""

    # Phase 1: demonstrator (PPO on the true, clipped reward)
    demo_total_timesteps: int = 10_000_000
    """demonstrator budget in agent steps (stops earlier at the return ceiling)"""
    demo_return_ceiling: Optional[float] = None
    """stop the demonstrator once its recent mean score reaches this; default: the paper's best demo (8 games)"""
    demo_ceiling_window: int = 20
    """number of recent training games averaged for the ceiling test"""
    demo_snapshot_every: int = 0
    """save a demonstrator snapshot every N iterations (0 = about 50 over the budget)"""

    # Phase 2: demonstrations
    demos_num_checkpoints: int = 12
    """snapshots (of increasing training time) to draw demos from"""
    demos_episodes_per_checkpoint: int = 1
    """stochastic full games per snapshot (the paper: 1)"""

    # Phase 3: reward learning
    mask_top: int = -1
    """rows hidden at the top of every frame (score/lives); -1 = the game's default (see SCORE_MASKS)"""
    mask_bottom: int = -1
    """rows hidden at the bottom of every frame; -1 = the game's default"""
    reward_sampling: Literal["offline", "live"] = "offline"
    """offline: the paper's fixed set of pairs; live: fresh fixed-length pairs every step (the seed's variant)"""
    reward_num_pairs: int = 6000
    """offline training pairs"""
    reward_epochs: int = 5
    """passes over the offline pairs (paper: 5 x 6000 = 30,000 steps)"""
    reward_live_steps: int = 30_000
    """optimiser steps with live sampling"""
    reward_min_len: int = 50
    """shortest snippet, in observations (capped by the shortest demo)"""
    reward_max_len: int = 100
    """longest snippet, inclusive (capped by the shortest demo)"""
    reward_live_len: int = 50
    """fixed snippet length with live sampling"""
    reward_stride: int = 2
    """keep every k-th observation inside a snippet (live sampling: 1)"""
    reward_batch_size: int = 1
    """pairs per optimiser step (paper: 1; live sampling: 16 is the seed's choice)"""
    reward_lr: float = 5e-5
    """Adam learning rate of the reward net"""
    reward_weight_decay: float = 0.0
    """Adam weight decay of the reward net"""
    reward_val_fraction: float = 0.1
    """extra held-out pairs (as a fraction of the training pairs) for validation accuracy"""
    reward_eval_every: int = 500
    """optimiser steps between validations"""
    reward_patience: int = 10
    """stop after this many validations without a better accuracy (keeps the best model)"""

    # Phase 4: PPO on the learned reward
    policy_total_timesteps: int = 12_500_000
    """agent steps (the paper's 50M frames at frameskip 4)"""
    policy_reward: Literal["sigmoid", "raw", "normalized", "env"] = "sigmoid"
    """sigmoid(r̂(s')) as the paper; raw r̂; r̂ normalised by running stats; env = clipped true reward (ablation)"""

    # Phase 5: evaluation
    eval_seeds: list[int] = field(default_factory=lambda: [1234, 12345, 123456])
    """evaluation seeds (the paper: best mean over 3 seeds x 30 games)"""
    eval_episodes: int = 30
    """full games per seed (stochastic policy)"""
    eval_num_envs: int = 8
    """parallel environments for evaluation and nothing else"""

    # to be filled in runtime
    batch_size: int = 0
    """computed at runtime: num_envs * num_steps"""
    minibatch_size: int = 0
    """computed at runtime: batch_size // num_minibatches"""


PAPER_BREAKOUT = {"best_demo": 32.0, "average_demo": 14.5, "trex": 221.3}

# Rows of the 84x84 frame hidden from the reward net (top, bottom): hiwonjoon/ICML2019-TREX trex_utils.py.
SCORE_MASKS = {
    "space_invaders": (10, 0), "breakout": (10, 0), "pong": (10, 0), "beam_rider": (16, 11), "enduro": (0, 14),
    "hero": (0, 30), "qbert": (12, 0), "seaquest": (12, 16), "ms_pacman": (0, 15), "video_pinball": (15, 0),
    "montezuma_revenge": (10, 0),
}
DEFAULT_MASK = (10, 0)  # other games: the top 10 rows (msinto93's choice for every game); check with a frame!

# The paper's best-demo scores: the demonstrator stops once it is this good (demos stay suboptimal).
PAPER_BEST_DEMO = {
    "beam_rider": 1332.0, "breakout": 32.0, "enduro": 84.0, "hero": 13235.0, "pong": -6.0, "qbert": 800.0,
    "seaquest": 600.0, "space_invaders": 600.0,
}
MIN_DEMOS, MIN_DEMO_LEN = 2, 10


class InputError(Exception):
    """Bad input: main prints the one-line message and exits 2 before any work."""


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; the phase saved what it could."""


STOP = {"signal": 0}


def _request_stop(signum, _frame):
    STOP["signal"] = signum


# ---------------------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------------------
def rom_to_camel(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


def resolve_env_id(env_id: str) -> tuple[str, float]:
    """Gymnasium Atari id -> (ale-py ROM name, default sticky-action probability). Raises InputError."""
    from ale_py import roms

    all_roms = roms.get_all_rom_ids()
    m = re.fullmatch(r"(ALE/)?([A-Za-z0-9]+?)(NoFrameskip-v4|-v5)", env_id)
    if m:
        rom = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(2)).lower()
        if rom in all_roms:
            return rom, 0.25 if m.group(3) == "-v5" else 0.0
    known = [f"{rom_to_camel(r)}NoFrameskip-v4" for r in all_roms] + [f"ALE/{rom_to_camel(r)}-v5" for r in all_roms]
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "use e.g. BreakoutNoFrameskip-v4 or ALE/Breakout-v5"
    raise InputError(f"unknown Atari env id {env_id!r}: {hint}")


def make_envs(rom: str, num_envs: int, sticky: float, args: Args, life_loss: bool):
    """AtariVectorEnv with explicit semantics: 84x84 gray, 4-stack, frameskip 4 with max-pool, no reward clipping
    (the learner clips and the true score is logged), same-step autoreset (the final observation is in
    info["final_obs"]). `life_loss` ends the learner's episode at a lost life *without* resetting the game
    (ale-py's episodic_life=True resets the whole game at every lost life, so it is not used)."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        rom, num_envs, repeat_action_probability=sticky, reward_clipping=False, episodic_life=False,
        life_loss_info=life_loss, noop_max=args.noop_max, max_num_frames_per_episode=args.max_episode_frames,
        autoreset_mode="SameStep", use_fire_reset=True, full_action_space=False, stack_num=4, frameskip=4,
        img_height=84, img_width=84, grayscale=True, maxpool=True,
    )


def fire_action(rom: str) -> Optional[int]:
    """Index of FIRE in the game's minimal action set when it is action 1 of >= 3 (FireResetEnv's rule), else None."""
    from ale_py import ALEInterface, LoggerMode, roms

    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.loadROM(roms.get_rom_path(rom))
    actions = [str(a).split(".")[-1] for a in ale.getMinimalActionSet()]
    return 1 if len(actions) >= 3 and actions[1] == "FIRE" else None


class GameTracker:
    """True game score and length per env, across life losses. A game is over when the env's episode frame
    counter restarts (same-step autoreset) -- with life_loss_info a termination may only be a lost life."""

    def __init__(self, num_envs: int):
        self.ret = np.zeros(num_envs)
        self.len = np.zeros(num_envs, dtype=np.int64)
        self.prev_frame = np.zeros(num_envs, dtype=np.int64)

    def step(self, reward, info) -> np.ndarray:
        self.ret += reward
        self.len += 1
        frame = info["episode_frame_number"].astype(np.int64)
        over = frame < self.prev_frame
        self.prev_frame = frame
        return over

    def pop(self, over: np.ndarray) -> list[tuple[float, int]]:
        games = [(float(self.ret[i]), int(self.len[i])) for i in np.flatnonzero(over)]
        self.ret[over], self.len[over] = 0.0, 0
        return games


# ---------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature-CNN actor-critic (CleanRL ppo_atari.py); takes uint8 (N, 4, 84, 84). Weights and activations are
    channels-last (NHWC): oneDNN's CPU convolutions ran the PPO update 1.4x faster that way (benchmarks/)."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)
        self.to(memory_format=torch.channels_last)

    def forward(self, obs):
        # x / 255 is folded into the first convolution's weights (conv(x / 255, w) = conv(x, w / 255)): one pass
        # over the (32, 4, 8, 8) weight instead of over every input pixel, ~4 % of a PPO minibatch on the CPU.
        conv1 = self.network[0]
        x = F.conv2d(to_channels_last(obs).float(), conv1.weight / 255.0, conv1.bias, stride=conv1.stride)
        hidden = self.network[1:](x)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


def to_channels_last(obs):
    """The uint8 frames in NHWC layout (converted before the float cast: a quarter of the memory traffic)."""
    return obs.contiguous(memory_format=torch.channels_last)


def sample_action(logits):
    """Categorical sample via Gumbel-max plus its log-probability (cheaper than torch.distributions)."""
    u = torch.rand_like(logits).clamp_(1e-10, 1.0)
    action = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, action[:, None]).squeeze(-1)
    return action, logp


def score_mask(top: int, bottom: int, height: int = 84) -> torch.Tensor:
    """(height,) float: 0 on the hidden rows (score, lives), 1 elsewhere."""
    keep = torch.ones(height)
    keep[: max(top, 0)] = 0.0
    if bottom > 0:
        keep[height - bottom :] = 0.0
    return keep


class RewardNet(nn.Module):
    """T-REX Atari reward net: 4 convs x 16 channels with leaky ReLU, FC 64, scalar r̂(s); state only.
    The score mask is a buffer applied inside forward, so no caller can show it the score or lives."""

    def __init__(self, mask_top: int = 10, mask_bottom: int = 0):
        super().__init__()
        self.register_buffer("keep_rows", score_mask(mask_top, mask_bottom).view(1, 1, 84, 1))
        self.mask_top, self.mask_bottom = mask_top, mask_bottom
        self.body = nn.Sequential(
            nn.Conv2d(4, 16, 7, stride=3), nn.LeakyReLU(),
            nn.Conv2d(16, 16, 5, stride=2), nn.LeakyReLU(),
            nn.Conv2d(16, 16, 3, stride=1), nn.LeakyReLU(),
            nn.Conv2d(16, 16, 3, stride=1), nn.LeakyReLU(),
            nn.Flatten(), nn.Linear(784, 64), nn.LeakyReLU(), nn.Linear(64, 1),
        )
        self.to(memory_format=torch.channels_last)  # as Agent: faster CPU convolutions

    def forward(self, obs):
        return self.body(to_channels_last(obs).float() * (self.keep_rows / 255.0)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------
# The math (pure functions)
# ---------------------------------------------------------------------------------------------------------
def compute_gae(rewards, values, dones, next_value, next_done, gamma: float, gae_lambda: float):
    """GAE over (T, N) tensors; dones[t] is the done flag that came *with* obs t. Returns (advantages, returns)."""
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


def next_frame_reward_hat(reward_net, frames, next_obs, final_frames: dict, chunk: int):
    """r̂(s_{t+1}) for every step of a rollout, shape (T, N). `frames` (T, N, 84, 84, 4) holds s_0..s_{T-1}, so s_{t+1}
    is frames[t + 1], `next_obs` after the last step, and final_frames[t] (N, 4, 84, 84) where an episode ended at
    step t (the env has already reset there; its true last frame is what the reward must see)."""
    T, N = frames.shape[:2]
    flat = frames.view(T * N, 84, 84, 4).permute(0, 3, 1, 2)
    r_hat_seen = torch.cat([reward_net(c) for c in flat.split(chunk)]).view(T, N)
    r_hat = torch.cat([r_hat_seen[1:], reward_net(next_obs)[None]])
    for step, final in final_frames.items():
        r_hat[step] = reward_net(final)
    return r_hat


def finished_game_sums(rewards, over, running) -> list:
    """Adds each step's rewards (T, N) to the per-env running sums (N,) in place; at over[t] (game over after step t)
    that env's sum is returned (one tensor per such step) and restarted."""
    out = []
    for t in range(rewards.shape[0]):
        running.add_(rewards[t])
        if over[t].any():
            done = torch.as_tensor(over[t], device=running.device)
            out.append(running[done].clone())
            running[done] = 0.0
    return out


def masked_mean(x, mask):
    """Mean over mask == 1 (where, not a product: an inf on a masked-out sample must not leak in as nan)."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def ppo_loss(new_logp, old_logp, entropy, new_value, old_value, advantages, returns, valid, args: Args):
    """Clipped PPO objective averaged over valid samples (valid = 0: an action the policy did not choose, the
    automatic FIRE after a lost life). Returns (loss, pg_loss, v_loss, entropy, approx_kl, clipfrac)."""
    logratio = new_logp - old_logp
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - logratio, valid)
        clipfrac = masked_mean(((ratio - 1.0).abs() > args.clip_coef).float(), valid)
    if args.norm_adv:
        mean = masked_mean(advantages, valid)
        std = torch.sqrt(masked_mean((advantages - mean) ** 2, valid))
        advantages = (advantages - mean) / (std + 1e-8)
    pg_loss = masked_mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)), valid)
    if args.clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * masked_mean(torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2), valid)
    else:
        v_loss = 0.5 * masked_mean((new_value - returns) ** 2, valid)
    ent = masked_mean(entropy, valid)
    return pg_loss - args.ent_coef * ent + args.vf_coef * v_loss, pg_loss, v_loss, ent, approx_kl, clipfrac


def trex_loss(return_a, return_b, label):
    """Bradley-Terry loss: -log P(preferred snippet), P = softmax([R_a, R_b]); label 0 = a preferred, 1 = b.
    Computed with log-softmax, so returns of any size stay finite."""
    return F.cross_entropy(torch.stack([return_a, return_b], dim=-1), label)


class RunningMeanStd:
    """Running mean/variance on the device (Chan's parallel update); for --policy-reward normalized."""

    def __init__(self, device):
        self.mean = torch.zeros((), device=device)
        self.var = torch.ones((), device=device)
        self.count = torch.full((), 1e-4, device=device)

    def update(self, x):
        b_mean, b_var, b_count = x.mean(), x.var(unbiased=False), x.numel()
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * b_count / total
        self.var = (self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total) / total
        self.count = total

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, d):
        self.mean, self.var, self.count = d["mean"], d["var"], d["count"]


def sample_snippet_pairs(lengths, scores, num_pairs: int, min_len: int, max_len: int, stride: int, rng):
    """The paper's snippet-pair rule. Two demos with *different* scores; a length L uniform in
    [min_len, max_len] (inclusive, capped by the shortest demo); the worse demo's snippet starts uniform in
    [0, min(len_i, len_j) - L], the better one's uniform in [start_worse, len_better - L] -- never earlier
    (progress prior). Returns int64 arrays (demo_a, start_a, demo_b, start_b, length, label); label 1 means
    b is better; order within a pair is random. Snippet observations are start + stride * k, k < ceil(L/stride)."""
    lengths, scores = np.asarray(lengths), np.asarray(scores, dtype=np.float64)
    cap = int(lengths.min())
    max_len = min(max_len, cap)
    min_len = min(min_len, max_len)
    out = np.zeros((num_pairs, 6), dtype=np.int64)
    n = 0
    while n < num_pairs:
        i, j = rng.choice(len(lengths), size=2, replace=False)
        if scores[i] == scores[j]:
            continue
        worse, better = (i, j) if scores[i] < scores[j] else (j, i)
        L = int(rng.integers(min_len, max_len + 1))
        s_worse = int(rng.integers(0, min(lengths[i], lengths[j]) - L + 1))
        s_better = int(rng.integers(s_worse, lengths[better] - L + 1))
        if rng.random() < 0.5:
            out[n] = (worse, s_worse, better, s_better, L, 1)
        else:
            out[n] = (better, s_better, worse, s_worse, L, 0)
        n += 1
    return tuple(out.T.copy())


def snippet_obs_index(offsets, demo, start, length, stride):
    """Frame-store index of each snippet observation, plus the snippet id of each observation (for sums)."""
    counts = -(-np.asarray(length) // stride)
    seg = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    obs_index = np.asarray(offsets)[np.asarray(demo)][seg] + np.asarray(start)[seg] + within * stride
    return obs_index, seg


def gather_stacks(frames, obs_index):
    """frames (F, 84, 84) single frames of concatenated demos; obs t of a demo = frames[o + t : o + t + 4]."""
    idx = torch.as_tensor(obs_index, device=frames.device)[:, None] + torch.arange(4, device=frames.device)
    return frames[idx]


def pair_returns(net, frames, offsets, pairs, stride):
    """Summed r̂ of both snippets of every pair, in one batched forward pass. Returns (R_a, R_b, labels)."""
    demo_a, start_a, demo_b, start_b, length, label = pairs
    idx, seg = snippet_obs_index(offsets, np.concatenate([demo_a, demo_b]), np.concatenate([start_a, start_b]),
                                 np.concatenate([length, length]), stride)
    r = net(gather_stacks(frames, idx))
    sums = torch.zeros(2 * len(label), device=r.device, dtype=r.dtype).index_add_(
        0, torch.as_tensor(seg, device=r.device), r)
    return sums[: len(label)], sums[len(label) :], torch.as_tensor(label, device=r.device)


def demo_returns(net, frames, offsets, lengths, transform=None, chunk: int = 512):
    """Predicted return of each demo: the sum of r̂ (or of transform(r̂)) over all its observations."""
    transform = transform or (lambda r: r)
    out = []
    with torch.no_grad():
        for o, n in zip(offsets, lengths):
            idx = np.arange(o, o + n)
            out.append(sum(float(transform(net(gather_stacks(frames, idx[k : k + chunk]))).sum())
                           for k in range(0, n, chunk)))
    return np.array(out)


# ---------------------------------------------------------------------------------------------------------
# Demonstrations: one frame per step, stacks rebuilt on demand
# ---------------------------------------------------------------------------------------------------------
def load_demos(path: str) -> dict:
    """Read and validate a demo npz. Format (raises InputError with the fix):
    frames   uint8 (F, 84, 84): every demo's single frames, concatenated; a demo of n observations has n + 3
             frames, observation t is frames[o + t : o + t + 4] (o = its offset), newest frame last;
    lengths  int (D,): observations per demo;
    returns  float (D,) true returns, and/or ranks int (D,) (higher = better; used for ranking when present);
    optional: offsets (D,), actions (sum(lengths),), checkpoint (D,)."""
    try:
        with np.load(path) as z:
            d = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 -- any unreadable file is the same user error
        raise InputError(f"cannot read demos file {path!r} ({type(e).__name__}): pass an .npz written by this script "
                         "or in the format documented in load_demos") from None
    missing = [k for k in ("frames", "lengths") if k not in d] + ([] if ("returns" in d or "ranks" in d) else ["returns|ranks"])
    if missing:
        raise InputError(f"demos file {path!r} lacks {', '.join(missing)}: see the npz format in load_demos")
    frames, lengths = d["frames"], np.asarray(d["lengths"]).astype(np.int64)
    if frames.dtype != np.uint8 or frames.ndim != 3 or frames.shape[1:] != (84, 84):
        raise InputError(f"demos file {path!r}: frames must be uint8 (F, 84, 84), got {frames.dtype} {frames.shape}")
    if lengths.ndim != 1 or len(lengths) < MIN_DEMOS or lengths.min() < MIN_DEMO_LEN:
        raise InputError(f"demos file {path!r} is too small: need >= {MIN_DEMOS} demos of >= {MIN_DEMO_LEN} "
                         "observations each; collect more or longer demos")
    if int((lengths + 3).sum()) != len(frames):
        raise InputError(f"demos file {path!r}: frames has {len(frames)} rows but lengths need sum(lengths + 3) = "
                         f"{int((lengths + 3).sum())}; store n + 3 frames per demo")
    scores = np.asarray(d["ranks"] if "ranks" in d else d["returns"], dtype=np.float64)
    if scores.shape != lengths.shape or not np.isfinite(scores).all():
        raise InputError(f"demos file {path!r}: returns/ranks must be {len(lengths)} finite numbers, one per demo")
    if np.unique(scores).size < 2:
        raise InputError(f"demos file {path!r}: all demos have the same return/rank, nothing to rank; "
                         "add demos of different quality or pass explicit ranks")
    d["lengths"], d["scores"] = lengths, scores
    d["offsets"] = np.concatenate([[0], np.cumsum(lengths + 3)[:-1]]).astype(np.int64)
    if "returns" not in d:
        d["returns"] = np.full(len(lengths), np.nan)
    return d


def save_npz_atomic(path: Path, **arrays):
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def save_atomic(obj, path: Path):
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------------------
# PPO (phase 1 on the true reward, phase 4 on the learned one)
# ---------------------------------------------------------------------------------------------------------
def train_ppo(args: Args, ctx: dict, phase: str, total_timesteps: int, writer, reward_net=None,
              ceiling: Optional[float] = None, snapshot_dir: Optional[Path] = None) -> dict:
    """CleanRL-style PPO. With `reward_net`, the env reward is discarded and r = f(r̂(s')) is computed on the
    device in batched passes over each finished rollout. Resumes from checkpoints/{phase}.pt."""
    from tqdm import tqdm

    device, rom, sticky = ctx["device"], ctx["rom"], ctx["sticky"]
    run_dir = ctx["run_dir"]
    ckpt_path = run_dir / "checkpoints" / f"{phase}.pt"
    num_iterations = max(1, total_timesteps // args.batch_size)
    envs = make_envs(rom, args.num_envs, sticky, args, life_loss=args.episodic_life)
    agent = Agent(int(envs.single_action_space.n)).to(device)
    # fused: one kernel for all parameters instead of the default's ~10 multi-tensor passes
    # (~2 % of a PPO minibatch on the CPU)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    rms = RunningMeanStd(device)
    state = {"iteration": 0, "global_step": 0, "history": [], "done": False}
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        agent.load_state_dict(ck["agent"])
        optimizer.load_state_dict(ck["optimizer"])
        rms.load_state_dict(ck["reward_rms"])
        set_rng_state(ck["rng"])
        state = ck["state"]
        # A finished policy phase given a larger budget (and no results.json yet, e.g. a copy of a finished run dir
        # without it) trains on; the demonstrator is never extended, since the demos were drawn from its snapshots.
        extend = phase == "policy" and state["done"] and state["iteration"] < num_iterations
        if state["done"] and not extend:
            envs.close()
            return {"agent": agent, **state}
        verb = "extending the finished phase" if extend else "resuming"
        print(f"[{phase}] {verb} at iteration {state['iteration']} / {num_iterations} (step {state['global_step']})")
    snapshot_every = args.demo_snapshot_every or max(1, num_iterations // 50)

    def save(done=False):
        state["done"] = done
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        save_atomic({"agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "reward_rms": rms.state_dict(),
                     "rng": rng_state(), "state": state, "args": asdict(args)}, ckpt_path)

    def snapshot(iteration):
        if snapshot_dir is not None:
            snapshot_dir.mkdir(parents=True, exist_ok=True)
            save_atomic({"agent": agent.state_dict(), "iteration": iteration, "global_step": state["global_step"]},
                        snapshot_dir / f"ckpt_{iteration:05d}.pt")

    if state["iteration"] == 0:
        snapshot(0)  # the untrained policy: the worst demonstrator
    N, T = args.num_envs, args.num_steps
    # Frames are stored channels-last (T, N, 84, 84, 4): a minibatch is then one contiguous index_select that the
    # network reads as an NHWC view, ~25x cheaper than gathering NCHW frames and converting them.
    obs_buf = torch.zeros((T, N, 84, 84, 4), dtype=torch.uint8, device=device)
    act_buf = torch.zeros((T, N), dtype=torch.long, device=device)
    logp_buf, rew_buf, done_buf, val_buf, valid_buf = (torch.zeros((T, N), device=device) for _ in range(5))
    # After a lost life the reference's FireResetEnv presses FIRE inside reset(); here the env keeps playing, so
    # the loop presses FIRE for the policy on that step and leaves the step out of the loss (valid = 0).
    fire = fire_action(rom) if args.episodic_life else None
    need_fire = np.zeros(N, dtype=bool)
    learned_acc = torch.zeros(N, device=device)  # learned-reward return of the running game, per env
    tracker = GameTracker(N)
    recent = deque((h[1] for h in state["history"][-args.demo_ceiling_window :]), maxlen=args.demo_ceiling_window)

    obs_np, _ = envs.reset(seed=args.seed + 7919 * state["iteration"] + (0 if phase == "demonstrator" else 104729))
    tracker.prev_frame[:] = 0
    # A zero-copy view of the env's frames (on the CPU; read before the next send, so a reused env buffer is safe):
    # each step copies the frames once, into the buffer, whose NHWC slot the policy then reads as is.
    next_obs = torch.from_numpy(obs_np).to(device)
    next_done = torch.zeros(N, device=device)

    def learned_rewards(next_obs, final_frames: dict, over_buf: np.ndarray):
        """The rollout's rewards f(r̂(s_{t+1})) in batched passes after it (they are only needed by GAE: one pass over
        T*N frames is far cheaper than T small ones); also closes finished games' learned-reward sums."""
        r_hat = next_frame_reward_hat(reward_net, obs_buf, next_obs, final_frames, args.minibatch_size)
        if args.policy_reward == "sigmoid":
            r = torch.sigmoid(r_hat)
        elif args.policy_reward == "normalized":
            rms.update(r_hat.reshape(-1))
            r = (r_hat - rms.mean) / torch.sqrt(rms.var + 1e-8)
        else:
            r = r_hat
        finished_learned.extend(finished_game_sums(r, over_buf, learned_acc))
        return r

    use_learned = reward_net is not None and args.policy_reward != "env"
    bar = tqdm(total=num_iterations, initial=state["iteration"], desc=phase, unit="it", file=sys.stderr,
               dynamic_ncols=True, disable=None)
    warm_step, warm_time = None, None
    stopped_early = False
    while state["iteration"] < num_iterations:
        iteration = state["iteration"] + 1
        frac = 1.0 - (iteration - 1.0) / num_iterations
        lr_now = frac * args.learning_rate if args.anneal_lr else args.learning_rate
        optimizer.param_groups[0]["lr"] = lr_now
        finished_learned: list[torch.Tensor] = []
        games: list[tuple[float, int]] = []
        final_frames: dict[int, torch.Tensor] = {}  # step -> the true last frames, where an episode ended there
        over_buf = np.zeros((T, N), dtype=bool)  # game over after step t
        for step in range(T):
            if STOP["signal"]:
                break
            obs_buf[step] = next_obs.permute(0, 2, 3, 1)
            done_buf[step] = next_done
            with torch.inference_mode():
                logits, value = agent(obs_buf[step].permute(0, 3, 1, 2))
                action, logp = sample_action(logits)
            action_np = action.cpu().numpy()
            if need_fire.any():
                action_np[need_fire] = fire
            envs.send(action_np)
            act_buf[step], logp_buf[step], val_buf[step] = action, logp, value
            valid_buf[step] = torch.as_tensor(~need_fire, dtype=torch.float32, device=device)
            obs_np, reward_np, term, trunc, info = envs.recv()
            over = tracker.step(reward_np, info)
            games += tracker.pop(over)
            if fire is not None:
                need_fire = term & ~over
            next_obs = torch.from_numpy(obs_np).to(device)
            next_done = torch.as_tensor(term | trunc, dtype=torch.float32, device=device)
            if use_learned:
                over_buf[step] = over
                if "final_obs" in info:
                    final_frames[step] = torch.tensor(info["final_obs"], device=device)
            else:
                rew_buf[step] = torch.as_tensor(np.sign(reward_np), dtype=torch.float32, device=device)
        if STOP["signal"]:  # the model is unchanged since the last completed iteration: save that state
            save()
            envs.close()
            bar.close()
            raise Interrupted(f"{phase} stopped at iteration {state['iteration']}")
        state["global_step"] += N * T
        if use_learned:
            with torch.inference_mode():
                rew_buf[:] = learned_rewards(next_obs, final_frames, over_buf)

        with torch.no_grad():
            next_value = agent(next_obs)[1]
            advantages, returns = compute_gae(rew_buf, val_buf, done_buf, next_value, next_done, args.gamma, args.gae_lambda)
        b_obs, b_act = obs_buf.view(-1, 84, 84, 4), act_buf.reshape(-1)
        b_logp, b_adv, b_ret, b_val = logp_buf.reshape(-1), advantages.reshape(-1), returns.reshape(-1), val_buf.reshape(-1)
        b_valid = valid_buf.reshape(-1)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = perm[start : start + args.minibatch_size]
                logits, new_value = agent(b_obs.index_select(0, mb).permute(0, 3, 1, 2))
                logp_all = torch.log_softmax(logits, dim=-1)
                new_logp = logp_all.gather(-1, b_act[mb, None]).squeeze(-1)
                entropy = -(logp_all.exp() * logp_all).sum(-1)
                loss, pg_loss, v_loss, ent, approx_kl, clipfrac = ppo_loss(
                    new_logp, b_logp[mb], entropy, new_value, b_val[mb], b_adv[mb], b_ret[mb], b_valid[mb], args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(clipfrac)
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break
        if not math.isfinite(loss.item()):
            save()
            envs.close()
            raise RuntimeError(f"[{phase}] non-finite PPO loss at iteration {iteration}: lower --learning-rate "
                               "or check the reward model")
        state["iteration"] = iteration
        gs = state["global_step"]
        var_y = b_ret.var()
        explained_var = float("nan") if var_y == 0 else float(1 - (b_ret - b_val).var() / var_y)
        learned_games = torch.cat(finished_learned).tolist() if finished_learned else []
        for k, (score, length) in enumerate(games):
            learned = learned_games[k] if k < len(learned_games) else float("nan")
            state["history"].append((gs, score, length, learned))
            recent.append(score)
            writer.add_scalar("charts/episodic_return", score, gs)
            writer.add_scalar("charts/episodic_length", length, gs)
            if use_learned:
                writer.add_scalar("trex/learned_episodic_return", learned, gs)
        writer.add_scalar("charts/learning_rate", lr_now, gs)
        writer.add_scalar("losses/value_loss", v_loss.item(), gs)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), gs)
        writer.add_scalar("losses/entropy", ent.item(), gs)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), gs)
        writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), gs)
        writer.add_scalar("losses/explained_variance", explained_var, gs)
        if use_learned:
            writer.add_scalar("trex/mean_step_reward", rew_buf.mean().item(), gs)
        if warm_step is None:  # SPS counts from the end of the first iteration of this process (after warm-up)
            warm_step, warm_time = gs, time.perf_counter()
        elif gs > warm_step:
            sps = (gs - warm_step) / (time.perf_counter() - warm_time)
            writer.add_scalar("charts/SPS", sps, gs)
            state["sps"] = sps
        bar.update(1)
        bar.set_postfix(step=gs, sps=int(state.get("sps", 0)), ret=np.mean(recent) if recent else float("nan"))
        if snapshot_dir is not None and iteration % snapshot_every == 0:
            snapshot(iteration)
        if ceiling is not None and len(recent) == recent.maxlen and np.mean(recent) >= ceiling:
            print(f"[{phase}] mean score {np.mean(recent):.1f} of the last {len(recent)} games reached the ceiling "
                  f"{ceiling}: stopping so the demos stay suboptimal")
            stopped_early = True
            break
        if iteration % args.checkpoint_every == 0:
            save()
    if snapshot_dir is not None and state["iteration"] % snapshot_every != 0:
        snapshot(state["iteration"])
    state["stopped_at_ceiling"] = stopped_early
    save(done=True)
    bar.close()
    envs.close()
    writer.flush()
    return {"agent": agent, **state}


# ---------------------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------------------
def train_demonstrator(args: Args, ctx: dict) -> None:
    """Phase 1: PPO on the true (clipped) reward, snapshots of rising quality in demonstrator/."""
    from torch.utils.tensorboard import SummaryWriter

    ceiling = args.demo_return_ceiling if args.demo_return_ceiling is not None else PAPER_BEST_DEMO.get(ctx["rom"])
    if ceiling is None:
        print(f"[demonstrator] no paper best-demo score for {ctx['rom']}: no ceiling (set --demo-return-ceiling)")
    writer = SummaryWriter(str(ctx["run_dir"] / "demonstrator"))
    train_ppo(args, ctx, "demonstrator", args.demo_total_timesteps, writer, ceiling=ceiling,
              snapshot_dir=ctx["run_dir"] / "demonstrator")
    writer.close()


def pick_snapshots(paths: list[Path], k: int) -> list[Path]:
    """k snapshots spread evenly over training (all of them when there are fewer)."""
    if len(paths) <= k:
        return paths
    return [paths[i] for i in np.unique(np.linspace(0, len(paths) - 1, k).round().astype(int))]


def collect_demos(args: Args, ctx: dict) -> dict:
    """Phase 2: stochastic full games (no life-loss episodes) from >= 12 snapshots; each frame stored once."""
    from tqdm import tqdm

    device = ctx["device"]
    snaps = pick_snapshots(sorted((ctx["run_dir"] / "demonstrator").glob("ckpt_*.pt")), args.demos_num_checkpoints)
    episodes = args.demos_episodes_per_checkpoint
    if len(snaps) < args.demos_num_checkpoints:
        episodes = max(episodes, math.ceil(args.demos_num_checkpoints / max(1, len(snaps))))
        print(f"[demos] only {len(snaps)} snapshots: {episodes} games from each")
    env = make_envs(ctx["rom"], 1, ctx["sticky"], args, life_loss=False)
    agent = Agent(int(env.single_action_space.n)).to(device)
    frames, lengths, actions, returns, ckpt_ids = [], [], [], [], []
    for s_i, snap in enumerate(tqdm(snaps, desc="demos", file=sys.stderr, disable=None)):
        ck = torch.load(snap, map_location=device, weights_only=False)
        agent.load_state_dict(ck["agent"])
        for e in range(episodes):
            obs, _ = env.reset(seed=args.seed + 1000 * s_i + e)
            demo_frames, demo_actions, ret = [obs[0].copy()], [], 0.0
            while True:
                if STOP["signal"]:
                    env.close()
                    raise Interrupted("demo collection interrupted (it restarts on resume)")
                with torch.inference_mode():
                    action = sample_action(agent(torch.tensor(obs, device=device))[0])[0]
                a = action.cpu().numpy()
                obs, reward, term, trunc, info = env.step(a)
                ret += float(reward[0])
                demo_actions.append(int(a[0]))
                last = info["final_obs"] if (term[0] or trunc[0]) else obs
                demo_frames.append(last[0, -1:].copy())
                if term[0] or trunc[0]:
                    break
            stacked = np.concatenate(demo_frames)
            frames.append(stacked)
            lengths.append(len(stacked) - 3)
            actions.append(np.array(demo_actions + [-1]))  # the final observation has no action
            returns.append(ret)
            ckpt_ids.append(int(ck["iteration"]))
    env.close()
    demos = {"frames": np.concatenate(frames), "lengths": np.array(lengths), "actions": np.concatenate(actions),
             "returns": np.array(returns), "checkpoint": np.array(ckpt_ids)}
    save_npz_atomic(ctx["run_dir"] / "demos.npz", **demos)
    write_demo_table(demos, ctx["run_dir"] / "demos_table.md")
    return demos


def demo_stats(returns) -> dict:
    r = np.asarray(returns, dtype=np.float64)
    if r.size == 0 or not np.isfinite(r).all():  # no demos (--reward-model alone) or ranks without returns
        return {"best": None, "average": None, "worst": None, "num_demos": len(r)}
    return {"best": float(r.max()), "average": float(r.mean()), "worst": float(r.min()), "num_demos": len(r)}


def write_demo_table(demos: dict, path: Path):
    lines = ["| demo | snapshot (iteration) | true return | length (steps) |", "|---|---|---|---|"]
    ckpts = demos.get("checkpoint", np.full(len(demos["lengths"]), -1))
    for i in np.argsort(demos["returns"], kind="stable"):
        lines.append(f"| {i} | {ckpts[i]} | {demos['returns'][i]:g} | {demos['lengths'][i]} |")
    s = demo_stats(demos["returns"])
    lines += ["", f"best {s['best']}, average {s['average']}, worst {s['worst']} over {s['num_demos']} demos"]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def train_reward(args: Args, ctx: dict, demos: dict, writer) -> dict:
    """Phase 3: Bradley-Terry reward learning on snippet pairs; keeps the best validation-accuracy model."""
    from tqdm import tqdm

    device = ctx["device"]
    rng = np.random.default_rng(args.seed)
    frames = torch.as_tensor(demos["frames"], device=device)
    offsets, lengths, scores = demos["offsets"], demos["lengths"], demos["scores"]
    top, bottom = ctx["mask"]
    net = RewardNet(top, bottom).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.reward_lr, weight_decay=args.reward_weight_decay)
    live = args.reward_sampling == "live"
    stride = 1 if live else args.reward_stride
    lo, hi = (args.reward_live_len, args.reward_live_len) if live else (args.reward_min_len, args.reward_max_len)
    n_val = max(1, int(args.reward_num_pairs * args.reward_val_fraction))
    val = sample_snippet_pairs(lengths, scores, n_val, lo, hi, stride, rng)
    if live:
        total_steps = args.reward_live_steps
    else:
        train = sample_snippet_pairs(lengths, scores, args.reward_num_pairs, lo, hi, stride, rng)
        steps_per_epoch = math.ceil(args.reward_num_pairs / args.reward_batch_size)
        total_steps = args.reward_epochs * steps_per_epoch

    def accuracy(pairs, batch=16):  # 16 pairs = up to 3,200 stacked frames (~360 MB as float)
        correct = 0
        with torch.no_grad():
            for k in range(0, len(pairs[0]), batch):
                ra, rb, lab = pair_returns(net, frames, offsets, tuple(p[k : k + batch] for p in pairs), stride)
                correct += int(((rb > ra).long() == lab).sum())
        return correct / len(pairs[0])

    best = {"acc": -1.0, "state": None, "step": 0}
    bad, order, losses = 0, None, []
    bar = tqdm(range(total_steps), desc="reward", file=sys.stderr, disable=None)
    for step in bar:
        if STOP["signal"]:
            raise Interrupted("reward learning interrupted (it restarts on resume)")
        if live:
            batch = sample_snippet_pairs(lengths, scores, args.reward_batch_size, lo, hi, stride, rng)
        else:
            k = step % steps_per_epoch
            if k == 0:
                order = rng.permutation(args.reward_num_pairs)  # reshuffled every pass, as the reference
            sel = order[k * args.reward_batch_size : (k + 1) * args.reward_batch_size]
            batch = tuple(p[sel] for p in train)
        ra, rb, lab = pair_returns(net, frames, offsets, batch, stride)
        loss = trex_loss(ra, rb, lab)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if (step + 1) % args.reward_eval_every == 0 or step + 1 == total_steps:
            mean_loss = torch.stack(losses).mean().item()
            losses = []
            if not math.isfinite(mean_loss):
                raise RuntimeError("non-finite reward loss: lower --reward-lr")
            acc = accuracy(val)
            writer.add_scalar("reward/train_loss", mean_loss, step + 1)
            writer.add_scalar("reward/val_accuracy", acc, step + 1)
            bar.set_postfix(loss=f"{mean_loss:.3f}", val_acc=f"{acc:.3f}")
            if acc > best["acc"]:
                best = {"acc": acc, "state": {k: v.clone() for k, v in net.state_dict().items()}, "step": step + 1}
                bad = 0
            else:
                bad += 1
                if bad >= args.reward_patience:
                    print(f"[reward] early stop at step {step + 1}: no better validation accuracy for {bad} checks")
                    break
    bar.close()
    net.load_state_dict(best["state"])
    predicted = demo_returns(net, frames, offsets, lengths)
    predicted_sigmoid = demo_returns(net, frames, offsets, lengths, torch.sigmoid)  # what the policy will collect
    info = {"val_accuracy": best["acc"], "best_step": best["step"], "steps_run": step + 1,
            "num_val_pairs": n_val, "peak_rss_mb": peak_rss_mb(), **correlations(predicted, scores),
            **{f"{k}_sigmoid": v for k, v in correlations(predicted_sigmoid, scores).items()}}
    save_atomic({"state_dict": net.state_dict(), "mask_top": top, "mask_bottom": bottom, "env_id": args.env_id,
                 "info": info}, ctx["run_dir"] / "reward_model.pt")
    plot_pred_vs_true(predicted, predicted_sigmoid, demos["returns"] if np.isfinite(demos["returns"]).all() else scores,
                      info, ctx["run_dir"] / "reward_pred_vs_true.png", args.env_id)
    print(f"[reward] val accuracy {best['acc']:.3f}; predicted vs true demo return: Spearman {info['spearman']:.3f}, "
          f"Pearson {info['pearson']:.3f} (sum of r̂), Spearman {info['spearman_sigmoid']:.3f} (sum of sigmoid(r̂))")
    return info


def correlations(predicted, true) -> dict:
    from scipy.stats import pearsonr, spearmanr

    if np.ptp(predicted) == 0 or np.ptp(true) == 0:
        return {"spearman": float("nan"), "pearson": float("nan")}
    return {"spearman": float(spearmanr(predicted, true)[0]), "pearson": float(pearsonr(predicted, true)[0])}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def plot_pred_vs_true(predicted, predicted_sigmoid, true, info, path: Path, env_id: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), dpi=100)
    for ax, pred, name, key in ((axes[0], predicted, "sum of r̂ (paper's plot)", ""),
                                (axes[1], predicted_sigmoid, "sum of sigmoid(r̂) (policy reward)", "_sigmoid")):
        ax.scatter(true, pred, s=18)
        ax.set_xlabel("true return of the demo")
        ax.set_ylabel(name, fontsize=8)
        ax.set_title(f"Spearman {info['spearman' + key]:.2f}, Pearson {info['pearson' + key]:.2f}", fontsize=9)
    fig.suptitle(f"{env_id}: learned vs true return of every demo", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load_reward_model(path: str, device) -> RewardNet:
    try:
        ck = torch.load(path, map_location=device, weights_only=False)
        net = RewardNet(ck["mask_top"], ck["mask_bottom"]).to(device)
        net.load_state_dict(ck["state_dict"])
    except Exception as e:  # noqa: BLE001 -- unreadable or foreign file: same user error
        raise InputError(f"cannot load reward model {path!r} ({type(e).__name__}): pass a reward_model.pt "
                         "written by this script") from None
    return net.eval()


def evaluate(args: Args, ctx: dict, agent: Agent, writer) -> dict:
    """Phase 5: the paper's protocol -- full games (no life-loss episodes), stochastic policy, 30 games per seed;
    each env plays a fixed quota of games, so short games are not over-represented."""
    device = ctx["device"]
    per_seed = []
    for s_i, seed in enumerate(args.eval_seeds):
        n_envs = max(1, min(args.eval_num_envs, args.eval_episodes))
        quota = np.array([args.eval_episodes // n_envs + (i < args.eval_episodes % n_envs) for i in range(n_envs)])
        envs = make_envs(ctx["rom"], n_envs, ctx["sticky"], args, life_loss=False)
        obs, _ = envs.reset(seed=seed)
        tracker, done_count, returns = GameTracker(n_envs), np.zeros(n_envs, dtype=int), []
        video = [] if (args.capture_video and s_i == 0) else None
        while (done_count < quota).any():
            if STOP["signal"]:
                envs.close()
                raise Interrupted("evaluation interrupted (it restarts on resume)")
            with torch.inference_mode():
                action = sample_action(agent(torch.tensor(obs, device=device))[0])[0]
            obs, reward, term, trunc, info = envs.step(action.cpu().numpy())
            if video is not None:
                video.append(obs[0, -1].copy())
            over = tracker.step(reward, info)
            for i in np.flatnonzero(over):
                if done_count[i] < quota[i]:
                    returns.append(float(tracker.ret[i]))
                    writer.add_scalar("eval/episodic_return", tracker.ret[i], s_i * args.eval_episodes + len(returns))
                done_count[i] += 1
                if i == 0 and video is not None:
                    write_video(video, ctx["run_dir"] / "videos" / f"eval_seed{seed}.mp4")
                    video = None
            tracker.pop(over)
        envs.close()
        per_seed.append({"seed": seed, "mean": float(np.mean(returns)), "std": float(np.std(returns)),
                         "returns": returns})
        print(f"[eval] seed {seed}: {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} games")
    means = [p["mean"] for p in per_seed]
    return {"per_seed": per_seed, "best_mean": float(max(means)), "mean_of_means": float(np.mean(means)),
            "episodes_per_seed": args.eval_episodes}


def write_video(frames, path: Path, scale: int = 4):
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 15, (84 * scale, 84 * scale), isColor=False)
    for f in frames:
        writer.write(cv2.resize(f, (84 * scale, 84 * scale), interpolation=cv2.INTER_NEAREST))
    writer.release()


def plot_learning_curve(history, demo_hist, stats, path: Path, env_id: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)

    def smooth(y, k=20):
        y = np.asarray(y, dtype=float)
        return np.convolve(y, np.ones(k) / k, mode="valid") if len(y) >= k else y

    for hist, label in ((demo_hist, "demonstrator (true reward)"), (history, "T-REX policy (learned reward)")):
        if hist:
            steps, scores = np.array([h[0] for h in hist]), [h[1] for h in hist]
            s = smooth(scores)
            ax.plot(steps[len(steps) - len(s) :] * 4, s, label=label)
    if stats.get("best") is not None:
        ax.axhline(stats["best"], color="gray", ls="--", lw=1, label="best demo")
        ax.axhline(stats["average"], color="gray", ls=":", lw=1, label="average demo")
    ax.set_xlabel("emulator frames (each phase from 0)")
    ax.set_ylabel("true game score (20-game mean)")
    ax.set_title(env_id, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------------------
def check_run_dir(run_dir: Path):
    if (run_dir / "results.json").exists():
        raise InputError(f"{run_dir} already holds a finished result (results.json): pick a new --run-dir")
    probe = run_dir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"cannot create run dir {run_dir} ({probe} is not a writable directory): pass a writable --run-dir")


def validate(args: Args) -> dict:
    """Every check that can fail on user input, before anything is written."""
    rom, sticky_default = resolve_env_id(args.env_id)
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes", "demos_num_checkpoints",
                 "reward_num_pairs", "reward_batch_size", "reward_eval_every", "checkpoint_every"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1")
    if (args.num_envs * args.num_steps) % args.num_minibatches:
        raise InputError("--num-envs x --num-steps must be divisible by --num-minibatches")
    if not args.eval_seeds:
        raise InputError("--eval-seeds needs at least one seed")
    run_dir = Path(args.run_dir or f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}")
    check_run_dir(run_dir)
    demos = load_demos(args.demos) if args.demos else None
    if args.reward_model:
        load_reward_model(args.reward_model, "cpu")
    top = args.mask_top if args.mask_top >= 0 else SCORE_MASKS.get(rom, DEFAULT_MASK)[0]
    bottom = args.mask_bottom if args.mask_bottom >= 0 else SCORE_MASKS.get(rom, DEFAULT_MASK)[1]
    if top + bottom >= 84:
        raise InputError("--mask-top + --mask-bottom hide the whole frame: use fewer rows")
    sticky = sticky_default if args.sticky_actions < 0 else args.sticky_actions
    return {"rom": rom, "sticky": sticky, "run_dir": run_dir, "demos": demos, "mask": (top, bottom)}


def main(args: Args) -> dict:
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // max(1, args.num_minibatches)
    try:
        ctx = validate(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    run_dir = ctx["run_dir"]
    if ctx["rom"] not in SCORE_MASKS and args.mask_top < 0:
        print(f"warning: no score mask known for {ctx['rom']}; hiding the top {DEFAULT_MASK[0]} rows "
              "(check a frame and set --mask-top/--mask-bottom)", file=sys.stderr)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    keep_freed_memory()
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    ctx["device"] = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "args.json").write_text(json.dumps(asdict(args), indent=2))
    old_handlers = {s: signal.signal(s, _request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    STOP["signal"] = 0
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=asdict(args), name=run_dir.name, save_code=True, resume="allow")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    try:
        return run_pipeline(args, ctx, writer)
    except InputError as e:  # e.g. the collected demos all have the same return
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except Interrupted as e:
        print(f"interrupted: {e}; re-run with --run-dir {run_dir} to resume", file=sys.stderr)
        raise SystemExit(128 + STOP["signal"]) from None
    except RuntimeError as e:
        if "non-finite" not in str(e):
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        writer.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)


def run_pipeline(args: Args, ctx: dict, writer) -> Optional[dict]:
    run_dir, device = ctx["run_dir"], ctx["device"]
    demos_path = run_dir / "demos.npz"
    reward_path = run_dir / "reward_model.pt"
    # Phases 1-2 (skipped with --demos, or with --reward-model alone)
    if ctx["demos"] is not None and not demos_path.exists():
        shutil.copyfile(args.demos, demos_path)
    need_demos = not (args.reward_model and ctx["demos"] is None)
    if need_demos and not demos_path.exists():
        train_demonstrator(args, ctx)
        if args.stop_after == "demonstrator":
            return None
        collect_demos(args, ctx)
    demos = load_demos(str(demos_path)) if demos_path.exists() else None
    stats = demo_stats(demos["returns"]) if demos is not None else demo_stats([])
    if args.stop_after in ("demonstrator", "demos"):
        return None
    # Phase 3
    if args.reward_model:
        reward_net = load_reward_model(args.reward_model, device)
        reward_info = torch.load(args.reward_model, map_location="cpu", weights_only=False).get("info", {})
    else:
        if not reward_path.exists():
            train_reward(args, ctx, demos, writer)
        reward_net = load_reward_model(str(reward_path), device)
        reward_info = torch.load(reward_path, map_location="cpu", weights_only=False)["info"]
    for p in reward_net.parameters():
        p.requires_grad_(False)
    if args.stop_after == "reward":
        return None
    # Phase 4
    out = train_ppo(args, ctx, "policy", args.policy_total_timesteps, writer, reward_net=reward_net)
    demo_ck = run_dir / "checkpoints" / "demonstrator.pt"
    demo_hist = torch.load(demo_ck, map_location="cpu", weights_only=False)["state"]["history"] if demo_ck.exists() else []
    plot_learning_curve(out["history"], demo_hist, stats, run_dir / "learning_curve.png", args.env_id)
    if args.stop_after == "policy":
        return None
    # Phase 5
    ev = evaluate(args, ctx, out["agent"], writer)
    results = {
        "env_id": args.env_id, "seed": args.seed, "demos": stats, "reward": reward_info,
        "policy": {"global_step": out["global_step"], "frames": 4 * out["global_step"], "sps": out.get("sps"),
                   "reward": args.policy_reward},
        "demonstrator": ({"global_step": int(demo_hist[-1][0]) if demo_hist else 0} if demo_ck.exists() else None),
        "eval": ev, "trex_score": ev["best_mean"],
        "paper": PAPER_BREAKOUT if ctx["rom"] == "breakout" else None, "device": str(device),
    }
    tmp = run_dir / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, run_dir / "results.json")
    print(f"T-REX score {ev['best_mean']:.2f} (best of {len(ev['per_seed'])} seed means); demos best {stats['best']}, "
          f"average {stats['average']}")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
