"""A/B of two versions of simple_worldmodel_atari.py on its two world-model costs, in one process, alternating.

Per round and version: K world-model training steps (world_model_loss, backward, Adam) at batch 4 with 2 target
frames, then K simulated-env steps (WorldModel.predict) for 16 envs; both at the CPU evidence run's sizes (hidden 32,
inference filters 32: `pong-cpu` in benchmarks/simple_worldmodel_atari.sh), one torch thread, the same seeds and
random frames for both versions. The rounds alternate A, B, A, B, ... so drift in the machine's speed falls on both.
Prints the median seconds per step of each version and the ratio. Run it with nothing else running.

    python benchmarks/simple_wm_ab.py OLD.py NEW.py [ROUNDS] [K]     # default 6 rounds of 3 steps
"""

import importlib.util
import statistics
import sys
import time

import torch


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seconds_per_step(sw, k: int) -> tuple[float, float]:
    """(training s/step, predict s/step) of one version, from the same seed and inputs."""
    torch.manual_seed(0)
    cfg = sw.WorldModelArgs(hidden_size=32, inference_filters=32, target_frames=2, batch_size=4, optimizer="adam")
    model = sw.WorldModel(6, sw.FRAME_SHAPE, cfg)
    optimizer = sw.make_wm_optimizer(model, cfg)
    frames = torch.randint(0, 256, (4, 6, *sw.FRAME_SHAPE), dtype=torch.uint8)
    actions, rewards = torch.randint(0, 6, (4, 2)), torch.randint(0, 3, (4, 2))
    times = []
    for step in range(k + 1):  # the first step warms up (allocations), not timed
        start = time.perf_counter()
        loss, _ = sw.world_model_loss(model, frames, actions, rewards, cfg, 2000 + step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    train = statistics.median(times[1:])
    model.eval()
    stacks, acts = torch.randint(0, 256, (16, 4, *sw.FRAME_SHAPE), dtype=torch.uint8), torch.randint(0, 6, (16,))
    times = []
    for _ in range(k + 1):
        start = time.perf_counter()
        model.predict(stacks, acts)
        times.append(time.perf_counter() - start)
    return train, statistics.median(times[1:])


def main(old: str, new: str, rounds: str = "6", k: str = "3") -> None:
    torch.set_num_threads(1)
    versions = {"A": load(old, "simple_a"), "B": load(new, "simple_b")}
    results = {name: [] for name in versions}
    for r in range(int(rounds)):
        for name, sw in versions.items():
            train, predict = seconds_per_step(sw, int(k))
            results[name].append((train, predict))
            print(f"round {r} {name}: train {train:.3f} s/step, predict {predict:.3f} s/step")
    medians = {n: [statistics.median(x[i] for x in v) for i in (0, 1)] for n, v in results.items()}
    for i, what in enumerate(("world-model training step (batch 4, 2 targets)", "simulated-env step (16 envs)")):
        a, b = medians["A"][i], medians["B"][i]
        print(f"{what}: A {old} {a:.3f} s, B {new} {b:.3f} s, B is {a / b:.2f}x A's rate")


if __name__ == "__main__":
    main(*sys.argv[1:])
