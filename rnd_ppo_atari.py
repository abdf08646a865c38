"""PPO with Random Network Distillation (RND) exploration on Atari, data-parallel with torchrun.

RND adds an exploration bonus to PPO: the error of a trained predictor network imitating a fixed, randomly
initialised target network on the (whitened, last-frame) next observation. Frames the agent has seen often are
predicted well and earn little; novel frames earn a lot. The bonus is divided by a running std of its discounted
return (filtered forward in TIME for each env), is non-episodic, and has its own value head; the policy is trained
on A = 2 * A_ext + 1 * A_int.

Paper: Burda, Edwards, Storkey, Klimov (2019), "Exploration by Random Network Distillation", ICLR (arXiv 1810.12894).
Defaults follow the paper's Table 5 and the OpenAI code (openai/random-network-distillation) run as the paper's
CNN: 128 envs x 128 steps, 4 epochs x 4 minibatches, lr 1e-4 constant, entropy 0.001, gamma_ext 0.999,
gamma_int 0.99, predictor on 25 % of samples, sticky actions 0.25, no life-loss terminal, 18,000-frame cap,
no advantage normalisation, no gradient clipping, unclipped 0.5/0.5 value losses, per-feature MEAN bonus.
Deliberate differences (see docs/rnd_ppo_atari.md): minibatches are random env slices (OpenAI: fixed order); the
bonus of an episode's last transition is computed on the true final frame (OpenAI: on the reset frame); the
predictor is trained on an exact 25 % subsample (OpenAI: Bernoulli mask) so shapes stay static.

Usage:
    python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4            # the paper's setting (~2B frames)
    python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --num-envs 8 --num-steps 32 \\
        --num-iterations-obs-norm-init 2 --total-timesteps 20000 --eval-episodes 1   # minutes on a laptop CPU
    python rnd_ppo_atari.py --run-dir runs/X                                 # resume X from its latest snapshot
    python rnd_ppo_atari.py --run-dir runs/X --eval-only                     # evaluate X's latest snapshot
    torchrun --nproc-per-node 8 rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --update-proportion 0.03125
        # 8 ranks x 128 envs = 1024 envs as in the paper's scale-up (--num-envs is per rank)
    python rnd_ppo_atari.py --rnn-hidden-layers 1                            # GRU policy instead of the CNN

Run directory: TensorBoard events, args.json, checkpoints/ (last --keep-checkpoints snapshots: model, optimizer,
normalisers, reward filter, RNG states, counters), results.json (final evaluation, visited rooms, SPS),
curves.png, videos/ (with --capture-video) and {exp_name}.cleanrl_model (with --save-model).
"""


import ctypes
import dataclasses
import difflib
import json
import os
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.distributions import Categorical


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (rank r of a torchrun job uses seed + r for its envs and sampling)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use the GPU when one is present (falls back to the CPU)"""
    track: bool = False
    """log to Weights and Biases as well (needs `wandb`)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record the first evaluation episode of each evaluation to `videos/` (mp4)"""
    save_model: bool = True
    """save the final agent to `{run_dir}/{exp_name}.cleanrl_model`"""

    # Algorithm specific arguments
    env_id: str = "MontezumaRevengeNoFrameskip-v4"
    """gymnasium id (`MontezumaRevengeNoFrameskip-v4`, `ALE/MontezumaRevenge-v5`); the ROM is read with the paper's
    settings whatever the suffix: sticky actions, 18K-frame cap, no random starts, no life-loss terminal"""
    total_timesteps: int = 491_520_000
    """total agent steps over all envs and ranks (paper: 30K rollouts x 128 steps x 128 envs = 0.49B = 1.97B frames)"""
    learning_rate: float = 1e-4
    """Adam learning rate (paper: 1e-4, constant)"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0 (CleanRL does; the paper and OpenAI do not)"""
    adam_eps: float = 1e-8
    """Adam epsilon (OpenAI's MpiAdam: 1e-8)"""
    num_envs: int = 128
    """parallel environments PER RANK (torchrun --nproc-per-node N gives N x num_envs envs)"""
    num_steps: int = 128
    """rollout length per env per iteration"""
    gamma: float = 0.999
    """extrinsic discount gamma_E (episodic)"""
    int_gamma: float = 0.99
    """intrinsic discount gamma_I (non-episodic)"""
    gae_lambda: float = 0.95
    """GAE lambda for both streams"""
    num_minibatches: int = 4
    """minibatches per epoch; each is a slice of num_envs / num_minibatches whole env sequences"""
    update_epochs: int = 4
    """PPO epochs per iteration"""
    norm_adv: bool = False
    """normalise advantages per minibatch. Off by default: the paper/OpenAI do not, and the 2:1 mix of extrinsic and
    intrinsic advantages is meant to keep its scale (a rare key pickup would be flattened by per-minibatch scaling)"""
    clip_coef: float = 0.1
    """PPO clip range epsilon (ratio in [0.9, 1.1])"""
    ent_coef: float = 0.001
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """value loss weight on 0.5 * (MSE_ext + MSE_int) (OpenAI: 1.0, no value clipping)"""
    max_grad_norm: float = 0.0
    """global gradient-norm clip, 0 = off. Off by default: OpenAI's clip is a no-op (its result is discarded) and
    jcwleo's never applies, so the paper's numbers were obtained without clipping; set 0.5 for CleanRL's behaviour"""
    ext_coef: float = 2.0
    """coefficient of the EXTRINSIC advantage"""
    int_coef: float = 1.0
    """coefficient of the INTRINSIC advantage. 0 = plain PPO: the bonus is not computed and the predictor not trained
    (the intrinsic head then learns a zero return), so SPS with 0 vs 1 measures the RND networks' cost"""
    update_proportion: float = 0.25
    """fraction of each minibatch the predictor trains on (paper App. A.4: 0.25 at 128 envs, 0.03125 at 1024)"""
    num_iterations_obs_norm_init: int = 50
    """random-agent rollouts (of num_steps steps) that initialise the observation normaliser (paper: 50)"""
    obs_clip: float = 5.0
    """whitened RND inputs are clipped to [-obs_clip, obs_clip]"""
    sticky_action_prob: float = 0.25
    """ALE repeat_action_probability, decided per emulator frame inside the frame-skip (paper: 0.25)"""
    max_episode_frames: int = 18_000
    """episode cap in emulator frames (paper: 18K = 4,500 agent steps); the cap counts as a terminal, as in OpenAI"""
    env_threads: int = 0
    """C++ threads of the vector env (0 = one per core)"""
    rnn_hidden_layers: int = 0
    """0 = CNN policy (paper Table 5); k > 0 = a k-layer GRU after the conv encoder (paper Fig. 7's RNN policy)"""
    rnn_hidden_size: int = 256
    """GRU width"""
    target_score: float | None = None
    """stop when the mean extrinsic score of the last --target-score-window training episodes reaches this"""
    target_score_window: int = 100
    """episodes (per rank) averaged for --target-score and charts/avg_episodic_return"""
    checkpoint_every: int = 10
    """iterations between snapshots (one is also written at the end and on SIGINT/SIGTERM)"""
    keep_checkpoints: int = 3
    """snapshots kept in checkpoints/ (older ones are deleted)"""
    eval_episodes: int = 10
    """evaluation episodes at the end of training (stochastic policy, as trained)"""
    eval_every: int = 0
    """also evaluate every this many iterations (0 = only at the end); logs eval/* and visited rooms"""
    eval_only: bool = False
    """evaluate the latest snapshot of --run-dir and write results.json, without training"""
    run_dir: str | None = None
    """run directory (default runs/{env_id}__{exp_name}__{seed}__{unix_time}); an existing one is resumed"""
    progress_bar: bool = True
    """show tqdm progress bars"""


# ----------------------------------------------------------------------------------------------------------------
# Errors that end the run with exit code 2 and one line naming the fix
# ----------------------------------------------------------------------------------------------------------------
class UsageError(Exception):
    """A bad input the user can fix; reported as one line on stderr with exit code 2."""


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ----------------------------------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------------------------------
# RAM byte holding the current room, as read by OpenAI's MontezumaInfoWrapper.
ROOM_RAM_ADDRESS = {"montezuma_revenge": 3, "pitfall": 1}


def rom_name(env_id: str) -> str:
    """'MontezumaRevengeNoFrameskip-v4' / 'ALE/MontezumaRevenge-v5' -> 'montezuma_revenge' (ale-py's ROM id)."""
    name = env_id.split("/")[-1]
    name = re.sub(r"(NoFrameskip|Deterministic)?-v\d+$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel_name(rom: str) -> str:
    """'montezuma_revenge' -> 'MontezumaRevenge' (the gymnasium ALE/*-v5 spelling)."""
    return "".join(part.capitalize() for part in rom.split("_"))


def check_env_id(env_id: str) -> str:
    """The ROM id for env_id, or a UsageError listing close matches."""
    from ale_py import roms

    rom = rom_name(env_id)
    known = roms.get_all_rom_ids()
    if rom not in known:
        close = difflib.get_close_matches(rom, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(camel_name(c) + 'NoFrameskip-v4' for c in close)}?" if close else "see ale_py.roms"
        raise UsageError(f"unknown Atari env id '{env_id}' (ROM '{rom}'): pass a valid --env-id; {hint}")
    return rom


def make_envs(args: Args, num_envs: int, seed: int):
    """ale-py's C++ vector env with every semantic choice of the paper set explicitly.

    Same-step autoreset: a done step returns the reset observation and puts the true last one in info["final_obs"],
    so no transition is wasted on a reset (NEXT_STEP mode would add one whose action is ignored).
    """
    from ale_py.vector_env import AtariVectorEnv

    envs = AtariVectorEnv(
        game=rom_name(args.env_id),
        num_envs=num_envs,
        num_threads=args.env_threads,
        repeat_action_probability=args.sticky_action_prob,
        max_num_frames_per_episode=args.max_episode_frames,
        full_action_space=False,
        noop_max=0,  # paper Table 2: no random starts
        use_fire_reset=False,  # OpenAI's wrappers have no FireReset
        episodic_life=False,  # a lost life is not terminal
        reward_clipping=False,  # clip in the learner, log the true game score
        autoreset_mode="SameStep",
        frameskip=4,
        maxpool=True,
        stack_num=4,
        grayscale=True,
        img_height=84,
        img_width=84,
    )
    envs.reset(seed=np.arange(seed, seed + num_envs, dtype=np.int64))
    return envs


def make_eval_env(args: Args, seed: int, render: bool = False):
    """One Python env with the same preprocessing, for evaluation: it exposes the RAM, which the vector env does not.

    ale-py's AtariVectorEnv returns only frames, rewards and {lives, frame numbers} (no RAM accessor in 0.12.1), so
    Montezuma's room number (RAM[3]) is read here, from gymnasium's AtariEnv + AtariPreprocessing.
    """
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(
        f"ALE/{camel_name(rom_name(args.env_id))}-v5",
        frameskip=1,
        repeat_action_probability=args.sticky_action_prob,
        max_num_frames_per_episode=args.max_episode_frames,
        full_action_space=False,
        render_mode="rgb_array" if render else None,
    )
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=0, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True
    )
    env = gym.wrappers.FrameStackObservation(env, 4)
    env.reset(seed=seed)
    return env


# ----------------------------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------------------------
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """OpenAI's param-matched policy: x/255 -> conv 32-8-4, 64-4-2, 64-4-1 -> fc 256 [-> GRU] -> fc 448 = X;
    value trunk X + relu(fc(X)) -> (V_ext, V_int); action trunk X + relu(fc(X)) -> logits."""

    def __init__(self, n_actions: int, rnn_hidden_layers: int = 0, rnn_hidden_size: int = 256):
        super().__init__()
        self.encoder = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 4, stride=1)),  # 4x4 in OpenAI's policy (the Nature CNN's is 3x3)
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 6 * 6, 256)),
            nn.ReLU(),
        )
        self.rnn_layers, self.rnn_size = rnn_hidden_layers, rnn_hidden_size
        self.rnn = nn.GRU(256, rnn_hidden_size, num_layers=rnn_hidden_layers) if rnn_hidden_layers > 0 else None
        self.fc = nn.Sequential(layer_init(nn.Linear(rnn_hidden_size if self.rnn else 256, 448)), nn.ReLU())
        self.value_trunk = layer_init(nn.Linear(448, 448), std=0.1)
        self.action_trunk = layer_init(nn.Linear(448, 448), std=0.1)
        self.actor = layer_init(nn.Linear(448, n_actions), std=0.01)
        self.critic_ext = layer_init(nn.Linear(448, 1), std=0.01)
        self.critic_int = layer_init(nn.Linear(448, 1), std=0.01)
        self.to(memory_format=torch.channels_last)  # NHWC convolutions: ~1.4x faster on CPU (oneDNN)

    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor:
        """Recurrent state (layers, batch, size); an empty tensor for the CNN policy."""
        return torch.zeros(self.rnn_layers, batch, self.rnn_size, device=device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor):
        """obs (T, B, 4, 84, 84) uint8 in any memory layout; first (T, B) = 1 where obs starts an episode (the GRU
        state is zeroed there).

        Returns logits (T*B, A), v_ext (T*B,), v_int (T*B,) and the state after the last step.
        """
        T, B = obs.shape[:2]
        frames = obs.reshape(T * B, *obs.shape[2:]).contiguous(memory_format=torch.channels_last)  # uint8: cheap
        x = self.encoder(frames.float() / 255.0)
        if self.rnn is not None:
            x = x.view(T, B, -1)
            outs = []
            for t in range(T):
                state = state * (1.0 - first[t]).view(1, B, 1)
                out, state = self.rnn(x[t : t + 1], state)
                outs.append(out)
            x = torch.cat(outs).view(T * B, -1)
        h = self.fc(x)
        hv = h + F.relu(self.value_trunk(h))
        ha = h + F.relu(self.action_trunk(h))
        return self.actor(ha), self.critic_ext(hv).squeeze(-1), self.critic_int(hv).squeeze(-1), state


def rnd_encoder() -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Conv2d(1, 32, 8, stride=4)),
        nn.LeakyReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        nn.LeakyReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)),
        nn.LeakyReLU(),
        nn.Flatten(),
    )


class RNDModel(nn.Module):
    """Fixed random target f (convs -> linear 512) and trained predictor f^ (convs -> 512 -> 512 -> 512)."""

    def __init__(self, out_size: int = 512):
        super().__init__()
        self.target = nn.Sequential(rnd_encoder(), layer_init(nn.Linear(3136, out_size)))
        self.predictor = nn.Sequential(
            rnd_encoder(),
            layer_init(nn.Linear(3136, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, 512)),
            nn.ReLU(),
            layer_init(nn.Linear(512, out_size)),
        )
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.to(memory_format=torch.channels_last)  # as Agent (1-channel inputs are already NHWC-contiguous)

    def errors(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample bonus/loss on whitened frames x (B, 1, 84, 84)."""
        with torch.no_grad():
            target = self.target(x)
        return rnd_errors(self.predictor(x), target)


# ----------------------------------------------------------------------------------------------------------------
# The math, as pure functions
# ----------------------------------------------------------------------------------------------------------------
def rnd_errors(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||f^(s) - f(s)||^2 averaged over features (OpenAI's reduce_mean; CleanRL/jcwleo use sum/2 = 256x larger)."""
    return (prediction - target).pow(2).mean(dim=-1)


def normalize_frames(frames: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, clip: float) -> torch.Tensor:
    """uint8 frames (..., 84, 84) -> clip((x - mu) / sigma, -clip, clip) as float (..., 1, 84, 84)."""
    x = (frames.float() - mean) / torch.sqrt(var + 1e-8)
    return x.clamp(-clip, clip).unsqueeze(-3)


def merge_moments(mean_a, var_a, count_a, mean_b, var_b, count_b):
    """Combine two (mean, population variance, count) summaries (Chan et al.'s parallel formula)."""
    count = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2 = var_a * count_a + var_b * count_b + delta.pow(2) * (count_a * count_b / count)
    return mean, m2 / count, count


def discounted_reward_filter(rewards: torch.Tensor, state: torch.Tensor, gamma: float):
    """R_t = gamma * R_{t-1} + r_t, run over TIME (dim 0) separately for each env (dim 1), never reset at episode ends.

    rewards (T, N), state (N,) carried from the previous rollout. Returns (filtered (T, N), new state (N,)).
    CleanRL's #360 bug ran this over envs; with T != N the shapes here make that impossible to repeat silently.
    """
    out = torch.empty_like(rewards)
    for t in range(rewards.shape[0]):
        state = state * gamma + rewards[t]
        out[t] = state
    return out, state


def compute_gae(rewards, values, firsts, next_value, next_first, gamma: float, lam: float):
    """GAE over (T, N) tensors. firsts[t] = 1 when obs t starts an episode (so step t-1 was terminal).

    Pass zeros as firsts/next_first for the non-episodic intrinsic stream. Returns (advantages, returns).
    """
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
    """Clipped surrogate; also returns (approx_kl k3, clip fraction) as tensors (no host sync)."""
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    approx_kl = ((ratio - 1) - logratio).mean()
    clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return pg, approx_kl, clipfrac


def predictor_subsample(batch: int, proportion: float, device, generator=None) -> torch.Tensor:
    """Indices of the round(proportion * batch) samples (at least 1) the predictor trains on this minibatch."""
    k = max(1, int(round(proportion * batch)))
    return torch.randperm(batch, device=device, generator=generator)[:k]


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    var = target.var()
    return torch.where(var > 0, 1 - (target - pred).var() / var, torch.zeros_like(var))


class RunningMeanStd:
    """Running mean / population variance of tensors of a fixed shape, merged across torchrun ranks."""

    def __init__(self, shape=(), device="cpu"):
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = 1e-4

    def update_from_sums(self, total: torch.Tensor, total_sq: torch.Tensor, count: float, world: "World"):
        """Fold in a batch given by its sum, sum of squares and count (summed over ranks first).

        Every rank contributes the same count, so the global count is known on the host: no device sync.
        """
        packed = torch.cat([total.reshape(-1), total_sq.reshape(-1)]).double()
        world.all_reduce_sum(packed)
        n = count * world.size
        size = total.numel()
        mean = packed[:size].view_as(self.mean) / n
        var = (packed[size : 2 * size].view_as(self.mean) / n - mean.pow(2)).clamp_min(0.0)
        self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, mean, var, n)

    def update(self, x: torch.Tensor, world: "World"):
        """x: (batch, *shape)."""
        x = x.double()
        self.update_from_sums(x.sum(0), x.pow(2).sum(0), float(x.shape[0]), world)

    def state_dict(self):
        return {"mean": self.mean.cpu(), "var": self.var.cpu(), "count": self.count}

    def load_state_dict(self, d):
        self.mean, self.var, self.count = d["mean"].to(self.mean.device), d["var"].to(self.var.device), d["count"]


# ----------------------------------------------------------------------------------------------------------------
# torchrun plumbing
# ----------------------------------------------------------------------------------------------------------------
class World:
    """Rank / world size from torchrun's environment; every collective is a no-op in a single process."""

    def __init__(self):
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.size > 1

    def init(self, device: torch.device):
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def all_reduce_sum(self, t: torch.Tensor):
        if self.enabled:
            dist.all_reduce(t)
        return t

    def all_reduce_gradients(self, params: list[nn.Parameter]):
        """One flat all-reduce of all gradients, then divide by the world size (mean gradient)."""
        if not self.enabled:
            return
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_object(self, obj):
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_parameters(self, module: nn.Module):
        if self.enabled:
            for p in module.state_dict().values():
                dist.broadcast(p, src=0)

    def all_gather_object(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


# ----------------------------------------------------------------------------------------------------------------
# Validation, run directory and checkpoints
# ----------------------------------------------------------------------------------------------------------------
def derive(args: Args, world_size: int) -> dict:
    """Batch arithmetic, computed once. Raises UsageError on impossible settings."""
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "keep_checkpoints"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if args.num_envs % args.num_minibatches:
        raise UsageError(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches} "
            "(each minibatch is a slice of whole env sequences): pick num-envs as a multiple of num-minibatches"
        )
    if not 0.0 < args.update_proportion <= 1.0:
        raise UsageError(f"--update-proportion must be in (0, 1] (got {args.update_proportion})")
    if args.num_iterations_obs_norm_init < 0 or args.checkpoint_every < 1 or args.eval_episodes < 0:
        raise UsageError("--num-iterations-obs-norm-init and --eval-episodes must be >= 0, --checkpoint-every >= 1")
    if args.max_episode_frames < 4:
        raise UsageError(f"--max-episode-frames must be >= 4 (got {args.max_episode_frames})")
    batch = args.num_envs * args.num_steps * world_size
    if args.total_timesteps < batch:
        raise UsageError(
            f"--total-timesteps {args.total_timesteps} is less than one iteration "
            f"(num-envs x num-steps x ranks = {batch}): raise --total-timesteps or lower --num-envs/--num-steps"
        )
    return {
        "world_size": world_size,
        "batch_size": batch,
        "num_iterations": args.total_timesteps // batch,
        "envs_per_minibatch": args.num_envs // args.num_minibatches,
    }


def checkpoint_paths(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))


def load_checkpoint(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        assert isinstance(ckpt, dict) and "agent" in ckpt and "iteration" in ckpt
        return ckpt
    except Exception:
        raise UsageError(
            f"snapshot {path} is corrupt or unreadable: delete it to resume from the previous snapshot "
            "(or pass a new --run-dir)"
        ) from None


def save_checkpoint(run_dir: Path, state: dict, keep: int) -> Path:
    """Atomic write (tmp file in the same dir + os.replace), then keep only the newest `keep` snapshots."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt_{state['iteration']:08d}.pt"
    tmp = folder / f".{path.name}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
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


def rng_states() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# Settings a snapshot cannot be resumed under with different values (network shapes, game).
ARCHITECTURE_ARGS = ("env_id", "rnn_hidden_layers", "rnn_hidden_size")


def prepare_run(args: Args, world: World) -> tuple[Path, dict | None]:
    """Rank 0 decides the run dir and whether it resumes, before anything is written. UsageError on bad input."""
    run_dir = Path(args.run_dir or f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}")
    ckpt = None
    if run_dir.exists():
        if (run_dir / "results.json").exists() and not args.eval_only:
            raise UsageError(f"{run_dir} holds a finished run (results.json): pass a new --run-dir to train again")
        paths = checkpoint_paths(run_dir)
        if paths:
            ckpt = load_checkpoint(paths[-1])
            saved = ckpt.get("args", {})
            changed = [k for k in ARCHITECTURE_ARGS if k in saved and saved[k] != getattr(args, k) and not args.eval_only]
            if changed:
                was = " ".join(f"--{k.replace('_', '-')} {saved[k]}" for k in changed)
                raise UsageError(f"{run_dir} was trained with {was}: resume with the same values or pass a new --run-dir")
    if args.eval_only and ckpt is None:
        raise UsageError(f"--eval-only needs a snapshot in {run_dir}/checkpoints: pass the --run-dir of a trained run")
    return run_dir, ckpt


# ----------------------------------------------------------------------------------------------------------------
# Phases
# ----------------------------------------------------------------------------------------------------------------
class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop saves a snapshot at the next safe point and exits cleanly."""

    def __init__(self):
        self.raised = False
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.raised = True


def progress(total: int, desc: str, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, unit="step", dynamic_ncols=True, mininterval=2.0)


def init_obs_normalization(envs, obs_rms: RunningMeanStd, args: Args, world: World, stop: StopFlag, show: bool) -> bool:
    """Whiten RND inputs from random-agent steps (paper: 50 rollouts x 128 steps per env, last frame only).

    Vectorised: one (num_envs, 84, 84) frame batch per vector step is summed in float64 (no per-env loop), and the
    next step is already running in the C++ threads while the sums are taken. Returns False if interrupted.
    """
    steps = args.num_iterations_obs_norm_init * args.num_steps
    if steps == 0:
        return True
    rng = np.random.default_rng(args.seed + 7919 * world.rank)
    n_actions = envs.single_action_space.n
    total = np.zeros((84, 84), np.float64)
    total_sq = np.zeros((84, 84), np.float64)
    obs, *_ = envs.step(rng.integers(0, n_actions, size=args.num_envs))
    with progress(steps * args.num_envs * world.size, "obs-norm warm-up", show) as bar:
        for i in range(steps):
            frames = obs[:, -1].astype(np.float32)  # copy before the buffer is reused by the next step
            envs.send(rng.integers(0, n_actions, size=args.num_envs))
            total += frames.sum(0)
            total_sq += np.einsum("nij,nij->ij", frames, frames)
            obs, *_ = envs.recv()
            if i % 16 == 0:
                bar.update(16 * args.num_envs * world.size)
            if stop.raised:
                return False
    dev = obs_rms.mean.device
    obs_rms.update_from_sums(
        torch.from_numpy(total).to(dev), torch.from_numpy(total_sq).to(dev), float(steps * args.num_envs), world
    )
    return True


@torch.no_grad()
def evaluate(agent: Agent, args: Args, episodes: int, device: torch.device, seed: int, video_path: Path | None = None):
    """Run `episodes` episodes in lockstep (batched inference), stochastic policy; read visited rooms from RAM."""
    if episodes == 0:
        return {"returns": [], "lengths": [], "rooms": []}
    rom = rom_name(args.env_id)
    ram_addr = ROOM_RAM_ADDRESS.get(rom)
    envs = [make_eval_env(args, seed + i, render=video_path is not None and i == 0) for i in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
    rooms = [set() for _ in range(episodes)]
    active = np.ones(episodes, dtype=bool)
    state = agent.initial_state(episodes, device)
    first = torch.ones(1, episodes, device=device)
    frames = []
    while active.any():
        logits, _, _, state = agent(torch.as_tensor(obs, device=device)[None], state, first)
        first = torch.zeros_like(first)
        actions = Categorical(logits=logits).sample().cpu().numpy()
        for i in np.flatnonzero(active):
            o, r, term, trunc, _ = envs[i].step(int(actions[i]))
            obs[i] = o
            returns[i] += r
            lengths[i] += 1
            if ram_addr is not None:
                rooms[i].add(int(envs[i].unwrapped.ale.getRAM()[ram_addr]))
            if i == 0 and video_path is not None:
                frames.append(envs[i].render())
            if term or trunc:
                active[i] = False
    for env in envs:
        env.close()
    if video_path is not None and frames:
        write_video(video_path, frames)
    return {"returns": returns.tolist(), "lengths": lengths.tolist(), "rooms": [sorted(r) for r in rooms]}


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for f in frames:
        writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    writer.release()


def plot_curves(history: dict, path: Path) -> None:
    """Training score, visited rooms (evaluation) and intrinsic reward against agent steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    axes[0].plot(history["step"], history["avg_return"], label="training (avg of last episodes)")
    if history["eval_step"]:
        axes[0].plot(history["eval_step"], history["eval_return"], "o-", label="evaluation")
    axes[0].set_title("extrinsic score")
    axes[0].legend(fontsize=7)
    axes[1].plot(history["eval_step"], history["eval_rooms"], "o-")
    axes[1].set_title("visited rooms (evaluation, cumulative)")
    axes[2].plot(history["step"], history["int_reward"])
    axes[2].set_title("normalised intrinsic reward / step")
    for ax in axes:
        ax.set_xlabel("agent steps")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def ppo_update(agent, rnd, optimizer, batch: dict, args: Args, derived: dict, world: World, params: list):
    """update_epochs x num_minibatches steps on env slices; returns the last epoch's mean diagnostics as tensors."""
    T, N = batch["actions"].shape
    device = batch["actions"].device
    mb_envs = derived["envs_per_minibatch"]
    stats = torch.zeros(7, device=device)
    for _ in range(args.update_epochs):
        stats.zero_()
        perm = torch.randperm(N, device=device)
        for start in range(0, N, mb_envs):
            envs_idx = perm[start : start + mb_envs]
            obs = batch["obs"].index_select(1, envs_idx).permute(0, 1, 4, 2, 3)  # NHWC storage, (T, B, 4, 84, 84) view
            logits, v_ext, v_int, _ = agent(obs, batch["state0"][:, envs_idx], batch["firsts"][:, envs_idx])
            dist_ = Categorical(logits=logits)
            new_logprob = dist_.log_prob(batch["actions"][:, envs_idx].reshape(-1))
            adv = batch["advantages"][:, envs_idx].reshape(-1)
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss, approx_kl, clipfrac = ppo_policy_loss(new_logprob, batch["logprobs"][:, envs_idx].reshape(-1), adv, args.clip_coef)
            v_loss = 0.5 * (
                (v_ext - batch["ext_returns"][:, envs_idx].reshape(-1)).pow(2).mean()
                + (v_int - batch["int_returns"][:, envs_idx].reshape(-1)).pow(2).mean()
            )
            entropy = dist_.entropy().mean()
            if args.int_coef != 0:
                frames = batch["next_frames"][:, envs_idx].reshape(-1, 84, 84)
                keep = predictor_subsample(frames.shape[0], args.update_proportion, device)
                x = normalize_frames(frames[keep], batch["obs_mean"], batch["obs_var"], args.obs_clip)
                pred_loss = rnd.errors(x).mean()
            else:  # plain PPO: the RND networks are not run at all
                pred_loss = torch.zeros((), device=device)
            loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss + pred_loss
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            world.all_reduce_gradients(params)
            if args.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            stats += torch.stack([pg_loss, v_loss, entropy, pred_loss, approx_kl, clipfrac, loss]).detach()
    return stats / args.num_minibatches


def train(args: Args, world: World, device: torch.device, run_dir: Path, ckpt: dict | None, derived: dict) -> None:
    is_main = world.rank == 0
    show = args.progress_bar and is_main
    stop = StopFlag()
    rank_seed = args.seed + world.rank

    # Identical initial weights on every rank: same seed for construction, then a broadcast for certainty.
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    start_iteration = ckpt["iteration"] if ckpt else 0
    env_seed = args.seed * 100_003 + world.rank * args.num_envs + start_iteration * 1_000_003
    envs = make_envs(args, args.num_envs, env_seed)
    n_actions = envs.single_action_space.n
    agent = Agent(n_actions, args.rnn_hidden_layers, args.rnn_hidden_size).to(device)
    rnd = RNDModel().to(device)
    params = [p for p in list(agent.parameters()) + list(rnd.parameters()) if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=args.adam_eps)
    obs_rms = RunningMeanStd((84, 84), device)
    reward_rms = RunningMeanStd((), device)
    filter_state = torch.zeros(args.num_envs, device=device)
    recent_returns: deque = deque(maxlen=args.target_score_window)
    history = {"step": [], "avg_return": [], "int_reward": [], "eval_step": [], "eval_return": [], "eval_rooms": []}
    rooms_seen: set = set()
    global_step = 0
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        rnd.load_state_dict(ckpt["rnd"])
        optimizer.load_state_dict(ckpt["optimizer"])
        obs_rms.load_state_dict(ckpt["obs_rms"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        if ckpt["filter_state"].shape == filter_state.shape:
            filter_state = ckpt["filter_state"].to(device)
        recent_returns.extend(ckpt["recent_returns"])
        history, rooms_seen, global_step = ckpt["history"], set(ckpt["rooms_seen"]), ckpt["global_step"]
        set_rng_states(ckpt["rng"])
        if world.rank:  # the snapshot holds rank 0's RNG; the other ranks diverge from it
            torch.manual_seed(rank_seed + 7 * start_iteration)
            np.random.seed(rank_seed + 7 * start_iteration)
    else:
        world.broadcast_parameters(agent)
        world.broadcast_parameters(rnd)
        torch.manual_seed(rank_seed)  # action sampling and minibatch order differ between ranks
        np.random.seed(rank_seed)
        random.seed(rank_seed)

    writer = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter

        if args.track:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=vars(args), name=run_dir.name, save_code=True, resume="allow", id=run_dir.name)
        writer = SummaryWriter(str(run_dir), flush_secs=10)
        if not ckpt:
            writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
        else:
            print(f"resumed {run_dir} from iteration {start_iteration} (global step {global_step})", flush=True)

    def snapshot(iteration: int):
        if is_main:
            save_checkpoint(run_dir, {
                "iteration": iteration, "global_step": global_step, "agent": agent.state_dict(), "rnd": rnd.state_dict(),
                "optimizer": optimizer.state_dict(), "obs_rms": obs_rms.state_dict(), "reward_rms": reward_rms.state_dict(),
                "filter_state": filter_state.cpu(), "recent_returns": list(recent_returns), "history": history,
                "rooms_seen": sorted(rooms_seen), "rng": rng_states(), "args": dataclasses.asdict(args),
            }, args.keep_checkpoints)

    def run_eval(iteration: int, episodes: int):
        video = run_dir / "videos" / f"eval_{global_step:010d}.mp4" if args.capture_video else None
        result = evaluate(agent, args, episodes, device, seed=args.seed + 10_000 + iteration, video_path=video)
        for r in result["rooms"]:
            rooms_seen.update(r)
        if result["returns"]:
            writer.add_scalar("eval/episodic_return", float(np.mean(result["returns"])), global_step)
            writer.add_scalar("eval/visited_rooms", float(np.mean([len(r) for r in result["rooms"]])), global_step)
            writer.add_scalar("charts/visited_rooms", len(rooms_seen), global_step)
            history["eval_step"].append(global_step)
            history["eval_return"].append(float(np.mean(result["returns"])))
            history["eval_rooms"].append(len(rooms_seen))
        return result

    # Observation normaliser from a random agent (skipped on resume: the snapshot holds the statistics).
    if not ckpt:
        t0 = time.perf_counter()
        if not init_obs_normalization(envs, obs_rms, args, world, stop, show):
            print("interrupted during the observation-normalisation warm-up; nothing to save", file=sys.stderr)
            envs.close()
            return
        warmup_s = time.perf_counter() - t0
        warmup_steps = args.num_iterations_obs_norm_init * args.num_steps * args.num_envs * world.size
        if writer is not None:
            writer.add_scalar("charts/obs_norm_warmup_seconds", warmup_s, 0)
            print(f"obs-norm warm-up: {warmup_steps} random steps in {warmup_s:.1f} s "
                  f"({warmup_steps / max(warmup_s, 1e-9):.0f} steps/s)", flush=True)

    T, N = args.num_steps, args.num_envs
    # Frames are stored channels-last (T, N, 84, 84, 4): a minibatch of env slices is one contiguous index_select
    # that the networks read as an NHWC view, instead of gathering NCHW frames and converting each minibatch.
    obs_buf = torch.zeros((T, N, 84, 84, 4), dtype=torch.uint8, device=device)
    next_frames = torch.zeros((T, N, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((T, N), dtype=torch.long, device=device)
    logprobs = torch.zeros((T, N), device=device)
    ext_rewards = torch.zeros((T, N), device=device)
    firsts = torch.zeros((T, N), device=device)
    v_ext_buf = torch.zeros((T, N), device=device)
    v_int_buf = torch.zeros((T, N), device=device)

    obs_np, _ = envs.reset(seed=np.arange(env_seed, env_seed + N, dtype=np.int64))  # same start with or without warm-up
    next_obs = torch.tensor(obs_np, device=device)
    next_first = torch.ones(N, device=device)
    state = agent.initial_state(N, device)
    ep_ret, ep_len = np.zeros(N), np.zeros(N, dtype=np.int64)

    num_iterations = derived["num_iterations"]
    sps_start = None
    stop_reason = "budget"
    iteration = start_iteration
    bar = progress(num_iterations * derived["batch_size"], "training", show, initial=global_step)
    while iteration < num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
        state0 = state.clone()
        # ---- rollout: the only host<->device traffic per step is the actions out and the frames in ----
        for step in range(T):
            obs_buf[step] = next_obs.permute(0, 2, 3, 1)
            firsts[step] = next_first
            with torch.no_grad():
                logits, v_e, v_i, state = agent(next_obs[None], state, next_first[None])
                dist_ = Categorical(logits=logits)
                action = dist_.sample()
            actions[step], logprobs[step] = action, dist_.log_prob(action)
            v_ext_buf[step], v_int_buf[step] = v_e, v_i
            envs.send(action.cpu().numpy())
            o, r, term, trunc, info = envs.recv()
            done = term | trunc
            last = o[:, -1].copy()
            if done.any():
                last[done] = info["final_obs"][done, -1]  # the bonus is on the true last frame, not the reset one
            next_frames[step] = torch.from_numpy(last).to(device, non_blocking=True)
            next_obs = torch.tensor(o, device=device)
            next_first = torch.as_tensor(done, dtype=torch.float32, device=device)
            ext_rewards[step] = torch.as_tensor(np.sign(r), dtype=torch.float32, device=device)
            ep_ret += r
            ep_len += 1
            for i in np.flatnonzero(done):
                recent_returns.append(float(ep_ret[i]))
                if writer is not None:
                    step_i = global_step + (step + 1) * N * world.size
                    writer.add_scalar("charts/episodic_return", ep_ret[i], step_i)
                    writer.add_scalar("charts/episodic_length", ep_len[i], step_i)
                ep_ret[i], ep_len[i] = 0.0, 0
        global_step += derived["batch_size"]

        # ---- intrinsic rewards: update the frame statistics, then score the rollout with the pre-update predictor ----
        flat_frames = next_frames.view(T * N, 84, 84)
        obs_rms.update(flat_frames, world)
        mean32, var32 = obs_rms.mean.float(), obs_rms.var.float()
        with torch.no_grad():
            if args.int_coef != 0:  # frames stay uint8 in memory and are whitened chunk by chunk
                raw_int = torch.cat([
                    rnd.errors(normalize_frames(c, mean32, var32, args.obs_clip)) for c in flat_frames.split(4096)
                ]).view(T, N)
            else:
                raw_int = torch.zeros_like(ext_rewards)
            filtered, filter_state = discounted_reward_filter(raw_int, filter_state, args.int_gamma)
            reward_rms.update(filtered.reshape(-1), world)  # all T*N values
            int_rewards = raw_int / torch.sqrt(reward_rms.var.float()).clamp_min(1e-8)  # no mean subtraction
            _, next_v_ext, next_v_int, _ = agent(next_obs[None], state, next_first[None])
            ext_adv, ext_ret = compute_gae(ext_rewards, v_ext_buf, firsts, next_v_ext, next_first, args.gamma, args.gae_lambda)
            zeros = torch.zeros_like(firsts)
            int_adv, int_ret = compute_gae(int_rewards, v_int_buf, zeros, next_v_int, zeros[0], args.int_gamma, args.gae_lambda)
            advantages = args.ext_coef * ext_adv + args.int_coef * int_adv

        batch = {
            "obs": obs_buf, "firsts": firsts, "actions": actions, "logprobs": logprobs, "advantages": advantages,
            "ext_returns": ext_ret, "int_returns": int_ret, "next_frames": next_frames, "state0": state0,
            "obs_mean": mean32, "obs_var": var32,
        }
        stats = ppo_update(agent, rnd, optimizer, batch, args, derived, world, params)

        # ---- one host sync per iteration: diagnostics, NaN guard, stop conditions ----
        diag = torch.cat([
            stats,
            torch.stack([
                raw_int.mean(), int_rewards.mean(), int_ret.mean(), ext_ret.mean(), ext_rewards.mean(),
                torch.sqrt(reward_rms.var.float()), explained_variance(v_ext_buf, ext_ret),
                explained_variance(v_int_buf, int_ret),
            ]),
        ]).cpu().numpy()
        if not np.isfinite(diag).all():
            snapshot_note = "the last good snapshot is in checkpoints/"
            print(f"error: non-finite loss at iteration {iteration} ({diag.tolist()}); {snapshot_note}: lower --learning-rate "
                  "or set --max-grad-norm 0.5", file=sys.stderr)
            envs.close()
            raise SystemExit(1)
        flags = torch.tensor([float(stop.raised), sum(recent_returns), len(recent_returns)], dtype=torch.float64, device=device)
        world.all_reduce_sum(flags)  # every rank stops at the same iteration, on the same averaged score
        stop_requested = flags[0].item() > 0
        avg_return = float(flags[1] / flags[2]) if flags[2] > 0 else float("nan")

        if sps_start is None:
            sps_start = (time.perf_counter(), global_step)  # SPS is measured from the end of the first iteration
        sps = (global_step - sps_start[1]) / max(time.perf_counter() - sps_start[0], 1e-9)
        if writer is not None:
            names = ["policy_loss", "value_loss", "entropy", "predictor_loss", "approx_kl", "clipfrac", "total_loss"]
            for k, v in zip(names, diag[:7]):
                writer.add_scalar(f"losses/{k}", v, global_step)
            writer.add_scalar("rnd/predictor_loss", diag[3], global_step)
            for k, v in zip(["intrinsic_reward_raw", "intrinsic_reward", "intrinsic_return", "extrinsic_return",
                             "extrinsic_reward", "intrinsic_return_std"], diag[7:13]):
                writer.add_scalar(f"rnd/{k}", v, global_step)
            writer.add_scalar("losses/explained_variance", diag[13], global_step)
            writer.add_scalar("losses/explained_variance_int", diag[14], global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            if np.isfinite(avg_return):
                writer.add_scalar("charts/avg_episodic_return", avg_return, global_step)
            if global_step > sps_start[1]:
                writer.add_scalar("charts/SPS", sps, global_step)
            writer.flush()
            history["step"].append(global_step)
            history["avg_return"].append(avg_return)
            history["int_reward"].append(float(diag[8]))
            bar.update(derived["batch_size"])
            bar.set_postfix(sps=f"{sps:.0f}", avg_ret=f"{avg_return:.1f}", int_r=f"{diag[8]:.3f}", refresh=False)

        reached = args.target_score is not None and np.isfinite(avg_return) and avg_return >= args.target_score
        if is_main and args.eval_every and iteration % args.eval_every == 0 and iteration < num_iterations:
            run_eval(iteration, args.eval_episodes)
        if reached:
            stop_reason = "target_score"
        if stop_requested or reached or iteration % args.checkpoint_every == 0 or iteration == num_iterations:
            snapshot(iteration)
        if stop_requested:
            if is_main:
                print(f"stopped by signal at iteration {iteration}; snapshot saved, re-run with --run-dir {run_dir} "
                      "to resume", flush=True)
            bar.close()
            envs.close()
            if writer is not None:
                writer.close()
            return
        if reached:
            break
    bar.close()
    envs.close()

    # Every rank must end with the same weights: gather a checksum of each rank's parameters.
    checksums = world.all_gather_object(float(sum(p.double().sum().item() for p in agent.state_dict().values())))
    obs_sums = world.all_gather_object(int(next_obs.sum().item()))
    norm_sums = world.all_gather_object(float(obs_rms.mean.sum().item() + obs_rms.var.sum().item() + reward_rms.var.item()))
    if is_main:
        result = run_eval(iteration, args.eval_episodes)
        finish(args, run_dir, writer, agent, result, history, rooms_seen, recent_returns, global_step, iteration,
               sps if sps_start else float("nan"), stop_reason, derived, checksums, obs_sums, norm_sums)


def finish(args, run_dir, writer, agent, result, history, rooms_seen, recent_returns, global_step, iteration, sps,
           stop_reason, derived, checksums, obs_sums, norm_sums):
    returns = result["returns"]
    if args.save_model:
        torch.save(agent.state_dict(), run_dir / f"{args.exp_name}.cleanrl_model")
    plot_curves(history, run_dir / "curves.png")
    write_json(run_dir / "results.json", {
        "env_id": args.env_id,
        "policy": "gru" if args.rnn_hidden_layers else "cnn",
        "seed": args.seed,
        "world_size": derived["world_size"],
        "num_envs_total": args.num_envs * derived["world_size"],
        "global_step": global_step,
        "frames": global_step * 4,
        "iterations": iteration,
        "stop_reason": stop_reason,
        "eval_episodes": len(returns),
        "eval_mean_return": float(np.mean(returns)) if returns else float("nan"),
        "eval_std_return": float(np.std(returns)) if returns else float("nan"),
        "eval_returns": returns,
        "eval_lengths": result["lengths"],
        "eval_rooms_per_episode": result["rooms"],
        "visited_rooms": len(rooms_seen),
        "rooms_seen": sorted(rooms_seen),
        "train_mean_return": float(np.mean(recent_returns)) if recent_returns else float("nan"),
        "train_episodes_in_mean": len(recent_returns),
        "sps": sps,
        "rank_param_checksums": checksums,
        "rank_obs_checksums": obs_sums,
        "rank_normaliser_checksums": norm_sums,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    if writer is not None:
        writer.close()
    mean = np.mean(returns) if returns else float("nan")
    print(f"done: {global_step} steps, eval return {mean:.1f} over {len(returns)} episodes, "
          f"visited rooms {len(rooms_seen)}, results in {run_dir / 'results.json'}", flush=True)


def eval_only(args: Args, device: torch.device, run_dir: Path, ckpt: dict) -> None:
    saved = ckpt["args"]  # the game, network and env settings the snapshot was trained with
    args = dataclasses.replace(args, **{k: saved[k] for k in (*ARCHITECTURE_ARGS, "sticky_action_prob", "max_episode_frames")})
    n_actions = make_eval_env(args, args.seed).action_space.n
    agent = Agent(n_actions, args.rnn_hidden_layers, args.rnn_hidden_size).to(device)
    agent.load_state_dict(ckpt["agent"])
    video = run_dir / "videos" / "eval_only.mp4" if args.capture_video else None
    result = evaluate(agent, args, args.eval_episodes, device, seed=args.seed + 20_000, video_path=video)
    rooms = set(ckpt["rooms_seen"]).union(*[set(r) for r in result["rooms"]])
    out = {"snapshot_iteration": ckpt["iteration"], "global_step": ckpt["global_step"], "eval_returns": result["returns"],
           "eval_mean_return": float(np.mean(result["returns"])) if result["returns"] else float("nan"),
           "eval_rooms_per_episode": result["rooms"], "visited_rooms": len(rooms)}
    write_json(run_dir / "eval_only.json", out)
    print(json.dumps(out))


def main(args: Args) -> None:
    world = World()
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{world.local_rank % max(torch.cuda.device_count(), 1)}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    try:
        derived = derive(args, world.size)
        check_env_id(args.env_id)
    except UsageError as e:
        fail(str(e))
    keep_freed_memory()
    world.init(device)
    # Rank 0 checks the run dir (resume, finished, corrupt snapshot) and tells the others.
    decision = None
    if world.rank == 0:
        try:
            run_dir, ckpt = prepare_run(args, world)
            decision = ("ok", str(run_dir))
        except UsageError as e:
            decision = ("error", str(e))
    decision = world.broadcast_object(decision)
    if decision[0] == "error":
        if world.rank == 0:
            fail(decision[1])
        raise SystemExit(2)
    run_dir = Path(decision[1])
    if world.rank != 0:
        paths = checkpoint_paths(run_dir)
        ckpt = load_checkpoint(paths[-1]) if paths else None
    if args.eval_only:
        if world.rank == 0:
            eval_only(args, device, run_dir, ckpt)
        return
    if world.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "args.json", {**dataclasses.asdict(args), **derived})
    train(args, world, device, run_dir, ckpt, derived)
    if world.enabled:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(tyro.cli(Args))
