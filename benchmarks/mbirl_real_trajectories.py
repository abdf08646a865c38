"""The discriminator's fresh real trajectories of mbirl_antmaze.py (the maze default: 4 per update) two ways, in one
process on one device:

  one env       the episodes one after another, the actor acting on one observation per step (the script before
                2026-11-27: on a GPU each act is a host-device round trip)
  side by side  the 4 episodes on 4 envs in lockstep, one batched act per step (the script now)

An untrained TD3+BC actor (width 256) on AntMaze UMaze with the trembling hand of the maze default: episodes run to
the 700-step time limit, so both ways step the same number of real steps. Each way runs ROUNDS (default 3) times,
alternating; one JSON line per measurement (real steps per second). Run it alone:
    python benchmarks/mbirl_real_trajectories.py        # or python3 ... on the GPU machine (benchmarks/gpu.sh)
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mbirl_antmaze as m  # noqa: E402

ENV, N = "AntMaze_UMaze-v5", 4
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
actor = m.Actor(31, 8, 256).to(device)
pools = {"one env": [m.make_env(ENV)], "side by side": [m.make_env(ENV) for _ in range(N)]}
for rnd in range(int(os.environ.get("ROUNDS", 3))):
    for way, envs in pools.items():
        t0 = time.perf_counter()
        _, steps, *_ = m.collect_real_trajectories(envs, actor, N, 1000 * rnd, np.random.default_rng(rnd), 0.01)
        rate = steps / (time.perf_counter() - t0)
        print(json.dumps({"way": way, "round": rnd, "real_steps": steps, "real_steps_per_s": round(rate, 1),
                          "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                          "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)  # fmt: skip
