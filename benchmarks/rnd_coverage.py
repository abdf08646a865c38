"""Where in Montezuma's Revenge a trained policy goes: the cells it reaches, below the resolution of rooms.

Issue 44's runs at 10M frames never leave the first room, so rooms cannot tell RND from PPO there. This plays a
finished run's policy.pt (stochastic, as trained and evaluated; the env settings saved in it) for N games and reads
the player's position from RAM at every agent step: room RAM[3], x RAM[42], y RAM[43] (the addresses Go-Explore
uses), binned into 8x8-pixel cells as (room, x // 8, y // 8). It reports the distinct cells of each game and of all
games together, beside the games' scores and lengths; `random` plays uniform random actions as the baseline. It
measures the final policies, not what the runs visited during training.

Usage (repository root, venv active; one line per policy appended to OUT):
    python benchmarks/rnd_coverage.py OUT.jsonl runs/rnd_montezuma_rnd_s1 runs/rnd_montezuma_ppo_s1 random \
        --games 10 --seed 50000
"""

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from torch.distributions import Categorical

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import rnd_ppo_atari as rnd  # noqa: E402

ROOM, X, Y = 3, 42, 43  # Montezuma's RAM addresses
CELL = 8  # pixels per cell side


def cell(ram: np.ndarray) -> tuple:
    """The player's (room, x // CELL, y // CELL) from Montezuma's RAM."""
    return int(ram[ROOM]), int(ram[X]) // CELL, int(ram[Y]) // CELL


@torch.no_grad()
def play(policy, env_args, games: int, seed: int) -> dict:
    """`games` games, game i seeded seed + i, by `policy` (None: uniform random actions). Returns each game's
    score, length in agent steps and the set of cells it reached (its start included)."""
    rng = np.random.default_rng(seed)
    out = {"returns": [], "lengths": [], "cells": []}
    for i in range(games):
        env = rnd.make_python_env(env_args, "montezuma_revenge", seed + i)
        obs, _ = env.reset(seed=seed + i)
        cells, score, steps, done = {cell(env.unwrapped.ale.getRAM())}, 0.0, 0, False
        if policy is not None:
            state, first = policy.initial_state(1, "cpu"), torch.ones(1, 1)
        while not done:
            if policy is None:
                action = int(rng.integers(env.action_space.n))
            else:
                logits, _, _, state = policy(torch.as_tensor(obs)[None, None], state, first)
                first = torch.zeros_like(first)
                action = int(Categorical(logits=logits).sample().reshape(-1)[0])
            obs, reward, term, trunc, _ = env.step(action)
            score, steps, done = score + reward, steps + 1, term or trunc
            cells.add(cell(env.unwrapped.ale.getRAM()))
        env.close()
        out["returns"].append(score)
        out["lengths"].append(steps)
        out["cells"].append(cells)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+", help="finished run dirs (with policy.pt), or `random`")
    p.add_argument("--games", type=int, default=10)
    p.add_argument("--seed", type=int, default=50_000)
    args = p.parse_args()
    for run in args.runs:
        if run != "random" and not (Path(run) / "policy.pt").is_file():
            p.error(f"{run}: no policy.pt there; pass the run dir of a finished run, or `random`")
    if args.games < 1:
        p.error(f"--games {args.games}: play at least one game")
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    for run in args.runs:
        torch.manual_seed(args.seed)  # each policy's actions from the same stream, whatever the order of the runs
        if run == "random":
            policy, env_args = None, rnd.EnvArgs()
        else:
            policy = rnd.load_policy(str(Path(run) / "policy.pt"))
            keys = ("sticky_action_prob", "max_episode_frames")
            env_args = rnd.EnvArgs(**{k: policy.env_config[k] for k in keys})
        result = play(policy, env_args, args.games, args.seed)
        union = set().union(*result["cells"])
        record = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": commit.stdout.strip(),
            "run": run,
            "games": args.games,
            "seed": args.seed,
            "cells_all_games": len(union),
            "cells_per_game": [len(c) for c in result["cells"]],
            "cells_per_game_mean": round(float(np.mean([len(c) for c in result["cells"]])), 1),
            "cells_per_game_std": round(float(np.std([len(c) for c in result["cells"]], ddof=1)), 1),  # of the games
            "length_mean": round(float(np.mean(result["lengths"])), 1),
            "rooms": sorted({c[0] for c in union}),
            "returns": result["returns"],
            "lengths": result["lengths"],
        }
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        per_game, score = record["cells_per_game_mean"], np.mean(result["returns"])
        print(f"{run}: {len(union)} cells in {args.games} games ({per_game} per game), rooms {record['rooms']}")
        print(f"  score {score:.1f}, {np.mean(result['lengths']):.0f} agent steps per game")


if __name__ == "__main__":
    main()
