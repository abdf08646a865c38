"""HyPER: model-based inverse RL whose policy learns only inside a learned Gaussian-ensemble world model.

A discriminator f(s, a) (IPM loss + gradient penalty toward 0.4) gives the reward -f. A 7-member Gaussian ensemble
(5 elites) learns Δs from expert + learner transitions (1:1); the actor (TD3+BC hybrid) trains only on model rollouts
started from expert states in a window sliding from the end of the demonstrations back to their start.
Paper: Ren, Swamy, Wu, Bagnell, Choudhury (2024), "Hybrid Inverse Reinforcement Learning", ICML 2024. Defaults: garage
configs (Args holds the mazes'; `--env-id Hopper-v5 --help` shows a MuJoCo id's preset); differences in
docs/mbirl_antmaze.md (PointMaze expert = BFS planner + PD; AntMaze expert = the planner + a goal-reaching Ant
controller trained by mbirl_antmaze_goal_reacher.py (phase 0, SAC); Hopper/Walker2d/Ant/Humanoid: SAC on the siblings'
expert cache, Ant and Humanoid with the reference's truncated observations; ALL real steps are counted).
    python mbirl_antmaze.py --env-id PointMaze_UMaze-v3                   # expert cache + pretraining + HyPER
    python mbirl_antmaze.py --env-id PointMaze_UMaze-v3 --hyper.total-timesteps 5000 --hyper.exploration-steps 500 \
        --hyper.freq-train-model 1000 --hyper.rollout-batch-size 2000 --hyper.updates-per-step 2   # minutes on a CPU
    python mbirl_antmaze.py --env-id PointMaze_UMaze-v3 --run-dir runs/x  # same --run-dir again: resumes
    python mbirl_antmaze.py --eval-only runs/x                            # writes runs/x/evaluations/eval_NNN.json
    python mbirl_antmaze.py --train-goal-reacher --run-dir runs/r --reacher.path controllers/mine.pt  # phase 0
        # (= python mbirl_antmaze_goal_reacher.py --run-dir runs/r --reacher.path controllers/mine.pt)
Run dir: args.json, events, checkpoints/hyper.pt, model_pretrained.pt, policy.pt, results.json, learning_curve.png,
maze.png. Expert cache: {experts_dir}/{env_id}/demos.npz (format: docs/mbirl_antmaze.md) + expert_meta.json."""

import contextlib
import dataclasses
import datetime as dt
import io
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

with contextlib.redirect_stderr(io.StringIO()):  # its import prints an Adroit notice that would break one-line errors
    import gymnasium_robotics
gym.register_envs(gymnasium_robotics)
SCRIPT = "mbirl_antmaze.py"
GOAL_RADIUS = 0.45  # Gymnasium-Robotics' success test (D4RL used 0.5)
REAL_ENVS = 5  # real episodes run side by side (evaluation, the discriminator's); a PointMaze env takes ~0.7 s to build
MAZE_FAMILIES = {"PointMaze_": "pointmaze", "AntMaze_": "antmaze"}
MUJOCO_IDS = ("Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")  # the locomotion ids with a termination function
# Ant and Humanoid observe what the reference's model-based runs do: qpos[2:] and qvel, no contact forces or inertias
# (27-D and 45-D, the first entries of gymnasium's full observation, so the shared cache's demos are cut to them).
_HUMANOID_EXTRAS = ("cinert", "cvel", "qfrc_actuator", "cfrc_ext")
TRUNCATED_OBS = {
    "Ant-v5": {"include_cfrc_ext_in_observation": False},
    "Humanoid-v5": {f"include_{name}_in_observation": False for name in _HUMANOID_EXTRAS},
}


def ranged(default, lo: float, hi: float):
    """A setting's default and the range [lo, hi] it must lie in (checked before any work: exit 2)."""
    return field(default=default, metadata={"range": (lo, hi)})


@dataclass
class ExpertArgs:
    """Phase 1 - expert data: the shared cache, your own npz, or the PointMaze planner + PD expert."""

    experts_dir: str = "experts"
    """cache shared with the sibling scripts: {experts_dir}/{env_id}/demos.npz and expert_meta.json"""
    path: str | None = None
    """a demos.npz of your own (format in docs/mbirl_antmaze.md), or minari:DATASET_ID for a downloaded Minari maze
    dataset (e.g. minari:D4RL/antmaze/umaze-v1 with --env-id AntMaze_UMaze-v4); overrides the cache"""
    num_demos: int | None = ranged(None, 1, 1e6)
    """expert episodes the planner generates when the cache is empty (reset seeds 0, 1, ...; default 64); data that
    exist (the cache, --expert.path) holding another number of episodes: exit 2, never a silent mismatch"""
    kp: float = ranged(10.0, 0, 1e4)
    """PD controller's position gain (D4RL maze2d's)"""
    kd: float = ranged(1.0, 0, 1e4)
    """PD controller's velocity gain"""
    waypoint_jitter: float = ranged(0.2, 0, 0.5)
    """intermediate waypoints move by U(-j, j) x maze scaling in x and y"""
    action_noise: float = ranged(0.1, 0, 1)
    """std of Gaussian noise added to the expert's actions (executed and stored); 0 = none"""
    only: bool = False
    """make (or check) the expert data of the cache or --expert.path, then exit 0: no run dir, no training"""
    reacher_reach: float = ranged(1.0, 0.01, 100)
    """AntMaze: the waypoint offset handed to the Ant controller is clipped to this many m (it was trained on goals
    up to 6 m away; a nearer target makes it walk slower and fall less, see docs/mbirl_antmaze.md)"""


@dataclass
class ModelArgs:
    """Phase 2 - the Gaussian-ensemble dynamics model: (pre)training and elites."""

    ensemble_size: int = ranged(7, 1, 64)
    """members of the Gaussian ensemble"""
    num_elites: int = ranged(5, 1, 64)
    """members with the lowest validation MSE, used for rollouts"""
    hidden: int = ranged(200, 1, 8192)
    """width of each member's hidden layers (Walker2d too; Hopper/Ant/Humanoid 400)"""
    layers: int = ranged(4, 1, 16)
    """hidden layers per member"""
    clip_output: float = ranged(0.0, 0, 1e6)
    """clamp the predicted Δstate means to [-x, x]; 0 = off (Ant and Walker2d 40, as the reference)"""
    lr: float = ranged(3e-4, 1e-12, 1)
    """Adam learning rate"""
    cosine_lr: bool = True
    """the loop's retrainings anneal the learning rate on the reference's cosine (to 1e-9 over 30,000 minibatches and
    back, counted across retrainings; Walker2d too; Hopper/Ant/Humanoid off, as the reference)"""
    weight_decay: float = ranged(5e-5, 0, 1)
    """Adam weight decay"""
    batch_size: int = ranged(256, 1, 1e6)
    """minibatch per member"""
    val_ratio: float = ranged(0.2, 1e-6, 0.9)
    """validation fraction (density-binned over (x, y) for pretraining, random for retraining)"""
    patience: int = ranged(10, 1, 1e6)
    """epochs without a 1 % validation improvement of any member before training stops"""
    max_epochs: int = ranged(0, 0, 1e9)
    """cap on epochs per (re)training; 0 = no cap (train until patience, as the reference)"""
    pretrain_max_epochs: int | None = ranged(None, 0, 1e9)
    """cap on the pretraining's epochs alone (default: --model.max-epochs; 0 = to patience)"""
    pretrain_bins: int = ranged(50, 1, 10_000)
    """bins per axis of the (x, y) histogram of the pretraining split"""
    pretrain: bool = True
    """pretrain the model on the expert data before the loop (the reference's antmaze recipe; MuJoCo ids off)"""


@dataclass
class HyperArgs:
    """Phase 3 - the HyPER loop: real steps, model retraining, model rollouts, actor updates."""

    total_timesteps: int = ranged(150_000, 1, 1e10)
    """real env steps of the learner (the discriminator's real rollouts are counted separately, and reported)"""
    exploration_steps: int = ranged(10_000, 0, 1e10)
    """first real steps without model or policy updates, counted in the budget unlike the reference (MuJoCo ids
    1,000); 0 = none"""
    bc_init_steps: int = ranged(10_000, 0, 1e10)
    """behaviour-cloning updates of the TD3+BC actor (mazes) before any real step; 0 = none"""
    freq_train_model: int = ranged(2000, 1, 1e10)
    """retrain the model on the hybrid buffer and refill the model rollouts every this many real steps (MuJoCo ids
    125)"""
    rollout_batch_size: int = ranged(50_000, 1, 1e8)
    """start states per rollout refill (reference antmaze: 800,000)"""
    rollout_schedule: str = "20,100,1,25"
    """rollout length: 'e0,e1,l0,l1' goes from l0 at epoch e0 to l1 at epoch e1 (epochs of epoch_length steps;
    Humanoid 20,300,1,25)"""
    epoch_length: int = ranged(1000, 1, 1e10)
    """real steps per epoch of the rollout schedule"""
    retain_epochs: int = ranged(2, 1, 1000)
    """epochs of rollout refills kept in the learner buffer (MuJoCo ids 1)"""
    window: float = ranged(0.1, 1e-6, 1)
    """width of the sliding backward window over expert time, as a fraction of the demo horizon"""
    updates_per_step: int = ranged(20, 0, 10_000)
    """actor updates per real step (Hopper/Ant 30, Walker2d/Humanoid 10); 0 = none"""
    p_tremble: float = ranged(0.0, 0, 1)
    """trembling hand: probability of a uniform random action in real steps, discriminator rollouts and evaluation
    (MuJoCo ids 0.01)"""


@dataclass
class ActorArgs:
    """Phase 3 - the actor: TD3+BC hybrid on mazes, SAC on the MuJoCo locomotion ids."""

    hidden: int = ranged(256, 1, 8192)
    """width of the two hidden layers of actor and critics (TD3+BC; SAC: Hopper 512, Walker2d/Ant/Humanoid 1024)"""
    lr: float = ranged(3e-4, 1e-12, 1)
    """actor and critic learning rate (Walker2d/Ant/Humanoid 1e-4)"""
    lr_decay: int = ranged(0, 0, 1e10)
    """SAC: the learning rate falls linearly to ~0 over this many updates and restarts, with fresh optimisers, at
    each discriminator update (the reference's schedule_actor_lr; Walker2d/Humanoid 10,000); 0 = off"""
    weight_decay: float = ranged(1e-4, 0, 1)
    """actor and critic weight decay"""
    gamma: float = ranged(0.99, 0, 0.9999)
    """discount factor"""
    tau: float = ranged(0.005, 1e-9, 1)
    """target smoothing coefficient"""
    policy_noise: float = ranged(0.2, 0, 10)
    """target policy smoothing noise"""
    noise_clip: float = ranged(0.5, 0, 10)
    """clip of the target smoothing noise"""
    policy_freq: int = ranged(2, 1, 1000)
    """actor and target updates every this many critic updates"""
    bc_alpha: float = ranged(2.5, 0, 1e6)
    """TD3+BC: lambda = alpha / mean|Q|"""
    expl_noise: float = ranged(0.1, 0, 10)
    """Gaussian action noise in real steps and model rollouts"""
    batch_size: int = ranged(256, 2, 1e6)
    """minibatch: half model rollouts, half expert transitions"""
    grad_clip: float = ranged(1.0, 0, 1e6)
    """critic gradient-norm clip; 0 = off"""


@dataclass
class DiscArgs:
    """Phase 3 - the discriminator f(s, a); the policy's reward is -f."""

    every: int = ranged(100, 1, 1e10)
    """real learner steps between discriminator updates (Ant 200, other MuJoCo ids 1,000)"""
    lr: float = ranged(8e-3, 1e-12, 10)
    """lr0; update k uses lr0 / k with a fresh Adam (MuJoCo ids 8e-4)"""
    batch_size: int = ranged(4096, 1, 1e7)
    """expert and learner (s, a) pairs per step"""
    trajectories: int = ranged(4, 1, 10_000)
    """fresh real trajectories per update (their steps are counted in disc_env_steps)"""
    gp_weight: float = ranged(10.0, 0, 1e6)
    """gradient-penalty weight"""
    gp_target: float = ranged(0.4, 0, 1e3)
    """gradient-penalty target norm"""
    hidden: int = ranged(256, 1, 8192)
    """width of the two hidden layers"""
    ensemble: int = ranged(1, 1, 64)
    """members; f is their minimum, so the reward -f is optimistic (MuJoCo ids 7)"""


@dataclass
class ReacherArgs:
    """AntMaze - the goal-reaching Ant controller that makes the expert data (phase 0: trained by
    mbirl_antmaze_goal_reacher.py, or this script with --train-goal-reacher)."""

    path: str = "controllers/ant_goal_reacher.pt"
    """the controller (relative paths start at this script's folder): read to make AntMaze expert data; written by
    --train-goal-reacher at every evaluation that beats the best so far (never by a new run over an existing file)"""


@dataclass
class EvalArgs:
    """Phase 4 - evaluation, logging, checkpoints."""

    frequency: int = ranged(10_000, 1, 1e10)
    """evaluate every this many real steps (and at the end)"""
    episodes: int = ranged(25, 1, 1e5)
    """evaluation episodes, reset seeds seed + 10000, +1, ... (mazes: success = goal within 0.45; MuJoCo ids 10,
    return)"""
    log_frequency: int = ranged(1000, 1, 1e10)
    """TensorBoard scalars every this many real steps"""


@dataclass
class Args:
    exp_name: str = "mbirl_antmaze"
    """the name of this experiment"""
    seed: int = ranged(1, 0, 2**31 - 1)
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, CUDA is used when available"""
    track: bool = False
    """if toggled, track with Weights and Biases (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the wandb entity"""
    capture_video: bool = False
    """record the final evaluation's first episode to videos/ (VP9 WebM)"""
    save_model: bool = True
    """write policy.pt at the end"""
    env_id: str = "PointMaze_UMaze-v3"
    """PointMaze_*, AntMaze_* (expert data from the Ant controller of --reacher.path, or --expert.path),
    Hopper-v5, Walker2d-v5, Ant-v5 or Humanoid-v5 (these on the siblings' SAC expert cache)"""
    run_dir: str | None = None
    """run directory; default runs/{env_id}__{exp_name}__{seed}__{unix_time}; an existing one is resumed"""
    train_goal_reacher: bool = False
    """train the Ant goal-reaching controller (phase 0) and write it to --reacher.path; no HyPER: runs
    mbirl_antmaze_goal_reacher.py with the other flags (its --help lists them)"""
    eval_only: str | None = None
    """evaluate RUN_DIR/policy.pt and write RUN_DIR/evaluations/eval_NNN.json; no training"""
    torch_threads: int = ranged(0, 0, 1024)
    """CPU threads for torch; 0 = torch's default"""
    checkpoint_every: int = ranged(5000, 1, 1e10)
    """checkpoint every this many real steps (and on SIGINT/SIGTERM)"""
    expert: ExpertArgs = field(default_factory=ExpertArgs)
    model: ModelArgs = field(default_factory=ModelArgs)
    hyper: HyperArgs = field(default_factory=HyperArgs)
    actor: ActorArgs = field(default_factory=ActorArgs)
    disc: DiscArgs = field(default_factory=DiscArgs)
    reacher: ReacherArgs = field(default_factory=ReacherArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)


class UsageError(Exception):
    """Bad input: main prints one line and exits 2."""


class NonFiniteLoss(Exception):
    """A loss became NaN/inf: main prints one line and exits 3."""


class AlreadyFinished(Exception):
    """The run dir holds a finished run with the same settings: main prints its one line and exits 0."""


# --------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------
class GaussianEnsemble(nn.Module):
    """E MLP members as ONE batched module: weights (E, in, out), baddbmm, SiLU; each member outputs
    the mean and a log-variance softly bounded to [min_logvar, max_logvar] of Δstate. Inputs are
    normalised (statistics in float64)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        ensemble_size: int = 7,
        hidden: int = 200,
        layers: int = 4,
        min_logvar: float = -10.0,
        max_logvar: float = 0.5,
        clip_output: float | None = 0.0,
    ):
        super().__init__()
        sizes = [in_dim] + [hidden] * layers + [2 * out_dim]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(ensemble_size, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.zeros(ensemble_size, 1, fan_out)))
        self.register_buffer("in_mean", torch.zeros(in_dim))
        self.register_buffer("in_std", torch.ones(in_dim))
        self.out_dim, self.min_logvar, self.max_logvar, self.clip_output = out_dim, min_logvar, max_logvar, clip_output

    def set_normaliser(self, inputs: torch.Tensor) -> None:
        x = inputs.double()
        self.in_mean.copy_(x.mean(0).float())
        self.in_std.copy_(x.std(0).clamp_min(1e-6).float())

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, in) for every member, or (M, B, in) one slice per member.
        Returns mean, logvar: (M, B, out)."""
        ws = [w if members is None else w[members] for w in self.weights]
        bs = [b if members is None else b[members] for b in self.biases]
        h = (x - self.in_mean) / self.in_std
        if h.dim() == 2:
            h = h.unsqueeze(0).expand(ws[0].shape[0], -1, -1)
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = torch.baddbmm(b, h, w)
            if i < len(ws) - 1:
                h = F.silu(h)
        mean, logvar = h.split(self.out_dim, dim=-1)
        if self.clip_output:  # the reference's model_clip_output (Ant, Walker2d; None or 0: off)
            mean = mean.clamp(-self.clip_output, self.clip_output)
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        return mean, self.min_logvar + F.softplus(logvar - self.min_logvar)


class Actor(nn.Module):
    """Deterministic TD3 actor: obs -> h -> h ReLU -> tanh (the maze action box is [-1, 1])."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, act_dim),
            nn.Tanh(),
        )
        self.config = {"obs_dim": obs_dim, "act_dim": act_dim, "hidden": hidden}
        self.env_id = ""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """A batch of flat observations (numpy) -> a batch of actions (numpy)."""
        device = next(self.parameters()).device
        return self(torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=device)).cpu().numpy()

    def rollout_action(self, obs: torch.Tensor, noise: float, generator=None) -> torch.Tensor:
        act = self(obs)
        return (act + noise * torch.randn(act.shape, generator=generator).to(act)).clamp(-1, 1)


class GaussianActor(nn.Module):
    """SAC actor (the reference's MuJoCo HyPER actor): obs -> h -> h ReLU, mean and log-std heads,
    tanh squash to [-1, 1], xavier init. act() is deterministic (tanh of the mean)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mean, self.log_std = nn.Linear(hidden, act_dim), nn.Linear(hidden, act_dim)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        self.config = {"obs_dim": obs_dim, "act_dim": act_dim, "hidden": hidden}
        self.env_id = ""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mean(self.trunk(obs)))

    def sample(self, obs: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised tanh-Gaussian action and its log-probability."""
        h = self.trunk(obs)
        mean, log_std = self.mean(h), self.log_std(h).clamp(-20, 2)
        eps = torch.randn_like(mean) if generator is None else torch.randn(mean.shape, generator=generator).to(mean)
        y = torch.tanh(mean + log_std.exp() * eps)
        logp = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi) - torch.log(1 - y.pow(2) + 1e-6)).sum(-1)
        return y, logp

    act = Actor.act

    def rollout_action(self, obs: torch.Tensor, noise: float, generator=None) -> torch.Tensor:  # noqa: ARG002
        return self.sample(obs, generator)[0]


class TwinQ(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()

        def q():
            return nn.Sequential(
                nn.Linear(obs_dim + act_dim, hidden),
                nn.ReLU(),
                nn.Linear(hidden, hidden),
                nn.ReLU(),
                nn.Linear(hidden, 1),
            )

        self.q1, self.q2 = q(), q()

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sa = torch.cat([obs, act], -1)
        return self.q1(sa).squeeze(-1), self.q2(sa).squeeze(-1)


class Discriminator(nn.Module):
    """f(s, a): `members` MLPs h-h ReLU -> scalar with orthogonal weights (reference); f is the
    MINIMUM over members, so the policy's reward -f is optimistic (the reference's
    DiscriminatorEnsemble; 1 member on antmaze)."""

    def __init__(self, in_dim: int, hidden: int = 256, members: int = 1):
        super().__init__()

        def mlp():
            net = nn.Sequential(
                nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )
            for m in net:
                if isinstance(m, nn.Linear):
                    nn.init.orthogonal_(m.weight)
            return net

        self.nets = nn.ModuleList(mlp() for _ in range(members))

    def forward(self, sa: torch.Tensor) -> torch.Tensor:
        return torch.stack([net(sa).squeeze(-1) for net in self.nets]).min(0).values


# --------------------------------------------------------------------------------------------------
# Environments: mazes with a flat observation (state, then the 2-D goal) that end at the goal
# --------------------------------------------------------------------------------------------------
def env_family(env_id: str) -> str | None:
    """'pointmaze', 'antmaze', 'mujoco' or None (unsupported)."""
    if env_id in MUJOCO_IDS:
        return "mujoco"
    return next((fam for prefix, fam in MAZE_FAMILIES.items() if env_id.startswith(prefix)), None)


def goal_dims(env_id: str) -> int:
    """Trailing observation entries that are the goal (constant within an episode, not predicted by
    the model)."""
    return 0 if env_family(env_id) == "mujoco" else 2


class FlatMazeObs(gym.ObservationWrapper):
    """Dict observation -> flat vector that starts with (x, y) and ends with the goal: PointMaze
    [observation (x, y, vx, vy), goal] = 6-D; AntMaze [achieved_goal (x, y), observation (qpos[2:],
    qvel) = 27, goal] = 31-D (D4RL's 29-D ant observation + goal, the reference's layout)."""

    def __init__(self, env: gym.Env, prepend_xy: bool):
        super().__init__(env)
        self.prepend_xy = prepend_xy
        dim = env.observation_space["observation"].shape[0] + 2 + 2 * prepend_xy
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float64)

    def observation(self, obs: dict) -> np.ndarray:
        parts = [obs["achieved_goal"]] if self.prepend_xy else []
        return np.concatenate(parts + [obs["observation"], obs["desired_goal"]])


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """The maze with `continuing_task=False` (episodes end when the goal is within 0.45) and a fixed
    goal; AntMaze v5 without the 78 contact forces (27-D ant observation, as the D4RL/Minari
    data)."""
    if env_family(env_id) == "mujoco":
        env = gym.make(env_id, render_mode=render_mode, **TRUNCATED_OBS.get(env_id, {}))
        bounded = np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)
        unit = np.ones(env.action_space.shape, np.float32)
        return env if bounded else gym.wrappers.RescaleAction(env, -unit, unit)  # Humanoid's +-0.4
    kwargs = {"continuing_task": False, "reset_target": False, "render_mode": render_mode}
    ant = env_family(env_id) == "antmaze"
    if ant and not env_id.endswith("-v4"):
        kwargs["include_cfrc_ext_in_observation"] = False
    env = gym.make(env_id, **kwargs)
    xml = getattr(env.unwrapped, "tmp_xml_file_path", None)
    # AntMaze leaves its generated maze XML in the temp dir; it is loaded already
    if xml and os.path.exists(xml):
        os.remove(xml)
    return FlatMazeObs(env, prepend_xy=ant)


def mujoco_data(env: gym.Env):
    u = env.unwrapped
    return (u.ant_env if hasattr(u, "ant_env") else u.point_env if hasattr(u, "point_env") else u).data


# --------------------------------------------------------------------------------------------------
# The expert: shortest path over maze cells, jittered waypoints, PD controller
# --------------------------------------------------------------------------------------------------
def free_cells(maze_map: list[list]) -> np.ndarray:
    """Boolean grid: True where the cell is not a wall (walls are 1; free cells are 0 or
    'r'/'g'/'c')."""
    return np.array([[not (isinstance(v, (int, np.integer)) and v == 1) for v in row] for row in maze_map])


def bfs_path(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
    """Shortest 4-connected path of cells from start to goal (both included); [] if unreachable."""
    previous = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (cell[0] + dr, cell[1] + dc)
            inside = 0 <= nxt[0] < free.shape[0] and 0 <= nxt[1] < free.shape[1]
            if inside and free[nxt] and nxt not in previous:
                previous[nxt] = cell
                queue.append(nxt)
    if goal not in previous:
        return []
    path = [goal]
    while path[-1] != start:
        path.append(previous[path[-1]])
    return path[::-1]


def plan_waypoints(maze, start_xy: np.ndarray, goal_xy: np.ndarray, rng: np.random.Generator, jitter: float):
    """Centres of the path's cells after the start cell, jittered, then the exact goal."""
    free = free_cells(maze.maze_map)
    start = tuple(int(v) for v in maze.cell_xy_to_rowcol(start_xy))
    goal = tuple(int(v) for v in maze.cell_xy_to_rowcol(goal_xy))
    cells = bfs_path(free, start, goal)[1:-1]
    scale = maze.maze_size_scaling
    points = [maze.cell_rowcol_to_xy(np.array(c)) + rng.uniform(-jitter, jitter, 2) * scale for c in cells]
    return np.array(points + [np.asarray(goal_xy)], dtype=np.float64)


def pd_action(pos: np.ndarray, vel: np.ndarray, waypoint: np.ndarray, kp: float, kd: float) -> np.ndarray:
    return np.clip(kp * (waypoint - pos) - kd * vel, -1.0, 1.0)


class PlannerPD:
    """D4RL maze2d's expert: waypoints from the shortest cell path, a PD controller toward the
    current one, and Gaussian action noise. PointMaze only (an Ant needs a learned goal-reaching
    controller: PlannerAnt)."""

    def __init__(self, e: ExpertArgs, rng: np.random.Generator):
        self.e, self.rng = e, rng

    def reset(self, maze, obs: np.ndarray) -> None:
        self.maze, self.k = maze, 0
        self.waypoints = plan_waypoints(maze, obs[:2], obs[-2:], self.rng, self.e.waypoint_jitter)

    def waypoint(self, obs: np.ndarray) -> np.ndarray:
        """The current waypoint; the next one once within 0.45 cells of it."""
        near = np.linalg.norm(self.waypoints[self.k] - obs[:2]) < GOAL_RADIUS * self.maze.maze_size_scaling
        if self.k < len(self.waypoints) - 1 and near:
            self.k += 1
        return self.waypoints[self.k]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        action = pd_action(obs[:2], obs[2:4], self.waypoint(obs), self.e.kp, self.e.kd)
        return np.clip(action + self.e.action_noise * self.rng.standard_normal(2), -1, 1)


# the controller's input: the 27-D ant observation + the goal offset in the torso's frame
REACHER_OBS = 29


def torso_yaw(quat: np.ndarray) -> np.ndarray:
    """Heading of MuJoCo (w, x, y, z) quaternions (..., 4)."""
    w, x, y, z = np.moveaxis(quat, -1, 0)
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def reacher_obs(ant: np.ndarray, xy: np.ndarray, goal: np.ndarray, max_dist: float) -> np.ndarray:
    """The controller's input: the 27-D ant observation (qpos[2:], qvel; ant[1:5] is the torso
    quaternion) and the goal offset rotated into the torso's heading frame, clipped to max_dist (a
    far goal reads as 'that way')."""
    yaw, d = torso_yaw(ant[..., 1:5]), goal - xy
    c, s = np.cos(yaw), np.sin(yaw)
    local = np.stack([c * d[..., 0] + s * d[..., 1], c * d[..., 1] - s * d[..., 0]], -1)
    norm = np.linalg.norm(local, axis=-1, keepdims=True)
    local = local * np.minimum(1.0, max_dist / np.maximum(norm, 1e-9))
    return np.concatenate([ant, local], -1).astype(np.float32)


class PlannerAnt(PlannerPD):
    """D4RL antmaze's expert: the same waypoints, each handed to the goal-reaching Ant controller
    (phase 0) as 'walk to this offset'; Gaussian action noise on top. Observation [x, y, ant (27),
    goal]."""

    def __init__(self, e: ExpertArgs, rng: np.random.Generator, reacher: "GaussianActor"):
        super().__init__(e, rng)
        self.reacher = reacher

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = reacher_obs(obs[2:29], obs[:2], self.waypoint(obs), min(self.e.reacher_reach, self.reacher.max_dist))
        action = self.reacher.act(x[None])[0]
        return np.clip(action + self.e.action_noise * self.rng.standard_normal(action.shape), -1, 1)


DEMO_DTYPES = {
    "observations": np.float32,
    "actions": np.float32,
    "next_observations": np.float32,
    "rewards": np.float32,
    "terminals": bool,
    "timeouts": bool,
    "episode_ids": np.int64,
    "episode_starts": bool,
    "timesteps": np.int64,
    "qpos": np.float64,
    "qvel": np.float64,
    "qacc_warmstart": np.float64,
    "goal": np.float64,
}  # the columns of demos.npz (docs/mbirl_antmaze.md)


def record_episodes(env_id: str, controller, num_episodes: int, stop=None) -> dict[str, np.ndarray] | None:
    """Roll out `controller` (reset(maze, obs), __call__(obs) -> action) for complete episodes with
    reset seeds 0, 1, ...; record the shared npz layout plus the MuJoCo state before every step and
    the goal. None when `stop()` turns true (asked every step: a signal is answered at once; the
    episodes are made again, the same, by the next run)."""
    env = make_env(env_id)
    keys = tuple(DEMO_DTYPES)
    rows, returns = {k: [] for k in keys}, []
    for ep in range(num_episodes):
        obs, _ = env.reset(seed=ep)
        controller.reset(getattr(env.unwrapped, "maze", None), obs)
        ret, t, done = 0.0, 0, False
        while not done:
            if stop is not None and stop():
                env.close()
                return None
            action = np.asarray(controller(obs), dtype=np.float32)
            data = mujoco_data(env)
            state = (data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy())
            next_obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            timeout = truncated and not terminated
            values = (obs, action, next_obs, reward, terminated, timeout, ep, t == 0, t, *state, obs[-2:])
            for key, v in zip(keys, values):
                rows[key].append(v)
            ret, obs, t = ret + float(reward), next_obs, t + 1
        returns.append(ret)
    env.close()
    demos = {k: np.asarray(v, dtype=DEMO_DTYPES[k]) for k, v in rows.items()}
    demos.update(returns=np.asarray(returns), seeds=np.arange(num_episodes, dtype=np.int64), env_id=np.array(env_id))
    return demos


def make_expert_data(env_id: str, e: ExpertArgs, seed: int, reacher=None, stop=None) -> dict[str, np.ndarray] | None:
    """Maze expert data for `num_demos` episodes: the planner + PD controller (PointMaze) or + the
    goal-reaching Ant controller (AntMaze); None when `stop()` turned true."""
    rng = np.random.default_rng(seed)
    controller = PlannerPD(e, rng) if reacher is None else PlannerAnt(e, rng, reacher)
    return record_episodes(env_id, controller, e.num_demos, stop)


# --------------------------------------------------------------------------------------------------
# The math, as pure functions
# --------------------------------------------------------------------------------------------------
def gaussian_nll(mean: torch.Tensor, logvar: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-member Gaussian NLL without the constant: mean over rows and dims of (mu - y)^2 e^-logvar
    + logvar. mean, logvar: (E, B, D); target: (B, D) or (E, B, D) -> (E,)."""
    return ((mean - target).pow(2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2))


def select_elites(val_scores: torch.Tensor, num_elites: int) -> torch.Tensor:
    """Indices of the `num_elites` members with the lowest validation score, in increasing index
    order."""
    return torch.sort(torch.argsort(val_scores)[:num_elites]).values


def density_binned_split(xy: np.ndarray, bins: int, val_ratio: float, rng: np.random.Generator):
    """The reference's pretraining split: a bins x bins histogram over (x, y); from every occupied
    bin, int(val_ratio * count) of its points (drawn at random) go to validation. Returns
    (train_idx, val_idx)."""
    _, ex, ey = np.histogram2d(xy[:, 0], xy[:, 1], bins=bins)
    bx = np.clip(np.digitize(xy[:, 0], ex[1:-1]), 0, bins - 1)
    by = np.clip(np.digitize(xy[:, 1], ey[1:-1]), 0, bins - 1)
    bin_of = bx * bins + by
    val = []
    for b in np.unique(bin_of):
        members = np.flatnonzero(bin_of == b)
        val.append(rng.choice(members, int(val_ratio * len(members)), replace=False))
    val_idx = np.sort(np.concatenate(val)) if val else np.zeros(0, np.int64)
    train_idx = np.setdiff1d(np.arange(len(xy)), val_idx)
    return train_idx, val_idx


def sliding_window_columns(progress: float, horizon: int, width: float) -> tuple[int, int]:
    """Expert time steps [lo, hi) that model rollouts start from at training progress in [0, 1]: the
    window [(1 - p) H, (1 - p + width) H) slides from the demos' end back to their start (at least
    one column)."""
    lo = min(int((1.0 - progress) * horizon), horizon - 1)
    hi = min(horizon, int((1.0 - progress + width) * horizon))
    return lo, max(hi, lo + 1)


def coin_flip_source(rng: np.random.Generator, reset_ratio: float = 0.5) -> str:
    """MuJoCo rule of the reference: ONE coin per refill picks expert or policy states for the whole
    batch."""
    return "expert" if rng.random() < reset_ratio else "policy"


def rollout_length_at(epoch: int, schedule: tuple[int, int, int, int]) -> int:
    """mbrl-lib's schedule: l0 until epoch e0, linear to l1 at epoch e1, l1 after."""
    e0, e1, l0, l1 = schedule
    frac = min(max((epoch - e0) / max(1, e1 - e0), 0.0), 1.0)
    return int(l0 + frac * (l1 - l0))


def cosine_lr(lr: float, batches: int, period: int = 30_000, floor: float = 1e-9) -> float:
    """The reference's model learning rate (CosineAnnealingLR, T_max 30,000, stepped per minibatch
    and never reset): lr at 0 batches, the floor at `period`, lr again at 2 x period."""
    return floor + (lr - floor) * (1.0 + math.cos(math.pi * batches / period)) / 2.0


def linear_decay_lr(lr: float, updates: int, horizon: int) -> float:
    """The reference's SAC learning rate `updates` updates after its last restart: lr x
    (1 - updates / horizon), never below lr x 1e-8."""
    return lr * max(1.0 - updates / horizon, 1e-8)


def no_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Mazes: model rollouts never terminate (reference: antmaze uses no_termination)."""
    return torch.zeros(next_obs.shape[0], dtype=torch.bool, device=next_obs.device)


def hopper_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper-v5 unhealthy: height <= 0.7, |angle| >= 0.2 or any |obs[1:]| >= 100 (or
    non-finite)."""
    height, angle = next_obs[:, 0], next_obs[:, 1]
    healthy = (height > 0.7) & (angle.abs() < 0.2) & (next_obs[:, 1:].abs() < 100).all(-1)
    return ~(healthy & torch.isfinite(next_obs).all(-1))


def walker2d_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Walker2d-v5 unhealthy: height outside (0.8, 2.0) or angle outside (-1, 1)."""
    height, angle = next_obs[:, 0], next_obs[:, 1]
    healthy = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~(healthy & torch.isfinite(next_obs).all(-1))


def ant_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Ant-v5 unhealthy: torso height (obs[0] = qpos[2]) outside [0.2, 1.0], or a non-finite
    state."""
    healthy = (next_obs[:, 0] >= 0.2) & (next_obs[:, 0] <= 1.0)
    return ~(healthy & torch.isfinite(next_obs).all(-1))


def humanoid_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Humanoid-v5 unhealthy: torso height (obs[0] = qpos[2]) outside (1.0, 2.0) (or a non-finite
    prediction)."""
    healthy = (next_obs[:, 0] > 1.0) & (next_obs[:, 0] < 2.0)
    return ~(healthy & torch.isfinite(next_obs).all(-1))


def termination_fn(env_id: str):
    """The hand-written done function model rollouts use (the reference's termination_fns)."""
    fns = {"Hopper-v5": hopper_termination, "Walker2d-v5": walker2d_termination, "Ant-v5": ant_termination}
    return {**fns, "Humanoid-v5": humanoid_termination}.get(env_id, no_termination)


def goal_reached(xy: np.ndarray, goal: np.ndarray, radius: float = GOAL_RADIUS) -> np.ndarray:
    return np.linalg.norm(np.asarray(xy) - np.asarray(goal), axis=-1) <= radius


def gradient_penalty(
    f, x_expert: torch.Tensor, x_learner: torch.Tensor, alpha: torch.Tensor, target: float
) -> torch.Tensor:
    x_hat = (alpha * x_expert + (1 - alpha) * x_learner).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(x_hat).sum(), x_hat, create_graph=True)
    return (grad.norm(2, dim=-1) - target).pow(2).mean()


def discriminator_loss(f, x_expert, x_learner, alpha, gp_weight: float = 10.0, gp_target: float = 0.4):
    """E_expert[f] - E_learner[f] + gp_weight * penalty: f low on expert pairs, so -f rewards
    expert-like pairs."""
    ipm = f(x_expert).mean() - f(x_learner).mean()
    return ipm + gp_weight * gradient_penalty(f, x_expert, x_learner, alpha, gp_target), ipm


def td3_target(reward, done, next_q1, next_q2, gamma: float) -> torch.Tensor:
    return reward + gamma * (1.0 - done) * torch.min(next_q1, next_q2)


def td3bc_actor_loss(q: torch.Tensor, pi: torch.Tensor, data_action: torch.Tensor, alpha: float) -> torch.Tensor:
    """TD3+BC: -lambda * mean Q(s, pi(s)) + MSE(pi(s), a) with lambda = alpha / mean|Q| (no gradient
    through lambda)."""
    lam = alpha / q.abs().mean().detach().clamp_min(1e-6)
    return -lam * q.mean() + F.mse_loss(pi, data_action)


def tremble(action: np.ndarray, rng: np.random.Generator, p: float, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Trembling hand: with probability p the whole action is replaced by a uniform random one."""
    if p > 0 and rng.random() < p:
        return rng.uniform(low, high).astype(action.dtype)
    return action


# --------------------------------------------------------------------------------------------------
# Buffers
# --------------------------------------------------------------------------------------------------
class Buffer:
    """A ring of transitions (obs, act, next_obs, done[, reward]) as one float tensor of rows.
    HyPER's buffers hold no reward (the discriminator relabels every batch); the goal reacher's
    does."""

    def __init__(self, obs_dim: int, act_dim: int, capacity: int, device: torch.device, reward: bool = False):
        self.obs_dim, self.act_dim, self.capacity, self.reward = obs_dim, act_dim, capacity, reward
        self.rows = torch.zeros(capacity, 2 * obs_dim + act_dim + 1 + reward, device=device)
        self.size, self.ptr = 0, 0

    def add(self, obs, act, next_obs, done, reward=None) -> None:
        """A batch of transitions (tensors with a leading batch dimension)."""
        cols = [obs, act, next_obs, done.float().unsqueeze(-1)] + ([reward.unsqueeze(-1)] if self.reward else [])
        batch = torch.cat(cols, -1).to(self.rows)
        idx = (self.ptr + torch.arange(len(batch), device=self.rows.device)) % self.capacity
        self.rows[idx] = batch[-self.capacity :] if len(batch) > self.capacity else batch
        self.ptr, self.size = (self.ptr + len(batch)) % self.capacity, min(self.capacity, self.size + len(batch))

    def split(self, rows: torch.Tensor):
        o, a = self.obs_dim, self.act_dim
        parts = (rows[:, :o], rows[:, o : o + a], rows[:, o + a : 2 * o + a], rows[:, 2 * o + a])
        return parts + (rows[:, -1],) if self.reward else parts

    def sample(self, n: int, generator: torch.Generator | None = None):
        idx = torch.randint(self.size, (n,), generator=generator).to(self.rows.device)
        return self.split(self.rows[idx])

    def all(self):
        return self.split(self.rows[: self.size])

    def load_rows(self, rows: torch.Tensor) -> None:
        self.size = min(len(rows), self.capacity)
        self.rows[: self.size] = rows[-self.size :].to(self.rows)
        self.ptr = self.size % self.capacity

    def ring(self) -> dict:
        """The filled rows (a CPU copy) and the write position: what load_ring restores exactly."""
        return {"rows": self.rows[: self.size].to("cpu", copy=True), "ptr": self.ptr}

    def load_ring(self, ring: dict) -> None:
        self.size, self.ptr = len(ring["rows"]), ring["ptr"]
        self.rows[: self.size] = ring["rows"].to(self.rows)


def add_hybrid_step(hybrid: Buffer, policy: Buffer, learner_row: tuple, expert: Buffer, generator) -> None:
    """One real step fills the buffers 1:1 (LAMPS): the learner transition goes to the hybrid and
    policy buffers, and one uniformly drawn expert transition joins it in the hybrid buffer."""
    hybrid.add(*learner_row)
    policy.add(*learner_row)
    hybrid.add(*expert.sample(1, generator))


def padded_reset_states(demos: dict) -> np.ndarray:
    """Expert observations as (episodes, H, obs_dim), H = the longest demo; shorter demos repeat
    their final next-observation (the reference pads by repeating states)."""
    ids = demos["episode_ids"]
    lengths = np.bincount(ids)
    out = np.zeros((len(lengths), lengths.max(), demos["observations"].shape[1]), np.float32)
    for e in range(len(lengths)):
        rows = np.flatnonzero(ids == e)
        out[e, : len(rows)] = demos["observations"][rows]
        out[e, len(rows) :] = demos["next_observations"][rows[-1]]
    return out


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------
def model_io(obs, act, next_obs, goal: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Model input (s, a) and target Δstate, where the state is the observation without its `goal`
    last entries."""
    d = obs.shape[1] - goal
    return torch.cat([obs, act], -1), next_obs[:, :d] - obs[:, :d]


def train_ensemble(
    model: GaussianEnsemble,
    inputs,
    targets,
    train_idx,
    val_idx,
    m: ModelArgs,
    generator,
    log=None,
    stop=None,
    cosine_from: int | None = None,
):
    """Bootstrap minibatches per member (Adam, NLL) until no member improves its validation MSE by
    1 % for `patience` epochs (or max_epochs, or `stop()` turns true: asked every minibatch, an
    epoch cut short is not scored); every member keeps its best weights; elites = lowest validation
    MSE. `cosine_from`: minibatches already run on the cosine learning-rate schedule (None: off)."""
    model.set_normaliser(inputs[train_idx])
    # a tensor lr and capturable Adam: a CUDA graph can replay the step
    cuda = inputs.device.type == "cuda"
    lr = torch.tensor(m.lr, device=inputs.device)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=m.weight_decay, capturable=cuda)
    # read once per epoch: no sync per batch
    finite = torch.ones((), dtype=torch.bool, device=inputs.device)

    def step(idx, size):  # noqa: ARG001 - one minibatch; `size` keys the graph (an epoch's last batch is shorter)
        mean, logvar = model(inputs[idx])
        loss = gaussian_nll(mean, logvar, targets[idx]).sum()
        finite.logical_and_(torch.isfinite(loss))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    graphs = CudaGraphs(step, cuda)
    if len(val_idx) == 0:  # too few points to hold any out: score on the training split
        val_idx = train_idx
    x_val, y_val = inputs[val_idx], targets[val_idx]
    E, n = model.weights[0].shape[0], len(train_idx)
    best = torch.full((E,), float("inf"))
    best_params = [p.detach().clone() for p in model.parameters()]
    epoch, since_improved, history, batches = 0, 0, [], 0
    while since_improved < m.patience and (m.max_epochs == 0 or epoch < m.max_epochs) and not (stop and stop()):
        # bootstrap indices of every member, one copy to the device per epoch
        boot = train_idx[torch.randint(n, (E, n), generator=generator)].to(inputs.device)
        finite.fill_(True)
        cut = False
        for start in range(0, n, m.batch_size):
            cut = bool(stop and stop())  # a signal is answered within one minibatch (an epoch can take minutes)
            if cut:
                break
            idx = boot[:, start : start + m.batch_size]
            if cosine_from is not None:
                lr.fill_(cosine_lr(m.lr, cosine_from + batches))
            batches += 1
            graphs(idx.shape[1], (idx,))
        if not finite:
            raise NonFiniteLoss(f"model training: non-finite NLL in epoch {epoch + 1}; check the expert data")
        if cut:
            break
        with torch.no_grad():
            mean, logvar = model(x_val)
            val_mse = (mean - y_val).pow(2).mean(dim=(1, 2)).cpu()
            val_nll = gaussian_nll(mean, logvar, y_val).cpu()
        improved = val_mse < best * (1.0 - 0.01)  # a 1 % improvement (the reference's threshold)
        for p, saved in zip(model.parameters(), best_params):
            saved[improved] = p.detach()[improved]
        best = torch.where(improved, val_mse, best)
        since_improved = 0 if improved.any() else since_improved + 1
        epoch += 1
        history.append({"epoch": epoch, "val_mse": float(val_mse.mean()), "val_nll": float(val_nll.mean())})
        if log is not None:
            log(history[-1])
    with torch.no_grad():
        for p, saved in zip(model.parameters(), best_params):
            p.copy_(saved)
    elites = select_elites(best, m.num_elites)
    # ended neither by patience nor by the cap: by stop()
    stopped = since_improved < m.patience and (m.max_epochs == 0 or epoch < m.max_epochs)
    info = dict(epochs=epoch, batches=batches, val_mse=best.tolist(), elites=elites.tolist(), history=history)
    return elites, info | {"stopped": stopped}


@torch.no_grad()
def model_rollout(
    model: GaussianEnsemble,
    elites: torch.Tensor,
    actor: Actor,
    start_obs: torch.Tensor,
    length: int,
    expl_noise: float,
    done_fn,
    generator=None,
    goal: int = 2,
    stop=None,
):
    """Batched rollouts in the model: each row's next state comes from a uniformly random elite
    (rows are shuffled and split into one equal group per elite, so only the elites run), sampled
    from its Gaussian; the goal is kept. Actions: the actor's (TD3: plus N(0, expl_noise^2); SAC:
    sampled). Rows that terminate stop. None when `stop()` turns true (asked every rollout step)."""
    obs, out = start_obs, []
    k = len(elites)
    for _ in range(length):
        if stop is not None and stop():
            return None
        act = actor.rollout_action(obs, expl_noise, generator)
        x = torch.cat([obs, act], -1)
        B = len(x)
        per = -(-B // k)
        perm = torch.randperm(B, generator=generator).to(x.device)
        idx = torch.cat([perm, perm[: per * k - B]])
        mean, logvar = model(x[idx].view(k, per, -1), members=elites)
        delta = torch.empty(B, mean.shape[-1], device=x.device)
        noise = torch.randn(mean.shape, generator=generator).to(mean)
        delta[idx] = (mean + torch.exp(0.5 * logvar) * noise).reshape(-1, mean.shape[-1])
        d = obs.shape[1] - goal
        next_obs = torch.cat([obs[:, :d] + delta, obs[:, d:]], -1)
        done = done_fn(next_obs)
        out.append((obs, act, next_obs, done))
        obs = next_obs[~done]
        if len(obs) == 0:
            break
    return [torch.cat(parts) for parts in zip(*out)]


class TD3BC:
    """TD3+BC in the reference's hybrid mode: every minibatch is half model rollouts and half expert
    transitions, rewards relabelled by the current discriminator, and the BC term covers the whole
    batch."""

    def __init__(self, obs_dim: int, act_dim: int, a: ActorArgs, device: torch.device):
        self.actor = Actor(obs_dim, act_dim, a.hidden).to(device)
        self.critic = TwinQ(obs_dim, act_dim, a.hidden).to(device)
        self.actor_target = Actor(obs_dim, act_dim, a.hidden).to(device)
        self.critic_target = TwinQ(obs_dim, act_dim, a.hidden).to(device)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critic_target.load_state_dict(self.critic.state_dict())
        # capturable: the optimisers keep their step counts on the GPU (CudaGraphs)
        cuda = device.type == "cuda"
        self.actor_opt = torch.optim.Adam(
            self.actor.parameters(), lr=a.lr, weight_decay=a.weight_decay, capturable=cuda
        )
        self.critic_opt = torch.optim.Adam(
            self.critic.parameters(), lr=a.lr, weight_decay=a.weight_decay, capturable=cuda
        )
        self.a, self.updates, self.graphs = a, 0, CudaGraphs(self._update, cuda)

    def bc_update(self, obs, act) -> torch.Tensor:
        loss = F.mse_loss(self.actor(obs), act)
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_opt.step()
        self.actor_target.load_state_dict(self.actor.state_dict())
        return loss.detach()

    def update(self, obs, act, next_obs, done, reward) -> dict[str, torch.Tensor]:
        self.updates += 1
        # the actor and the targets move every policy_freq
        policy_step = self.updates % self.a.policy_freq == 0
        return self.graphs(policy_step, (obs, act, next_obs, done, reward))

    def _update(self, obs, act, next_obs, done, reward, policy_step: bool) -> dict[str, torch.Tensor]:
        a = self.a
        with torch.no_grad():
            noise = (torch.randn_like(act) * a.policy_noise).clamp(-a.noise_clip, a.noise_clip)
            next_act = (self.actor_target(next_obs) + noise).clamp(-1, 1)
            target = td3_target(reward, done, *self.critic_target(next_obs, next_act), a.gamma)
        q1, q2 = self.critic(obs, act)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        if a.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.critic.parameters(), a.grad_clip)
        self.critic_opt.step()
        out = {"critic_loss": critic_loss.detach(), "q": q1.detach().mean()}
        if policy_step:
            pi = self.actor(obs)
            actor_loss = td3bc_actor_loss(self.critic(obs, pi)[0], pi, act, a.bc_alpha)
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
            with torch.no_grad():
                for net, tgt in ((self.actor, self.actor_target), (self.critic, self.critic_target)):
                    for p, tp in zip(net.parameters(), tgt.parameters()):
                        tp.lerp_(p, a.tau)
            out["actor_loss"] = actor_loss.detach()
        return out

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        action = self.actor.act(obs[None])[0]
        return np.clip(action + self.a.expl_noise * rng.standard_normal(action.shape), -1, 1).astype(np.float32)

    def state_dict(self) -> dict:
        return {
            k: getattr(self, k).state_dict()
            for k in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt")
        } | {"updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        for k in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt"):
            getattr(self, k).load_state_dict(state[k])
        self.updates = state["updates"]
        # loading sets capturable as saved (a checkpoint from the other kind of device)
        for opt in (self.actor_opt, self.critic_opt):
            opt.param_groups[0]["capturable"] = self.graphs.enabled
        # new optimiser state tensors: capture again
        self.graphs = CudaGraphs(self._update, self.graphs.enabled)


class SAC:
    """SAC on model rollouts (the reference's MuJoCo HyPER actor, pranz24-style): tanh-Gaussian
    actor, twin critics, entropy temperature tuned toward -|A|. Same interface as TD3BC."""

    def __init__(self, obs_dim: int, act_dim: int, a: ActorArgs, device: torch.device):
        self.actor = GaussianActor(obs_dim, act_dim, a.hidden).to(device)
        self.critic = TwinQ(obs_dim, act_dim, a.hidden).to(device)
        self.critic_target = TwinQ(obs_dim, act_dim, a.hidden).to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.log_alpha = torch.zeros(1, device=device, requires_grad=True)
        # a tensor the optimisers (and a CUDA graph) read: the lr decay
        self.lr = torch.tensor(a.lr, device=device)
        # capturable: the optimisers keep their step counts on the GPU (CudaGraphs)
        self.cuda = device.type == "cuda"
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=a.lr, capturable=self.cuda)
        self.a, self.target_entropy, self.updates = a, -float(act_dim), 0
        self.restart_schedule()

    def restart_schedule(self) -> None:
        """The reference's schedule_actor_lr restart (after each discriminator update): fresh actor
        and critic optimisers at the full learning rate (fused: ~10 % per update on a CPU)."""
        self.lr.fill_(self.a.lr)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=self.lr, fused=True, capturable=self.cuda)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=self.lr, fused=True, capturable=self.cuda)
        # new state: capture again
        self.since_restart, self.graphs = 0, CudaGraphs(self._update, self.cuda)

    def update(self, obs, act, next_obs, done, reward) -> dict[str, torch.Tensor]:
        if self.a.lr_decay:
            self.lr.fill_(linear_decay_lr(self.a.lr, self.since_restart, self.a.lr_decay))
        out = self.graphs(0, (obs, act, next_obs, done, reward))
        self.updates += 1
        self.since_restart += 1
        return out

    def _update(self, obs, act, next_obs, done, reward, key=None) -> dict[str, torch.Tensor]:  # noqa: ARG002
        a, alpha = self.a, self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = self.actor.sample(next_obs)
            q1t, q2t = self.critic_target(next_obs, next_act)
            target = reward + a.gamma * (1.0 - done) * (torch.min(q1t, q2t) - alpha * next_logp)
        q1, q2 = self.critic(obs, act)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        if a.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.critic.parameters(), a.grad_clip)
        self.critic_opt.step()
        pi, logp = self.actor.sample(obs)
        self.critic.requires_grad_(False)  # the actor's loss needs no critic weight gradients
        actor_loss = (alpha * logp - torch.min(*self.critic(obs, pi))).mean()
        self.critic.requires_grad_(True)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.critic_target.parameters()):
                tp.lerp_(p, a.tau)
        losses = {"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach()}
        return losses | {"q": q1.detach().mean(), "alpha": alpha.squeeze()}

    def explore(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # noqa: ARG002
        with torch.no_grad():
            device = self.log_alpha.device
            return self.actor.sample(torch.as_tensor(obs[None], dtype=torch.float32, device=device))[0][0].cpu().numpy()

    def state_dict(self) -> dict:
        parts = ("actor", "critic", "critic_target", "actor_opt", "critic_opt", "alpha_opt")
        return {k: getattr(self, k).state_dict() for k in parts} | {
            "log_alpha": self.log_alpha.detach(),
            "updates": self.updates,
            "since_restart": self.since_restart,
        }

    def load_state_dict(self, state: dict) -> None:
        for k in ("actor", "critic", "critic_target", "actor_opt", "critic_opt", "alpha_opt"):
            getattr(self, k).load_state_dict(state[k])
        # loading replaces these settings
        for opt in (self.actor_opt, self.critic_opt, self.alpha_opt):
            opt.param_groups[0]["capturable"] = self.cuda
        for opt in (self.actor_opt, self.critic_opt):
            opt.param_groups[0]["lr"] = self.lr
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.updates, self.since_restart = state["updates"], state["since_restart"]
        # new optimiser state tensors: capture again
        self.graphs = CudaGraphs(self._update, self.cuda)


def collect_real_trajectories(envs: list[gym.Env], actor: Actor, n: int, seed: int, rng, p_tremble: float, stop=None):
    """n complete real episodes (reset seeds seed, seed + 1, ...) with the deterministic actor and
    the trembling hand, run side by side on the envs so the actor acts on one batch per step (one
    call, not one per env: on a GPU each call is a round trip). -> (s, a) pairs, steps, (x, y)
    paths, terminations (mazes: the goal was reached), returns; None once stop() says so."""
    pairs, paths, terminations, returns = [[] for _ in range(n)], [None] * n, [False] * n, [0.0] * n
    obs, episode, started = [None] * len(envs), [None] * len(envs), 0
    low, high = envs[0].action_space.low, envs[0].action_space.high
    while True:
        for j in range(len(envs)):  # a free env starts the next episode
            if episode[j] is None and started < n:
                obs[j], episode[j] = envs[j].reset(seed=seed + started)[0], started
                paths[started], started = [obs[j][:2].copy()], started + 1
        live = [j for j in range(len(envs)) if episode[j] is not None]
        if not live:
            break
        if stop is not None and stop():  # (a signal, asked once per step of the envs)
            return None
        actions = actor.act(np.stack([obs[j] for j in live]))
        for j, action in zip(live, actions):
            i, action = episode[j], tremble(action, rng, p_tremble, low, high)
            pairs[i].append(np.concatenate([obs[j], action]))
            obs[j], reward, terminated, truncated, _ = envs[j].step(action)
            paths[i].append(obs[j][:2].copy())
            returns[i] += float(reward)
            if terminated or truncated:
                terminations[i], episode[j] = bool(terminated), None
    flat = np.array([x for p in pairs for x in p], np.float32)
    return flat, len(flat), [np.array(p) for p in paths], terminations, returns


def update_discriminator(
    disc: Discriminator, k: int, expert_sa: torch.Tensor, learner_sa: torch.Tensor, d: DiscArgs, generator
) -> dict[str, float]:
    """One step with a FRESH Adam at lr0 / k on batch_size expert vs batch_size learner pairs (with
    replacement)."""
    opt = torch.optim.Adam(disc.parameters(), lr=d.lr / max(1, k))
    xe = expert_sa[torch.randint(len(expert_sa), (d.batch_size,), generator=generator)]
    xl = learner_sa[torch.randint(len(learner_sa), (d.batch_size,), generator=generator)]
    alpha = torch.rand(d.batch_size, 1, generator=generator).to(xe)
    loss, ipm = discriminator_loss(disc, xe, xl, alpha, d.gp_weight, d.gp_target)
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"discriminator: non-finite loss at update {k}; lower --disc.lr")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"disc_loss": float(loss.detach()), "ipm": float(ipm.detach())}


def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, p_tremble: float, stop=None) -> dict | None:
    """Deterministic episodes ending at the goal: success rate (goal within 0.45), returns and
    paths (None when stop() cut it short)."""
    envs = [make_env(env_id) for _ in range(min(episodes, REAL_ENVS))]
    rng = np.random.default_rng(seed)
    real = collect_real_trajectories(envs, actor, episodes, seed, rng, p_tremble, stop)
    for env in envs:
        env.close()
    if real is None:
        return None
    _, steps, paths, successes, returns = real
    return {
        "success_rate": float(np.mean(successes)) if env_family(env_id) != "mujoco" else None,
        "mean_return": float(np.mean(returns)),
        "returns": returns,
        "episode_lengths": [len(p) - 1 for p in paths],
        "paths": [p.tolist() for p in paths],
        "steps": steps,
    }


def pretrain_model(
    demos: dict, obs_dim: int, act_dim: int, m: ModelArgs, device, generator, rng, goal: int = 2, stop=None
):
    """The ensemble on the expert data with the density-binned split over (x, y) and patience as
    intended (10)."""
    model = GaussianEnsemble(
        obs_dim + act_dim, obs_dim - goal, m.ensemble_size, m.hidden, m.layers, clip_output=m.clip_output
    )
    model = model.to(device)
    t = {
        k: torch.as_tensor(demos[k], dtype=torch.float32, device=device)
        for k in ("observations", "actions", "next_observations")
    }
    inputs, targets = model_io(t["observations"], t["actions"], t["next_observations"], goal)
    train_idx, val_idx = density_binned_split(demos["observations"][:, :2], m.pretrain_bins, m.val_ratio, rng)
    # pretraining from scratch may need more epochs than a warm retraining
    if m.pretrain_max_epochs is not None:
        m = dataclasses.replace(m, max_epochs=m.pretrain_max_epochs)

    def log(h):  # to patience this can take many minutes: show it is moving
        if h["epoch"] % 10 == 0:
            print(f"[model] pretraining epoch {h['epoch']}: val MSE {h['val_mse']:.3e}", flush=True)

    elites, info = train_ensemble(
        model, inputs, targets, torch.as_tensor(train_idx), torch.as_tensor(val_idx), m, generator, log, stop
    )
    print(
        f"[model] pretrained {info['epochs']} epochs, {len(train_idx)} train / {len(val_idx)} val (density-binned), "
        f"val MSE of elites {np.mean([info['val_mse'][i] for i in info['elites']]):.2e}"
        + (" (stopped early by a signal: the best weights so far are kept and used)" if info["stopped"] else ""),
        flush=True,
    )
    return model, elites, info


@dataclass
class HyperState:
    """What HyPER learns and keeps; a checkpoint holds it (less the model rollouts) with the loop's
    counters."""

    model: GaussianEnsemble
    elites: torch.Tensor
    agent: TD3BC | SAC
    disc: Discriminator
    expert: Buffer  # the demonstrations
    hybrid: Buffer  # the model's data: expert transitions, then learner and expert transitions 1:1
    policy: Buffer  # the learner's real transitions
    learner: Buffer  # model rollouts: the actor's data


def make_hyper_state(args: Args, demos: dict, model, elites, obs_dim: int, act_dim: int, device) -> HyperState:
    h, maze = args.hyper, env_family(args.env_id) != "mujoco"
    agent = (TD3BC if maze else SAC)(obs_dim, act_dim, args.actor, device)
    disc = Discriminator(obs_dim + act_dim, args.disc.hidden, args.disc.ensemble).to(device)
    keys = ("observations", "actions", "next_observations", "terminals")
    expert = Buffer(obs_dim, act_dim, len(demos["observations"]), device)
    expert.add(*(torch.as_tensor(demos[k], dtype=torch.float32, device=device) for k in keys))
    hybrid = Buffer(obs_dim, act_dim, expert.size + 2 * h.total_timesteps, device)
    hybrid.add(*expert.all())
    policy = Buffer(obs_dim, act_dim, h.total_timesteps, device)
    longest = max(int(v) for v in h.rollout_schedule.split(",")[2:])
    # refills the learner buffer keeps
    refills = h.retain_epochs * max(1, h.epoch_length // h.freq_train_model)
    learner = Buffer(obs_dim, act_dim, refills * h.rollout_batch_size * longest, device)
    return HyperState(model, elites, agent, disc, expert, hybrid, policy, learner)


def retrain_model(s: HyperState, c: dict, args: Args, gen, stop) -> dict | None:
    """Step 2a: the ensemble on the whole hybrid buffer (a random validation split); new elites.
    None when a signal stopped it."""
    o, a, no, _ = s.hybrid.all()
    inputs, targets = model_io(o, a, no, goal_dims(args.env_id))
    perm = torch.randperm(len(inputs), generator=gen)
    n_val = int(args.model.val_ratio * len(inputs))
    cosine_from = c["model_batches"] if args.model.cosine_lr else None
    s.elites, info = train_ensemble(
        s.model, inputs, targets, perm[n_val:], perm[:n_val], args.model, gen, stop=stop, cosine_from=cosine_from
    )
    if info["stopped"]:
        return None
    c["model_trainings"] += 1
    c["model_batches"] += info["batches"]
    out = {"model_lr": cosine_lr(args.model.lr, c["model_batches"])} if args.model.cosine_lr else {}
    return out | {"model_epochs": info["epochs"], "model_val_mse": float(np.mean(info["val_mse"]))}


def refill_rollouts(s: HyperState, args: Args, step: int, reset_states: torch.Tensor, gen, rng, stop=None) -> dict:
    """Step 2b: model rollouts into the learner buffer, started from expert states in the window
    sliding back over expert time (mazes) or from expert OR policy states (MuJoCo: one coin flip per
    refill, as the reference)."""
    h = args.hyper
    if env_family(args.env_id) != "mujoco":
        lo, hi = sliding_window_columns(step / h.total_timesteps, reset_states.shape[1], h.window)
        rows = torch.randint(reset_states.shape[0], (h.rollout_batch_size,), generator=gen)
        cols = torch.randint(lo, hi, (h.rollout_batch_size,), generator=gen)
        start, out = reset_states[rows, cols], {"window_lo": lo, "window_hi": hi}
    else:
        source = s.expert if coin_flip_source(rng) == "expert" or s.policy.size == 0 else s.policy
        start = source.sample(h.rollout_batch_size, gen)[0]
        out = {"rollout_from_expert": float(source is s.expert)}
    length = rollout_length_at(step // h.epoch_length, tuple(int(v) for v in h.rollout_schedule.split(",")))
    t0 = time.perf_counter()
    rollouts = model_rollout(
        s.model,
        s.elites,
        s.agent.actor,
        start,
        length,
        args.actor.expl_noise,
        termination_fn(args.env_id),
        gen,
        goal_dims(args.env_id),
        stop,
    )
    if rollouts is None:  # a signal: nothing added
        return None
    # (the rollout's own early stop syncs with the device, so the clock is honest)
    s.learner.add(*rollouts)
    return out | {"rollout_length": length, "rollout_sps": len(rollouts[0]) / (time.perf_counter() - t0)}


def model_phase(s: HyperState, c: dict, args: Args, step: int, reset_states, gen, rng, stop) -> dict | None:
    """Step 2: retrain the model (2a), refill the model rollouts (2b). None when a signal stopped either: the
    model, elites, generators and counters are put back as they were, so the resumed run redoes step 2 from the
    same point (resume is exact) while the signal is answered within one minibatch or rollout step."""
    model = {k: v.clone() for k, v in s.model.state_dict().items()}
    before = model, s.elites, gen.get_state(), rng.bit_generator.state, c["model_trainings"], c["model_batches"]
    trained = retrain_model(s, c, args, gen, stop)
    rolled = None if trained is None else refill_rollouts(s, args, step, reset_states, gen, rng, stop)
    if rolled is None:
        s.model.load_state_dict(before[0])
        s.elites, rng.bit_generator.state = before[1], before[3]
        gen.set_state(before[2])
        c["model_trainings"], c["model_batches"] = before[4], before[5]
        return None
    return trained | rolled


def update_actor(s: HyperState, args: Args, gen, timed: bool) -> dict:
    """Step 3: updates_per_step actor updates on model rollouts (mazes: half model rollouts, half
    expert transitions, the reference's TD3+BC hybrid), rewards -f relabelled by the current
    discriminator. The step's minibatches are drawn and relabelled at once (f is fixed
    until step 4)."""
    U, B = args.hyper.updates_per_step, args.actor.batch_size
    maze = env_family(args.env_id) != "mujoco"
    n_model = B // 2 if maze else B
    t0, out = time.perf_counter(), {}
    batch = [x.view(U, n_model, *x.shape[1:]) for x in s.learner.sample(U * n_model, gen)]
    if maze:
        ex = s.expert.sample(U * (B - n_model), gen)
        batch = [torch.cat([x, e.view(U, B - n_model, *e.shape[1:])], 1) for x, e in zip(batch, ex)]
    with torch.no_grad():
        rewards = -s.disc(torch.cat(batch[:2], -1))
    for u in range(U):
        out.update(s.agent.update(*(x[u] for x in batch), rewards[u]))
    if U and timed:  # timed at logging steps only (a sync)
        float(out["critic_loss"])
        out["actor_updates_per_s"] = U / (time.perf_counter() - t0)
    return out


def env_generators(env: gym.Env) -> list[np.random.Generator]:
    """The env's random generators (a maze's and its inner Point/Ant env's): what an unseeded reset draws from."""
    u = env.unwrapped
    inner = getattr(u, "ant_env", None) or getattr(u, "point_env", None)
    return [x.np_random for x in (u, inner) if x is not None]


def new_episode(env: gym.Env, c: dict, step: int, seed: int | None = None) -> np.ndarray:
    """Reset the learner's real env (seeded, or from its generators) and note in the counters how, so a resumed
    run can restore the episode in progress (restore_episode)."""
    rng = None if seed is not None else [g.bit_generator.state for g in env_generators(env)]
    c["episode"] = {"start": step, "seed": seed, "rng": rng}
    return env.reset(seed=seed)[0]


def restore_episode(env: gym.Env, c: dict, policy: Buffer, seed: int) -> np.ndarray:
    """The real episode in progress at c["step"], exactly: its reset redone (same seed, or the generators' saved
    states) and its actions (the policy buffer's rows since the episode began) replayed. A checkpoint without the
    record (an older run dir) starts a new episode seeded with seed + step."""
    ep = c.get("episode") or {"start": c["step"], "seed": seed + c["step"], "rng": None}
    if ep["rng"] is not None:
        env.reset(seed=seed)  # creates the generators
        for g, state in zip(env_generators(env), ep["rng"]):
            g.bit_generator.state = state
    obs = new_episode(env, c, ep["start"], ep["seed"])
    c["episode"] = ep
    _, actions, next_obs, _ = policy.split(policy.rows[ep["start"] : c["step"]])
    for action in actions.cpu().numpy():
        obs = env.step(action)[0]
    if len(actions) and not np.array_equal(obs.astype(np.float32), next_obs[-1].cpu().numpy()):
        print("[hyper] warning: the replayed real episode differs from the saved one (another MuJoCo?)", flush=True)
    return obs


def train_hyper(args: Args, demos: dict, model: GaussianEnsemble, elites: torch.Tensor, run: "RunContext"):
    """The HyPER loop (the paper's Algorithm 1). `run` holds the seeded generators, the device, the
    stop flag of SIGINT/SIGTERM, logging, evaluation and checkpoints. Returns (counters, agent), or
    None when interrupted."""
    h, device, gen, rng = args.hyper, run.device, run.generator, run.rng
    s = make_hyper_state(args, demos, model, elites, run.obs_dim, run.act_dim, device)
    c = run.resume(s)
    # 0. Mazes: behaviour cloning of the TD3+BC actor on the expert data before any real step.
    while env_family(args.env_id) != "mujoco" and c["bc_steps"] < h.bc_init_steps:
        if run.stop_requested():  # a signal is answered within one update
            return run.checkpoint(s, c)
        s.agent.bc_update(*s.expert.sample(args.actor.batch_size, gen)[:2])
        c["bc_steps"] += 1
    if run.stop_requested():  # (before the envs are built: a maze takes ~0.7 s each)
        return run.checkpoint(s, c)
    env = make_env(args.env_id)
    disc_envs = [make_env(args.env_id) for _ in range(min(args.disc.trajectories, REAL_ENVS))]
    low, high = env.action_space.low, env.action_space.high
    expert_sa = torch.cat(s.expert.all()[:2], -1)
    reset_states = torch.as_tensor(padded_reset_states(demos), device=device)
    # the real episode: a fresh run's first reset, or a resumed run's episode in progress
    obs = restore_episode(env, c, s.policy, args.seed) if c["step"] else new_episode(env, c, 0, args.seed)
    last = {}
    run.progress_start(h.total_timesteps, c["step"])
    # the starting point (mazes: behaviour-cloned), or the evaluation a signal cut short (redone: the actor it
    # evaluates is the checkpointed one, and an evaluation draws on none of the run's generators)
    pending_eval = c.get("eval_pending") if c["history"] else 0
    if pending_eval is not None and not run.stop_requested():
        run.evaluate(pending_eval, c, s.agent.actor)
    # (pending: a signal stopped step c["step"]'s retraining after its real step; the resumed run redoes the rest)
    while c["step"] < h.total_timesteps or c.get("pending"):
        if run.stop_requested():
            return run.checkpoint(s, c)
        if not c.get("pending"):
            # 1. A real step: its transition and one expert transition join the hybrid buffer.
            action = tremble(s.agent.explore(obs, rng), rng, h.p_tremble, low, high)
            next_obs, _, terminated, truncated, _ = env.step(action)
            row = (obs, action, next_obs, terminated)
            row = tuple(torch.as_tensor(np.asarray(v, np.float32), device=device)[None] for v in row)
            add_hybrid_step(s.hybrid, s.policy, row, s.expert, gen)
            c["step"] = c["step"] + 1
            obs = new_episode(env, c, c["step"]) if terminated or truncated else next_obs
        step, c["pending"] = c["step"], False
        if step > h.exploration_steps:
            # 2. Every freq_train_model steps (but the last): retrain the model, refill rollouts.
            if (step % h.freq_train_model == 0 and step < h.total_timesteps) or s.learner.size == 0:
                done = model_phase(s, c, args, step, reset_states, gen, rng, run.stop_requested)
                if done is None:  # stopped by a signal and undone: redone first when the run resumes
                    c["pending"] = True
                    continue
                last.update(done)
            # 3. The actor learns on model rollouts, rewarded by -f.
            last.update(update_actor(s, args, gen, timed=step % args.eval.log_frequency == 0))
            # 4. The discriminator f on fresh real trajectories of the policy (their steps counted).
            if step % args.disc.every == 0:
                seed, n_traj = args.seed + 1_000_000 + step, args.disc.trajectories
                pairs, n, *_ = collect_real_trajectories(disc_envs, s.agent.actor, n_traj, seed, rng, h.p_tremble)
                c["disc_env_steps"], c["disc_updates"] = c["disc_env_steps"] + n, c["disc_updates"] + 1
                learner_sa = torch.as_tensor(pairs, device=device)
                last.update(update_discriminator(s.disc, c["disc_updates"], expert_sa, learner_sa, args.disc, gen))
                if args.actor.lr_decay:
                    s.agent.restart_schedule()
        run.after_step(step, c, last, s)
    if c.get("eval_pending") is not None:  # the final evaluation, cut short by a signal
        return run.checkpoint(s, c)
    run.checkpoint(s, c)
    return c, s.agent


def main(args: Args) -> None:
    """Expert data -> the model pretrained on it -> the HyPER loop -> the policy and its results."""
    try:
        run = RunContext.validate(args)  # every input checked (and the expert data loaded) first
        if args.eval_only:
            return eval_only(args, run)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except AlreadyFinished as e:
        return print(e)
    if args.expert.only:
        run.listen()
    else:
        run.start()
    try:
        # Phase 1: the expert data (the cache, your file, or the planner makes and caches them).
        demos = run.demos
        if demos is None:
            n, env_id = args.expert.num_demos, args.env_id
            print(f"[expert] planner + {run.controller}: {n} episodes on {env_id}", flush=True)
            demos = make_expert_data(env_id, args.expert, args.seed, run.reacher, run.stop_requested)
            if demos is None:
                again = "the same command" if args.expert.only else f"with --run-dir {run.run_dir}"
                print(f"interrupted while making the expert data (none cached); re-run {again}", file=sys.stderr)
                raise SystemExit(130)
            run.save_expert_cache(demos)
        run.demos_used = demos
        n, rows, score = len(demos["returns"]), len(demos["observations"]), run.expert_score
        print(f"[expert] {n} episodes, {rows} transitions, {run.metric} {score:.2f}", flush=True)
        if args.expert.only:
            source = args.expert.path or run.cache / "demos.npz"
            return print(f"[expert] --expert.only: the expert data are ready in {source}; no run", flush=True)
        # Phase 2: the model, pretrained on the expert data (mazes) unless a run dir holds it.
        model, elites = run.load_pretrained()
        if model is None:
            dims = (run.obs_dim, run.act_dim, args.model)
            setup = (*dims, run.device, run.generator, run.rng, goal_dims(args.env_id))
            model, elites, info = pretrain_model(demos, *setup, stop=run.stop_requested)
            run.save_pretrained(model, elites, info)
        # Phase 3: the HyPER loop.
        out = train_hyper(args, demos, model, elites, run)
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(3)
    if out is None:
        print(f"interrupted: checkpoint saved; re-run with --run-dir {run.run_dir} to resume", file=sys.stderr)
        raise SystemExit(130)
    run.finish(*out, demos)


# ---- run management ----
class RunContext:
    """Validation, run directory, checkpoints, RNG state, logging, plots: what a reader of the algorithm can skip."""

    @classmethod
    def validate(cls, args: Args) -> "RunContext":
        self = cls()
        self.args = args
        paths = {"--run-dir": args.run_dir, "--eval-only": args.eval_only, "--expert.path": args.expert.path}
        paths |= {"--expert.experts-dir": args.expert.experts_dir, "--reacher.path": args.reacher.path}
        empty = [flag for flag, value in paths.items() if value == ""]  # ("" would mean: the default, or the cwd)
        if empty:
            raise UsageError(f"{empty[0]} is empty; pass a path")
        if args.eval_only:
            path = Path(args.eval_only) / "policy.pt"
            if not path.is_file():
                raise UsageError(f"{path} does not exist; pass a finished run dir of {SCRIPT} to --eval-only")
            self.run_dir = Path(args.eval_only)
            try:
                self.policy = load_policy(path)
            except Exception:  # noqa: BLE001 - a truncated or foreign file is bad input
                raise UsageError(f"{path} is not a readable policy.pt of {SCRIPT}; re-run the training") from None
            args.env_id = self.policy.env_id
            check_ranges(args)
            check_writable(self.run_dir / "evaluations", "--eval-only")
            return self
        if args.train_goal_reacher:
            raise UsageError("--train-goal-reacher runs mbirl_antmaze_goal_reacher.py: pass it on the command line")
        retired = retired_env_id(args.env_id)  # (first: an id gymnasium no longer registers, e.g. Hopper-v2, too)
        if retired:
            raise UsageError(f"{args.env_id} is a retired version; use {retired} (--env-id)")
        if args.env_id not in gym.registry:
            import difflib

            close = difflib.get_close_matches(args.env_id, [k for k in gym.registry if "Maze" in k], n=3)
            raise UsageError(
                f"unknown env id {args.env_id!r}; did you mean {', '.join(close) or 'PointMaze_UMaze-v3'}? (--env-id)"
            )
        if env_family(args.env_id) is None:
            raise UsageError(
                f"{args.env_id} is not supported: pass a PointMaze_* or AntMaze_* id, {' or '.join(MUJOCO_IDS)}"
            )
        env = make_env(args.env_id)
        self.obs_dim, self.act_dim = env.observation_space.shape[0], env.action_space.shape[0]
        data = mujoco_data(env)
        self.nq, self.nv = data.qpos.shape[0], data.qvel.shape[0]
        bounded = np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)
        env.close()
        if not bounded:
            raise UsageError(f"{args.env_id}: the actors assume actions in [-1, 1]; pick another --env-id")
        check_numbers(args)
        if not args.exp_name or "/" in args.exp_name or args.exp_name in (".", ".."):  # a part of the run dir's name
            raise UsageError("--exp-name must be a non-empty name without '/' (and not '.' or '..')")
        self.run_dir = Path(args.run_dir or f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        check_path_length(self.run_dir, "--run-dir" if args.run_dir else "--exp-name (in the default run directory)")
        if self.run_dir.exists() and not self.run_dir.is_dir() and not args.expert.only:
            raise UsageError(f"--run-dir {self.run_dir} is a file; pass a directory")
        if not args.expert.only:  # (--expert.only writes no run dir)
            check_run_dir(self.run_dir, SCRIPT, args.env_id, ARTIFACTS, args)
            check_writable(self.run_dir, "--run-dir")
        self.cache = Path(args.expert.experts_dir) / args.env_id
        check_path_length(self.cache, "--expert.experts-dir")
        if args.expert.path and not args.expert.path.startswith(MINARI):
            check_path_length(Path(args.expert.path), "--expert.path")
        path = args.expert.path or (self.cache / "demos.npz" if (self.cache / "demos.npz").exists() else None)
        self.demos = (
            None if path is None else load_demos(path, args.env_id, self.obs_dim, self.act_dim, self.nq, self.nv)
        )
        if self.demos is not None and args.expert.num_demos not in (None, len(self.demos["returns"])):
            raise UsageError(
                f"{path} holds {len(self.demos['returns'])} expert episodes, not --expert.num-demos "
                f"{args.expert.num_demos}: pass another --expert.experts-dir for new data, or drop the flag"
            )
        args.expert.num_demos = len(self.demos["returns"]) if self.demos is not None else args.expert.num_demos or 64
        if self.demos is None and env_family(args.env_id) == "mujoco":
            raise UsageError(
                f"no expert data for {args.env_id}: build the shared SAC expert cache first (python hype_irl_mujoco.py "
                f"--env-id {args.env_id}, or filter_irl_mujoco.py) or pass --expert.path"
            )
        if self.demos is None:  # the planner's data go to the cache: refused now, not after the episodes
            check_writable(self.cache, "--expert.experts-dir")
        self.reacher, self.controller = None, "PD controller"
        if self.demos is None and env_family(args.env_id) == "antmaze":
            path = reacher_file(args.reacher.path)
            check_path_length(path, "--reacher.path")
            if not path.is_file():
                raise UsageError(
                    f"{args.env_id} needs the goal-reaching Ant controller {path} (train it: python {SCRIPT} "
                    "--train-goal-reacher) or demos of your own (--expert.path)"
                )
            bad = UsageError(f"{path} is not a goal-reaching Ant controller of {SCRIPT}; retrain it")
            try:
                self.reacher = load_policy(path)
            except Exception:  # noqa: BLE001 - any unreadable controller is bad input
                raise bad from None
            if self.reacher.max_dist is None or self.reacher.config["obs_dim"] != REACHER_OBS:
                raise bad
            self.controller = f"goal-reaching Ant controller {path.name}"
        return self

    def listen(self) -> None:
        """SIGINT and SIGTERM set the stop flag that every phase asks (stop_requested)."""
        import signal

        self.stop = False

        def handler(signum, frame):  # noqa: ARG001
            self.stop = True

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def start(self, script: str = SCRIPT) -> None:
        """Signals, seeds, device, the run dir with its args.json (naming the script), TensorBoard."""
        args = self.args
        from torch.utils.tensorboard import SummaryWriter

        self.listen()  # first, so a signal during set-up is not a kill

        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        self.device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
        self.generator = torch.Generator().manual_seed(args.seed)
        self.rng = np.random.default_rng(args.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.rglob("*.tmp*"):  # left by a killed atomic write
            stale.unlink()
        if not (self.run_dir / "args.json").exists():
            atomic_json(self.run_dir / "args.json", {"script": script, **dataclasses.asdict(args)})
        print(f"run directory: {self.run_dir}", flush=True)
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=dataclasses.asdict(args),
                name=self.run_dir.name,
                save_code=True,
            )
        self.writer = SummaryWriter(str(self.run_dir))
        self.t0, self.pretrain_info = time.time(), None

    def stop_requested(self) -> bool:
        return self.stop

    # -- expert cache and pretrained model ----------------------------------------------------------------------
    def save_expert_cache(self, demos: dict) -> None:
        ends = demos["terminals"] | demos["timeouts"]
        meta = {
            "env_id": self.args.env_id,
            "num_demos": int(len(demos["returns"])),
            "transitions": int(len(demos["actions"])),
            "success_rate": float(np.mean(demos["terminals"][ends])),
            "mean_length": float(np.bincount(demos["episode_ids"]).mean()),
            "return_mean": float(np.mean(demos["returns"])),
            "controller": f"BFS planner + {self.controller}",
            "settings": dataclasses.asdict(self.args.expert),
            "seed": self.args.seed,
            "script": SCRIPT,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write(self.cache / "demos.npz", lambda p: np.savez_compressed(open(p, "wb"), **demos))
        atomic_json(self.cache / "expert_meta.json", meta)

    def load_pretrained(self):
        """The pretrained model of model_pretrained.pt; a fresh one when pretraining is off; None to pretrain."""
        m, goal = self.args.model, goal_dims(self.args.env_id)
        in_dim, out_dim = self.obs_dim + self.act_dim, self.obs_dim - goal
        model = GaussianEnsemble(in_dim, out_dim, m.ensemble_size, m.hidden, m.layers, clip_output=m.clip_output)
        model = model.to(self.device)
        saved = load(self.run_dir / "model_pretrained.pt", "pretrained", self.device)
        if saved is not None:
            model.load_state_dict(saved["model"])
            self.pretrain_info = saved["info"]
            return model, saved["elites"]
        if not m.pretrain:
            self.pretrain_info = {"epochs": 0, "history": []}
            return model, torch.arange(m.num_elites)
        return None, None

    def save_pretrained(self, model, elites, info) -> None:
        self.pretrain_info = info
        save(self.run_dir / "model_pretrained.pt", "pretrained", model=model.state_dict(), elites=elites, info=info)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def checkpoint(self, s: HyperState, c: dict) -> None:
        """The model rollouts (learner buffer, its filled rows) are saved, so a resumed run goes on with the same
        data as an uninterrupted one (at most retain_epochs of refills: on PointMaze's defaults up to 150 MB). Of
        the hybrid buffer only what the real steps added is (the expert prefix is the expert data; the policy buffer
        is every other row of it), copied (a slice of a CPU tensor would save its whole capacity): on Large-Diverse
        at 6.7k steps 12.5 MB, not 107. The real episode in progress is restored from the counters' record of its
        reset and the policy buffer's actions (restore_episode)."""
        added = s.hybrid.rows[s.hybrid.size - 2 * s.policy.size : s.hybrid.size].to("cpu", copy=True)
        save(
            self.run_dir / "checkpoints" / "hyper.pt",
            "hyper",
            agent=s.agent.state_dict(),
            disc=s.disc.state_dict(),
            model=s.model.state_dict(),
            elites=s.elites,
            hybrid_added=added,
            learner=s.learner.ring(),
            counters=c,
            rng=self.rng_state(),
        )

    def resume(self, s: HyperState) -> dict:
        """The loop's counters: restored with the state from checkpoints/hyper.pt, or new ones."""
        saved = load(self.run_dir / "checkpoints" / "hyper.pt", "hyper", self.device)
        if saved is None:
            keys = ("step", "disc_env_steps", "disc_updates", "model_trainings", "model_batches")
            return dict.fromkeys(keys, 0) | {"history": [], "bc_steps": 0}
        s.agent.load_state_dict(saved["agent"])
        s.disc.load_state_dict(saved["disc"])
        s.model.load_state_dict(saved["model"])
        s.elites = saved["elites"]
        added = saved["hybrid_added"].to(s.hybrid.rows)  # learner and expert rows in turn, after the expert data
        s.hybrid.load_rows(torch.cat([s.hybrid.rows[: s.hybrid.size], added]))
        s.policy.load_rows(added[0::2])
        if "learner" in saved:  # (an older checkpoint lacks the model rollouts: the loop refills them)
            s.learner.load_ring(saved["learner"])
        self.set_rng_state(saved["rng"])
        print(f"[hyper] resumed at real step {saved['counters']['step']}", flush=True)
        return saved["counters"]

    def rng_state(self) -> dict:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        host = {"python": random.getstate(), "numpy": self.rng.bit_generator.state, "torch": torch.get_rng_state()}
        return host | {"generator": self.generator.get_state(), "cuda": cuda}

    def set_rng_state(self, s: dict) -> None:  # (.cpu(): checkpoints load onto the device, RNG states are on the host)
        random.setstate(s["python"])
        self.rng.bit_generator.state = s["numpy"]
        torch.set_rng_state(s["torch"].cpu())
        self.generator.set_state(s["generator"].cpu())
        if s.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([t.cpu() for t in s["cuda"]])

    # -- progress, evaluation, logging --------------------------------------------------------------------------
    def progress_start(self, total: int, step: int, desc: str = "hyper") -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=step, desc=desc, mininterval=5, file=sys.stdout)
        self.sps_t0, self.sps_step = time.time(), step

    def after_step(self, step: int, c: dict, last: dict, s: HyperState) -> None:
        args, e = self.args, self.args.eval
        self.bar.update(1)
        if step % e.log_frequency == 0:
            scalars = {k: float(v) for k, v in last.items()}
            bad = [k for k, v in scalars.items() if not math.isfinite(v)]
            if bad:
                raise NonFiniteLoss(f"hyper: non-finite {', '.join(bad)} at real step {step}; lower the learning rates")
            for k, v in scalars.items():
                prefix = "losses" if "loss" in k else "hyper"
                self.writer.add_scalar(f"{prefix}/{k}", v, step)
            self.writer.add_scalar("charts/SPS", (step - self.sps_step) / max(1e-9, time.time() - self.sps_t0), step)
            self.writer.add_scalar("hyper/disc_env_steps", c["disc_env_steps"], step)
            last.pop("rollout_sps", None)  # logged once per refill, not repeated until the next one
        if step % e.frequency == 0 or step == args.hyper.total_timesteps:
            self.evaluate(step, c, s.agent.actor)
            if c["eval_pending"] is not None:  # a signal: the loop saves the checkpoint now
                return
        if step % args.checkpoint_every == 0 and step < args.hyper.total_timesteps:
            self.checkpoint(s, c)

    def evaluate(self, step: int, c: dict, actor: Actor) -> None:
        """The evaluation at real step `step` into the history; a signal leaves it pending (c["eval_pending"])."""
        args = self.args
        setting = (args.eval.episodes, args.seed + 10_000, args.hyper.p_tremble)
        r = evaluate(actor, args.env_id, *setting, stop=self.stop_requested)
        c["eval_pending"] = step if r is None else None
        if r is None:
            return
        score = r["success_rate"] if self.metric == "success_rate" else r["mean_return"]
        c["history"].append(
            {
                "step": step,
                "total_env_steps": step + c["disc_env_steps"],
                "score": score,
                "success_rate": r["success_rate"],
                "mean_return": r["mean_return"],
                "mean_length": float(np.mean(r["episode_lengths"])),
                "paths": r["paths"][:8] if self.metric == "success_rate" else [],
            }
        )
        if r["success_rate"] is not None:
            self.writer.add_scalar("charts/success_rate", r["success_rate"], step)
        self.writer.add_scalar("charts/episodic_return", r["mean_return"], step)
        self.writer.add_scalar("charts/episodic_length", float(np.mean(r["episode_lengths"])), step)
        self.bar.write(
            f"[eval] step {step}: {self.metric} {score:.2f} (real steps incl. discriminator "
            f"{step + c['disc_env_steps']})"
        )
        curve = (c["history"], self.pretrain_info, self.expert_score, args.env_id, self.metric)
        save_curve(self.run_dir / "learning_curve.png", *curve)

    @property
    def metric(self) -> str:
        return "mean_return" if env_family(self.args.env_id) == "mujoco" else "success_rate"

    @property
    def expert_score(self) -> float:
        """The expert data's success rate (mazes) or mean return (MuJoCo)."""
        d = self.demos_used
        if self.metric == "mean_return":
            return float(np.mean(d["returns"]))
        return float(np.mean(d["terminals"][d["terminals"] | d["timeouts"]]))

    def finish(self, c: dict, agent, demos: dict) -> None:
        args = self.args
        self.bar.close()
        final = c["history"][-1]
        if args.save_model:
            save_policy(self.run_dir / "policy.pt", agent.actor, args.env_id)
        if self.metric == "success_rate":
            save_maze_picture(self.run_dir / "maze.png", args.env_id, demos, final["paths"])
        if args.capture_video:
            record_video(agent.actor, args.env_id, self.run_dir / "videos" / "final.webm", args.seed + 10_000)
        results = {
            "script": SCRIPT,
            "env_id": args.env_id,
            "method": "HyPER",
            "actor": "TD3+BC hybrid" if isinstance(agent, TD3BC) else "SAC",
            "seed": args.seed,
            "metric": self.metric,
            "score": final["score"],
            "success_rate": final["success_rate"],
            "mean_return": final["mean_return"],
            "eval_episodes": args.eval.episodes,
            "expert_score": self.expert_score,
            "num_demos": int(len(demos["returns"])),
            "real_steps": c["step"],
            "disc_env_steps": c["disc_env_steps"],
            "total_env_steps": c["step"] + c["disc_env_steps"],
            "disc_updates": c["disc_updates"],
            "model_trainings": c["model_trainings"],
            "pretrain_epochs": (self.pretrain_info or {}).get("epochs", 0),
            "pretrain_stopped_by_signal": (self.pretrain_info or {}).get("stopped", False),
            "wall_time_s": time.time() - self.t0,
            "device": str(self.device),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "history": [{k: v for k, v in h.items() if k != "paths"} for h in c["history"]],
        }
        atomic_json(self.run_dir / "results.json", results)
        self.writer.close()
        print(
            f"final {self.metric} {final['score']:.2f} after {c['step']} real steps "
            f"(+{c['disc_env_steps']} discriminator steps) -> {self.run_dir}",
            flush=True,
        )


def settings(args) -> dict:
    """An Args (or an args.json's dict) flattened to {'group.field': value}, as JSON holds the values."""
    tree = json.loads(json.dumps(args if isinstance(args, dict) else dataclasses.asdict(args)))
    flat = {}
    for key, value in tree.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        flat.update({key if sub is None else f"{key}.{sub}": v for sub, v in items})
    return flat


NOT_SETTINGS = ("script", "run_dir", "eval_only", "train_goal_reacher")  # where and how, not what the run learns


def check_finished(run_dir: Path, args) -> None:
    """A finished run (results.json) is never overwritten: the same settings as its args.json raise AlreadyFinished
    (exit 0, nothing to do), other ones a UsageError naming each flag that differs."""
    try:
        saved = settings(json.loads((run_dir / "args.json").read_text()))
    except (OSError, ValueError, AttributeError):
        raise UsageError(f"{run_dir} holds results.json but no readable args.json; pass a new --run-dir") from None
    now = settings(args)  # (a setting args.json lacks is newer than the run: its default applies)
    differ = [k for k in sorted(now.keys() & saved.keys()) if k not in NOT_SETTINGS and now[k] != saved[k]]
    if differ:
        flags = ", ".join(f"--{k.replace('_', '-')} {now[k]} (was {saved[k]})" for k in differ)
        raise UsageError(f"{run_dir} holds a finished run with other settings: {flags}; pass a new --run-dir")
    raise AlreadyFinished(f"{run_dir} already holds a finished run (results.json); nothing to do")


def check_run_dir(run_dir: Path, script: str, kind: str, artifacts: dict[str, str], args=None) -> None:
    """A finished run is never overwritten (check_finished, given the args); an existing run dir must hold a run of
    the same script and kind (env), and its artifacts ({path: kind}) must load."""
    if (run_dir / "results.json").exists() and args is None:
        raise UsageError(f"{run_dir} already holds a finished run (results.json); pass a new --run-dir")
    if (run_dir / "args.json").exists():
        try:
            old = json.loads((run_dir / "args.json").read_text())
        except ValueError:
            raise UsageError(f"{run_dir}/args.json is corrupt; pass a new --run-dir") from None
        old_kind = old.get("env_id", "the Ant")
        if old.get("script") != script or old_kind != kind:
            raise UsageError(
                f"{run_dir} holds a {old.get('script')} run on {old_kind}, not {script} on {kind}; pass a new --run-dir"
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"{run_dir} exists and is not a run of {script}; pass a new --run-dir")
    if (run_dir / "results.json").exists():
        check_finished(run_dir, args)
    for path, artifact in artifacts.items():
        load(run_dir / path, artifact)


def check_path_length(path: Path, flag: str) -> None:
    """A UsageError when the file system cannot hold path (255 bytes a name, 4095 a path, as on Linux)."""
    if any(len(os.fsencode(part)) > 255 for part in path.parts) or len(os.fsencode(str(path.absolute()))) > 4095:
        limits = "255 bytes a name, 4095 a path"
        raise UsageError(f"{flag} {str(path)[:60]}... is too long for the file system ({limits}); shorten it")


def check_writable(path: Path, flag: str) -> None:
    """The nearest existing ancestor of path must be a directory we can create something in (nothing is left)."""
    parent = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:  # a file there raises NotADirectoryError
        tempfile.TemporaryDirectory(dir=parent).cleanup()
    except OSError:
        raise UsageError(f"{flag} {path} is not writable here ({parent}); pass a path you can write") from None


def retired_env_id(env_id: str) -> str | None:
    """The current id when env_id is a retired version of a supported one (AntMaze v4 is kept for Minari's data)."""
    name, _, version = env_id.rpartition("-v")
    versions = [int(v) for n, _, v in (k.rpartition("-v") for k in gym.registry) if n == name and v.isdigit()]
    current = f"{name}-v{max(versions, default=0)}"
    if not version.isdigit() or env_id == current:
        return None
    old_maze = env_family(env_id) == "antmaze" and int(version) < 4
    return current if old_maze or (current in MUJOCO_IDS and env_id not in MUJOCO_IDS) else None


def check_ranges(args) -> None:
    """Every numeric setting within the range its field declares (ranged), before any work."""
    groups = [
        (f"{f.name}.", getattr(args, f.name)) for f in dataclasses.fields(args) if dataclasses.is_dataclass(f.type)
    ]
    for prefix, obj in [("", args), *groups]:
        for f in dataclasses.fields(obj):
            if "range" not in f.metadata:
                continue
            (lo, hi), v = f.metadata["range"], getattr(obj, f.name)
            if v is None:  # an unset optional: its documented default applies
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                flag = f"--{prefix}{f.name.replace('_', '-')}"
                bounds = [f"{b:g}" if float(f"{b:g}") == b else str(b) for b in (lo, hi)]  # 2147483647 stays exact
                raise UsageError(f"{flag} must lie in [{bounds[0]}, {bounds[1]}], not {v}")


def check_numbers(args: Args) -> None:
    check_ranges(args)
    if args.model.num_elites > args.model.ensemble_size:
        raise UsageError("--model.num-elites must not exceed --model.ensemble-size")
    if args.hyper.exploration_steps >= args.hyper.total_timesteps:
        raise UsageError("--hyper.exploration-steps must be below --hyper.total-timesteps")
    if args.actor.lr_decay and env_family(args.env_id) != "mujoco":
        raise UsageError("--actor.lr-decay schedules the SAC actor of the MuJoCo ids; mazes' TD3+BC keeps its lr (0)")
    try:
        sched = [int(v) for v in args.hyper.rollout_schedule.split(",")]
    except ValueError:
        sched = []
    if len(sched) != 4 or min(sched) < 0 or sched[2] < 1 or sched[3] < 1 or sched[3] > 10_000:
        raise UsageError("--hyper.rollout-schedule must be 'e0,e1,l0,l1' with lengths l0, l1 >= 1, e.g. 20,100,1,25")


REQUIRED_KEYS = (*list(DEMO_DTYPES)[:8], "returns", "env_id")  # observations ... episode_starts, returns, env_id
MAZE_KEYS = ("qpos", "qvel", "goal")  # required for mazes only (the siblings' MuJoCo demos carry no goal)


MINARI = "minari:"


def minari_maze_demos(dataset_id: str) -> dict[str, np.ndarray]:
    """A downloaded Minari maze dataset (e.g. D4RL/antmaze/umaze-v1, D4RL/pointmaze/umaze-v2) in the demos.npz layout.
    Dict observations become the script's flat layout; the MuJoCo state is read off the observation itself (AntMaze:
    qpos = [x, y, observation[:13]], qvel = observation[13:]; PointMaze: qpos = (x, y), qvel = (vx, vy)), so the
    dataset's infos are not needed; qacc_warmstart is absent (resets never replay actions here)."""
    try:
        import minari
    except ImportError:
        raise UsageError(f"{MINARI}{dataset_id} needs the minari package: pip install 'minari[hdf5]'") from None
    if dataset_id not in minari.list_local_datasets():
        raise UsageError(f"Minari dataset {dataset_id} is not downloaded: run `minari download {dataset_id}` first")
    try:
        dataset = minari.load_dataset(dataset_id)
        spec_id = dataset.spec.env_spec.id if dataset.spec.env_spec is not None else ""
        episodes = list(dataset.iterate_episodes())
    except Exception as e:  # noqa: BLE001 - a broken local copy is bad input
        raise UsageError(
            f"cannot read Minari dataset {dataset_id} ({type(e).__name__}); delete and download it again"
        ) from None
    if not episodes or not all(isinstance(ep.observations, dict) for ep in episodes):
        raise UsageError(f"Minari dataset {dataset_id} is not a maze dataset (dict observations with desired_goal)")
    ant = env_family(spec_id) == "antmaze"
    flats, actions, rewards, terms, truncs = [], [], [], [], []
    for ep in episodes:
        o = ep.observations
        parts = ([o["achieved_goal"]] if ant else []) + [o["observation"], o["desired_goal"]]
        flats.append(np.concatenate(parts, -1))
        actions.append(ep.actions)
        rewards.append(ep.rewards)
        terms.append(ep.terminations)
        truncs.append(ep.truncations)
    lengths = [len(r) for r in rewards]
    obs = np.concatenate([f[:-1] for f in flats])
    return {
        "observations": obs.astype(np.float32),
        "next_observations": np.concatenate([f[1:] for f in flats]).astype(np.float32),
        "actions": np.concatenate(actions).astype(np.float32),
        "rewards": np.concatenate(rewards).astype(np.float32),
        "terminals": np.concatenate(terms).astype(bool),
        "timeouts": np.concatenate(truncs).astype(bool),
        "episode_ids": np.repeat(np.arange(len(episodes), dtype=np.int64), lengths),
        "episode_starts": np.concatenate([np.arange(n) == 0 for n in lengths]),
        "timesteps": np.concatenate([np.arange(n) for n in lengths]).astype(np.int64),
        "returns": np.array([float(np.sum(r)) for r in rewards]),
        "qpos": (obs[:, :15] if ant else obs[:, :2]).astype(np.float64),
        "qvel": (obs[:, 15:29] if ant else obs[:, 2:4]).astype(np.float64),
        "goal": obs[:, -2:].astype(np.float64),
        "env_id": np.array(spec_id),
    }


def load_demos(path, env_id: str, obs_dim: int, act_dim: int, nq: int, nv: int) -> dict[str, np.ndarray]:
    """Read (npz or minari:ID) and check expert data against the env: keys, dtypes, widths, finiteness, episodes."""
    if str(path).startswith(MINARI):
        return check_demos(minari_maze_demos(str(path)[len(MINARI) :]), path, env_id, obs_dim, act_dim, nq, nv)
    if not Path(path).is_file():
        raise UsageError(f"--expert.path {path} does not exist; pass a demos.npz (format in docs/mbirl_antmaze.md)")
    try:
        with np.load(path, allow_pickle=False) as f:
            demos = {k: f[k] for k in f.files}
    except Exception as e:  # noqa: BLE001 - any unreadable file is bad input
        raise UsageError(
            f"cannot read expert data {path} ({type(e).__name__}); delete it or pass another file"
        ) from None
    return check_demos(to_truncated_layout(demos, env_id), path, env_id, obs_dim, act_dim, nq, nv)


def to_truncated_layout(demos: dict, env_id: str) -> dict:
    """The shared format (the SAC cache of Ant/Humanoid) holds gymnasium's full observation and actions in the env's
    units; cut the observations to their first entries (qpos[2:], qvel: TRUNCATED_OBS), scale actions to [-1, 1]."""
    if env_id not in TRUNCATED_OBS or "observations" not in demos or "actions" not in demos:
        return demos
    full, cut = gym.make(env_id), make_env(env_id)
    width, short = full.observation_space.shape[0], cut.observation_space.shape[0]
    low, high = full.action_space.low, full.action_space.high
    full.close(), cut.close()
    out = dict(demos)
    for key in ("observations", "next_observations"):
        if key in demos and demos[key].ndim == 2 and demos[key].shape[1] == width:
            out[key] = demos[key][:, :short]
    if demos["actions"].ndim == 2 and demos["actions"].shape[1] == len(low):
        out["actions"] = ((demos["actions"] - low) / (high - low) * 2 - 1).astype(demos["actions"].dtype)
    return out


def check_demos(demos: dict, path, env_id: str, obs_dim: int, act_dim: int, nq: int, nv: int) -> dict[str, np.ndarray]:
    needed = REQUIRED_KEYS + (MAZE_KEYS if env_family(env_id) != "mujoco" else ())
    missing = [k for k in needed if k not in demos]
    if missing:
        raise UsageError(
            f"{path} lacks key(s) {', '.join(missing)}; mazes need qpos, qvel, goal (format: docs/mbirl_antmaze.md)"
        )
    if str(demos["env_id"]) != env_id:
        raise UsageError(
            f"{path} holds demos of {demos['env_id']}, not {env_id}; pass demos of {env_id} or change --env-id"
        )
    n = len(demos["observations"])
    widths = dict(observations=obs_dim, next_observations=obs_dim, actions=act_dim, qpos=nq, qvel=nv, goal=2)
    for k in DEMO_DTYPES:
        if k not in demos:
            continue
        v = demos[k]
        if (np.dtype(DEMO_DTYPES[k]).kind == "f") != (v.dtype.kind == "f"):
            raise UsageError(f"{path}: key {k} has dtype {v.dtype}, expected {np.dtype(DEMO_DTYPES[k])}")
        if len(v) != n or (k in widths and (v.ndim != 2 or v.shape[1] != widths[k])):
            raise UsageError(f"{path}: key {k} has shape {v.shape}, expected ({n}, {widths.get(k, '')}) for {env_id}")
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise UsageError(f"{path}: key {k} holds NaN or inf values")
        if k == "actions" and v.size and np.abs(v).max() > 1 + 1e-5:  # the actors' and the envs' range
            raise UsageError(f"{path}: key actions holds values outside [-1, 1] (max |a| {np.abs(v).max():.3g})")
    ids, steps = demos["episode_ids"], np.diff(demos["episode_ids"])
    if n == 0 or ids[0] != 0 or np.any((steps < 0) | (steps > 1)) or len(demos["returns"]) != ids[-1] + 1:
        raise UsageError(f"{path}: key episode_ids must run 0, 0, ..., 1, ... up to len(returns) - 1 without gaps")
    starts = np.concatenate([[True], steps == 1])
    if not np.array_equal(demos["episode_starts"].astype(bool), starts):
        raise UsageError(f"{path}: key episode_starts does not mark the first row of every episode_ids block")
    for k in DEMO_DTYPES:
        if k in demos:
            demos[k] = demos[k].astype(DEMO_DTYPES[k])
    return demos


class CudaGraphs:
    """Speed, CUDA only (opt-in: `enabled`, on a GPU): `fn(*batch, key)` with each key's variant replayed as one
    CUDA graph, so a small MLP update costs a few microseconds of launch instead of ~100 Python-dispatched kernels
    (the model's training 5.3-6.4x on an H100). The first WARMUP calls of a variant run eagerly on a side stream
    (real updates; they create the optimisers' state), the next one captures it on static input tensors; from then
    on a call copies its batch in and replays. A capture that fails turns graphs off. Disabled: a plain call."""

    WARMUP = 3

    def __init__(self, fn, enabled: bool):
        self.fn, self.enabled, self.calls, self.captured, self.broken = fn, enabled, {}, {}, False

    def __call__(self, key, batch: tuple):
        if not self.enabled:
            return self.fn(*batch, key)
        if key in self.captured:
            graph, static_in, static_out = self.captured[key]
            for dst, src in zip(static_in, batch):
                dst.copy_(src)
            graph.replay()
            return static_out
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.broken or self.calls[key] <= self.WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.fn(*batch, key)
            torch.cuda.current_stream().wait_stream(side)
            return out
        static_in, graph = tuple(x.clone() for x in batch), torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static_out = self.fn(*static_in, key)
        except RuntimeError as e:
            print(f"[speed] CUDA graph capture failed, updating eagerly: {str(e).splitlines()[0]}", flush=True)
            self.broken = True
            return self(key, batch)
        self.captured[key] = (graph, static_in, static_out)
        return self(key, batch)


def atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def atomic_json(path: Path, obj) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2)))


ARTIFACTS = {"checkpoints/hyper.pt": "hyper", "model_pretrained.pt": "pretrained"}  # what a run dir resumes from
VERSION = 1  # of the artifacts' layout: a run dir of another version does not resume


def save(path: Path, kind: str, **payload) -> None:
    """Every artifact: one atomic write of a dict that names its kind and version."""
    atomic_write(path, lambda p: torch.save({"kind": kind, "version": VERSION, **payload}, p))


def load(path: Path, kind: str, device="cpu") -> dict | None:
    """The artifact at path (None if absent), checked: a `kind` artifact of this version, or a UsageError."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location=device, weights_only=False)
    except Exception:  # noqa: BLE001 - any unreadable artifact is bad input
        raise UsageError(f"{path} is corrupt; delete it to redo that phase") from None
    if not isinstance(saved, dict) or (saved.get("kind"), saved.get("version")) != (kind, VERSION):
        raise UsageError(f"{path} is not a {kind} artifact of this version; delete it to redo that phase")
    return saved


def save_policy(path: Path, actor: Actor, env_id: str, **extra) -> None:
    """policy.pt (or a controller): what load_policy reads (docs/CONTRACT.md), with no training state."""
    state = {k: v.cpu() for k, v in actor.state_dict().items()}
    config, network = actor.config, type(actor).__name__
    save(path, "policy", script=SCRIPT, env_id=env_id, network=network, config=config, state_dict=state, **extra)


def reacher_file(path: str) -> Path:
    """--reacher.path; a relative one starts at this script's folder (the shipped controller is found from any cwd)."""
    return Path(path) if Path(path).is_absolute() else Path(__file__).resolve().parent / path


def load_policy(path, device: str = "cpu") -> Actor:
    """policy.pt -> the actor in eval mode, with act(obs) and env_id."""
    saved = torch.load(path, map_location=device, weights_only=False)
    if not isinstance(saved, dict) or saved.get("script") != SCRIPT:  # (indexing a tensor with a key warns)
        raise ValueError(f"{path} is not a policy file of {SCRIPT}")
    actor = {"Actor": Actor, "GaussianActor": GaussianActor}[saved["network"]](**saved["config"]).to(device)
    actor.load_state_dict(saved["state_dict"])
    actor.env_id, actor.max_dist = saved["env_id"], saved.get("max_dist")  # max_dist: goal reachers only
    return actor.eval()


def make_policy_envs(policy: Actor, num_envs: int = 1) -> gym.vector.SyncVectorEnv:
    """The envs the policy was trained on (flat maze observations, episodes end at the goal)."""
    return gym.vector.SyncVectorEnv([lambda: make_env(policy.env_id) for _ in range(num_envs)])


def eval_only(args: Args, run: RunContext) -> None:
    """--eval-only: policy.pt in the real env -> evaluations/eval_NNN.json; a signal stops it, nothing written."""
    actor = run.policy
    run.listen()
    print(f"evaluating {Path(args.eval_only) / 'policy.pt'}: {args.eval.episodes} episodes", flush=True)
    setting = (args.eval.episodes, args.seed + 10_000, args.hyper.p_tremble)
    r = evaluate(actor, actor.env_id, *setting, stop=run.stop_requested)
    if r is None:
        again = "the same command starts it again"
        print(f"interrupted during --eval-only: no evaluation written; {again}", file=sys.stderr)
        raise SystemExit(130)
    out_dir = run.run_dir / "evaluations"
    number = 1 + max((int(p.stem[5:]) for p in out_dir.glob("eval_[0-9][0-9][0-9].json")), default=0)
    result = {
        "env_id": actor.env_id,
        "success_rate": r["success_rate"],
        "mean_return": r["mean_return"],
        "std_return": float(np.std(r["returns"])),
        "returns": r["returns"],
        "episodes": args.eval.episodes,
        "episode_lengths": r["episode_lengths"],
        "seed": args.seed + 10_000,
        "p_tremble": args.hyper.p_tremble,
    }
    out = out_dir / f"eval_{number:03d}.json"
    atomic_json(out, result)
    success = "" if r["success_rate"] is None else f"success rate {r['success_rate']:.2f}, "
    ret = f"return {result['mean_return']:.1f} +- {result['std_return']:.1f}"
    print(f"eval {success}{ret} over {args.eval.episodes} episodes -> {out}")


def save_curve(path: Path, history: list[dict], pretrain: dict | None, expert: float, env_id: str, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    pre = (pretrain or {}).get("history", [])
    if pre:
        a0.semilogy([p["epoch"] for p in pre], [p["val_mse"] for p in pre])
    else:  # MuJoCo: the model is first trained when exploration ends (the reference's setting), not pretrained
        a0.text(0.5, 0.5, "no pretraining: the model is first\ntrained when exploration ends", ha="center")
    a0.set(title="model pretraining", xlabel="epoch", ylabel="validation MSE (mean of members)")
    steps = [h["step"] for h in history]
    a1.plot(steps, [h["score"] for h in history], "o-", label="HyPER (real learner steps)")
    a1.plot(
        [h["total_env_steps"] for h in history],
        [h["score"] for h in history],
        "x--",
        alpha=0.6,
        label="same, x = real steps incl. discriminator",
    )
    a1.axhline(expert, color="k", ls=":", label="expert data")
    if history:
        a1.annotate(f"last {history[-1]['score']:.2f}", (steps[-1], history[-1]["score"]))  # redrawn each eval
    a1.set(title="HyPER loop", xlabel="env steps", ylabel=metric.replace("_", " "))
    if metric == "success_rate":
        a1.set_ylim(-0.05, 1.05)
    a1.legend(fontsize=8)
    fig.suptitle(f"HyPER on {env_id}")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=90))
    plt.close(fig)


def save_maze_picture(path: Path, env_id: str, demos: dict, learner_paths: list) -> None:
    """Walls, up to 10 expert paths (blue) and the final evaluation's learner paths (red), goals as stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = make_env(env_id)
    maze = env.unwrapped.maze
    env.close()
    free = free_cells(maze.maze_map)
    s = maze.maze_size_scaling
    fig, ax = plt.subplots(figsize=(6, 6 * free.shape[0] / free.shape[1]))
    for r, c in zip(*np.nonzero(~free)):
        x, y = maze.cell_rowcol_to_xy(np.array([r, c]))
        ax.add_patch(plt.Rectangle((x - s / 2, y - s / 2), s, s, color="0.3"))
    for e in range(min(10, len(demos["returns"]))):
        rows = demos["episode_ids"] == e
        xy = demos["observations"][rows][:, :2]
        ax.plot(xy[:, 0], xy[:, 1], color="tab:blue", alpha=0.5, lw=1, label="expert" if e == 0 else None)
        ax.plot(*demos["observations"][rows][0, -2:], "*", color="tab:blue", ms=10)
    for i, p in enumerate(learner_paths):
        p = np.asarray(p)
        ax.plot(p[:, 0], p[:, 1], color="tab:red", alpha=0.7, lw=1, label="learner (evaluation)" if i == 0 else None)
    ax.set_aspect("equal")
    ax.autoscale()
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{env_id}: expert and learner paths")
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=90))
    plt.close(fig)


def record_video(actor: Actor, env_id: str, path: Path, seed: int) -> None:
    import cv2

    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering (GLFW needs a display)
    env = make_env(env_id, render_mode="rgb_array")
    obs, _ = env.reset(seed=seed)
    frames, done = [env.render()], False
    while not done:
        obs, _, terminated, truncated, _ = env.step(actor.act(obs[None])[0])
        frames.append(env.render())
        done = terminated or truncated
    env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.webm")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"VP90"), 30, frames[0].shape[1::-1])
    for f in frames:
        writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    writer.release()
    os.replace(tmp, path)


# The reference's settings where a MuJoCo id differs from the mazes (Args' defaults; garage's hyper.yaml overrides).
# A flag not given takes them: `python mbirl_antmaze.py --env-id Hopper-v5 --help` shows them as the defaults.
_MUJOCO = {
    "model.pretrain": False,
    "model.cosine_lr": False,
    "hyper.exploration_steps": 1000,
    "hyper.freq_train_model": 125,
    "hyper.retain_epochs": 1,
    "hyper.p_tremble": 0.01,
    "actor.hidden": 1024,
    "actor.lr": 1e-4,
    "disc.every": 1000,
    "disc.lr": 8e-4,
    "disc.ensemble": 7,
    "eval.episodes": 10,
}
ENV_PRESETS = {
    "Hopper-v5": {**_MUJOCO, "model.hidden": 400, "hyper.updates_per_step": 30, "actor.hidden": 512, "actor.lr": 3e-4},
    "Walker2d-v5": {
        **_MUJOCO,
        "hyper.updates_per_step": 10,
        "model.clip_output": 40.0,
        "model.cosine_lr": True,
        "actor.lr_decay": 10_000,
    },
    "Ant-v5": {
        **_MUJOCO,
        "model.hidden": 400,
        "hyper.updates_per_step": 30,
        "disc.every": 200,
        "model.clip_output": 40.0,
    },
    "Humanoid-v5": {
        **_MUJOCO,
        "model.hidden": 400,
        "hyper.updates_per_step": 10,
        "hyper.rollout_schedule": "20,300,1,25",
        "actor.lr_decay": 10_000,
    },
}


def preset(env_id: str, **top) -> Args:
    """Args with the reference's defaults for env_id (the mazes': Args' own)."""
    args = Args(env_id=env_id, **top)
    for name, value in ENV_PRESETS.get(env_id, {}).items():
        group, key = name.split(".")
        setattr(getattr(args, group), key, value)
    return args


def peek(argv: list[str]):
    """--env-id, --run-dir and --eval-only of a command line, read before tyro parses it."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("env-id", "run-dir", "eval-only"):
        parser.add_argument(f"--{flag}", f"--{flag.replace('-', '_')}", nargs="?")  # (a missing value: tyro's line)
    return parser.parse_known_args(argv)[0]


def env_preset(argv: list[str]) -> Args:
    """The defaults of the env on the command line (--eval-only: the evaluated policy's env)."""
    seen = peek(argv)
    env_id = seen.env_id or Args.env_id
    if seen.eval_only and (Path(seen.eval_only) / "policy.pt").is_file():
        try:
            env_id = load_policy(Path(seen.eval_only) / "policy.pt").env_id
        except Exception:  # noqa: BLE001 - validation reports an unreadable policy
            pass
    return preset(env_id)


def saved_script(argv: list[str]) -> str | None:
    """The script named in the args.json of the --run-dir on the command line, if any."""
    run_dir = peek(argv).run_dir
    try:
        return json.loads((Path(run_dir) / "args.json").read_text()).get("script") if run_dir else None
    except (OSError, ValueError, AttributeError):
        return None


def args_from_dict(saved: dict) -> Args:
    """An args.json -> Args (keys it lacks take Args' defaults). A key this script does not know is a run dir of an
    earlier format: a UsageError naming the keys (docs/CONTRACT.md: refused rather than misread)."""
    groups = {f.name: f.type for f in dataclasses.fields(Args) if dataclasses.is_dataclass(f.type)}
    top = {f.name for f in dataclasses.fields(Args)}
    unknown = [k for k in saved if k not in top and k != "script"]
    for name, cls in groups.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        group = saved.get(name, {})
        if not isinstance(group, dict):
            raise TypeError(f"{name} is not a group of settings")
        unknown += [f"{name}.{k}" for k in group if k not in fields]
    if unknown:
        raise UsageError(", ".join(unknown))
    kwargs = {k: v for k, v in saved.items() if k in top and k not in groups}
    return Args(**kwargs, **{name: cls(**saved.get(name, {})) for name, cls in groups.items()})


RETIRED_FLAGS = {  # an old spelling (or a sibling's) -> the flag its one-line hint names (docs/CONTRACT.md)
    "--expert.expert-path": "--expert.path",
    "--eval.checkpoint-frequency": "--checkpoint-every",
    "--checkpoint-frequency": "--checkpoint-every",
    "--reacher.eval-episodes": "--eval.episodes",
    "--threads": "--torch-threads",
}


def refuse_retired_flags(argv: list[str]) -> None:
    """An old spelling of a flag: one line naming the new one, exit 2, before anything is parsed or written."""
    retired = [flag for a in map(str, argv) if (flag := a.split("=")[0].replace("_", "-")) in RETIRED_FLAGS]
    if retired:
        new = RETIRED_FLAGS[retired[0]]
        print(f"error: {retired[0]} was renamed: use {new} (the same flag in every script)", file=sys.stderr)
        raise SystemExit(2)


def cli(argv: list[str] | None = None) -> Args:
    """Parse the command line; an existing --run-dir's args.json gives the defaults (`--run-dir X` resumes).
    --train-goal-reacher (or a run dir of it) runs mbirl_antmaze_goal_reacher.py with the other flags."""
    argv = sys.argv[1:] if argv is None else argv
    refuse_retired_flags(argv)
    seen = peek(argv)  # (both are looked at before tyro parses: a path the file system cannot hold is refused first)
    for flag, value in (("--run-dir", seen.run_dir), ("--eval-only", seen.eval_only)):
        try:
            check_path_length(Path(value or "."), flag)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    if "--train-goal-reacher" in argv or saved_script(argv) == "mbirl_antmaze_goal_reacher.py":
        import mbirl_antmaze_goal_reacher as phase0

        phase0.main(phase0.cli([a for a in argv if a != "--train-goal-reacher"]))
        raise SystemExit(0)
    args = parse(argv, env_preset(argv))
    saved = Path(args.run_dir) / "args.json" if args.run_dir else None
    if saved is not None and saved.exists() and saved_script(argv) in (SCRIPT, None):  # (another's: validation)
        try:
            default = args_from_dict(json.loads(saved.read_text()))
        except UsageError as e:  # (before main: nothing is written)
            unknown = f"holds settings this script does not know ({e})"
            print(f"error: {saved} {unknown}, from an earlier version; pass a new --run-dir", file=sys.stderr)
            raise SystemExit(2)
        except (ValueError, TypeError, AttributeError):
            print(f"error: {saved} is not a run's args.json; pass another --run-dir", file=sys.stderr)
            raise SystemExit(2)
        args = parse(argv, default)
    return args


def parse(argv: list[str], default, cls: type = Args):
    """tyro.cli of `cls` (this script's Args, or the goal reacher's); a flag it rejects exits 2 with one line naming
    it. tyro hands the rejection to a hook before it prints anything (the flag, the reason), so its printed box is
    never parsed; --help still prints and exits 0."""
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
            return tyro.cli(cls, args=argv, default=default)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main(cli())
