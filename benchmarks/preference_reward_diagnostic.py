"""What does a run's learned reward pay for? Plays a run's current agent (or a random policy) on 8 envs and scores
every post-step observation with the run's reward ensemble (its stored normalisation, in units of its std):
the learned reward of 25-step windows (the labeller's clip length) that hold a conceded point, none, or a won point,
and the per-step reward around the points. Reads the run's checkpoints only; writes nothing.

    python benchmarks/preference_reward_diagnostic.py RUN_DIR [--random] [--steps 1500]
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import preference_ga3c_atari as pref  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--random", action="store_true", help="a uniformly random policy instead of the run's agent")
parser.add_argument("--steps", type=int, default=1500, help="steps per env (8 envs)")
parser.add_argument("--window", type=int, default=25, help="clip length of the windows")
cli = parser.parse_args()
torch.set_num_threads(1)

run = Path(cli.run_dir)
args = json.loads((run / "args.json").read_text())
stack, (rom, sticky) = args["env"]["stacked_frames"], pref.resolve_env_id(args["env_id"])
envs = pref.make_envs(rom, 8, stack, sticky, pref.EnvArgs())
net = pref.GA3CNet(max(1, stack), int(envs.single_action_space.n))
net.load_state_dict(torch.load(run / "checkpoints" / "agent.pt", weights_only=False)["net"])
state = torch.load(run / "checkpoints" / "reward_model.pt", weights_only=False)["model"]
members = sum(key.endswith("head.2.bias") for key in state)
model = pref.RewardEnsemble(members, max(1, stack), (0, 0), 0.0, 1.0)  # output in std units; mask from the state
model.load_state_dict(state)
model.eval()

rng = np.random.default_rng(0)
obs, _ = envs.reset(seed=3)
observations, rewards = [], []
with torch.no_grad():
    for _ in range(cli.steps):
        logits, _ = net(torch.from_numpy(obs))
        actions = rng.integers(logits.shape[-1], size=8) if cli.random else pref.sample_actions(logits).numpy()
        obs, reward, *_ = envs.step(actions)
        observations.append(obs.copy())
        rewards.append(reward)
    true = np.stack(rewards)  # (T, 8)
    learned = torch.cat([model(torch.from_numpy(np.stack(observations[i : i + 100])).flatten(0, 1))
                         for i in range(0, cli.steps, 100)]).view(true.shape).numpy()  # fmt: skip
envs.close()

policy = "a random policy" if cli.random else "the run's agent"
print(
    f"{run.name}, {policy}, {cli.steps} x 8 steps: {int((true > 0).sum())} points won, {int((true < 0).sum())} "
    f"conceded; learned reward per step {learned.mean():+.3f} std (std units of the run's normalisation)"
)
csum = np.concatenate([np.zeros((1, 8)), np.cumsum(learned, 0)])
tsum = np.concatenate([np.zeros((1, 8)), np.cumsum(true, 0)])
windows, window_true = csum[cli.window :] - csum[: -cli.window], tsum[cli.window :] - tsum[: -cli.window]
for value in (-1, 0, 1):
    picked = window_true == value
    if picked.any():
        mean = windows[picked].mean()
        print(f"  {cli.window}-step windows scoring {value:+d}: {picked.sum():5d}, learned sum {mean:+.2f}")
for name, event in (("conceded", true < 0), ("won", true > 0)):
    t, env = np.nonzero(event)
    around = []
    for k in range(-20, 5, 2):
        ok = (t + k >= 0) & (t + k < len(true))
        around.append(f"{k:+d}: {learned[t[ok] + k, env[ok]].mean():+.2f}" if ok.any() else f"{k:+d}: -")
    print(f"  per-step learned reward around a point {name} (step offset): " + ", ".join(around))
