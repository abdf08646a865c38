"""The labelling app's colour clips (issue 45), checked on random play: clips recorded as training records them
(ale-py's async vector env, ClipRecorder with replay settings), each replayed in one ALEInterface; prints how many
replayed exactly, the replay time per clip, and the GIF bytes of the colour clip against the grey one.

Usage (repository root, venv active): python benchmarks/preference_colour_replay.py ROM STICKY ENVS STEPS SEED
  e.g. python benchmarks/preference_colour_replay.py pong 0.0 8 4000 1
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import preference_ga3c_atari as s  # noqa: E402
import preference_labelling_app as app  # noqa: E402


def record_clips(rom: str, num_envs: int, steps: int, seed: int, sticky: float = 0.0) -> list[dict]:
    """Clips of random play recorded as preference_ga3c_atari.py records them for --labeler human: its
    asynchronous AtariVectorEnv (half the envs per batch) and ClipRecorder, which adds what replays them.
    (tests/test_preference_labels.py records its clips with this function too.)"""
    envs = s.make_envs(rom, num_envs, 4, sticky, s.EnvArgs(), num_envs // 2, 1)
    rng = np.random.default_rng(seed)
    replay = {"rom": rom, "sticky": sticky, "noop_max": 30, "seed": seed}
    recorder = s.ClipRecorder(25, 4, 4, num_envs, rng, replay)
    obs, info = envs.reset(seed=seed)
    acted, last, clips = np.zeros(num_envs, bool), np.zeros(num_envs, np.int64), []
    for _ in range(steps):
        ids = info["env_id"]
        acted[ids], last[ids] = True, rng.integers(envs.single_action_space.n, size=len(ids))
        envs.send(last[ids])
        obs, reward, terminated, truncated, info = envs.recv()
        ids, no = info["env_id"], np.zeros(len(info["env_id"]), bool)
        stepped = acted[ids]  # envs that have acted once: their step answers an action of ours
        over = (terminated | truncated)[stepped]
        clips += recorder.observe(ids[stepped], obs[stepped], last[ids[stepped]], reward[stepped], over, no, "random")
    envs.close()
    return clips


def main(rom: str, sticky: str, num_envs: str, steps: str, seed: str) -> None:
    sticky = float(sticky)
    clips = record_clips(rom, int(num_envs), int(steps), int(seed), sticky)
    exact, seconds, colour_bytes, grey_bytes = 0, [], [], []
    for clip in clips:
        start = time.time()
        colour = app.replay_clip(clip["replay"], clip["frames"], 4)
        seconds.append(time.time() - start)
        if colour is not None:
            exact += 1
            colour_bytes.append(len(app.render_clip_gif(colour)[0]))
            grey_bytes.append(len(app.render_clip_gif(clip["frames"][3:])[0]))
    games = sorted({clip["replay"]["game"] for clip in clips})
    print(f"{rom} sticky {sticky}: {exact}/{len(clips)} clips replayed exactly (games {games})")
    print(f"replay seconds per clip: median {np.median(seconds):.2f}, max {max(seconds):.2f}")
    if colour_bytes:
        low, high, grey = min(colour_bytes), max(colour_bytes), np.median(grey_bytes)
        print(f"colour GIF bytes: median {np.median(colour_bytes):.0f} ({low}-{high}); grey: {grey:.0f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
