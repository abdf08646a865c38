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

rom, sticky, n, steps, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
envs = s.make_envs(rom, n, 4, sticky, s.EnvArgs(), n // 2, 1)
rng = np.random.default_rng(seed)
replay = {"rom": rom, "sticky": sticky, "noop_max": 30, "seed": seed}
recorder = s.ClipRecorder(25, 4, 4, n, rng, replay)
obs, info = envs.reset(seed=seed)
acted, last, clips = np.zeros(n, bool), np.zeros(n, np.int64), []
for _ in range(steps):
    ids = info["env_id"]
    actions = rng.integers(envs.single_action_space.n, size=len(ids))
    acted[ids], last[ids] = True, actions
    envs.send(actions)
    obs, reward, term, trunc, info = envs.recv()
    ids = info["env_id"]
    keep = acted[ids]  # envs that have acted once: their step answers an action of ours
    over, no_life_lost = (term | trunc)[keep], np.zeros(keep.sum(), bool)
    clips += recorder.observe(ids[keep], obs[keep], last[ids[keep]], reward[keep], over, no_life_lost, "random")
envs.close()

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
    low, high = min(colour_bytes), max(colour_bytes)
    print(f"colour GIF bytes: median {np.median(colour_bytes):.0f} ({low}-{high}); grey: {np.median(grey_bytes):.0f}")
