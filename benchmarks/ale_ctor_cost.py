"""What bounds a signal's answer while ale-py builds its vector env (docs/CONTRACT.md, exit code 130).

For each env count: build AtariVectorEnv in a background thread while the main thread ticks every 0.1 s, then
reset it (seeded) the same way. A phase in which the main thread cannot tick holds Python's lock (GIL): no Python
signal handler, hence no stop flag, runs until it returns. Prints one line per count; run it with the machine idle.

    python benchmarks/ale_ctor_cost.py [GAME] [NUM_ENVS ...]     # default: breakout 32 128
"""

import sys
import threading
import time

import numpy as np
from ale_py.vector_env import AtariVectorEnv


def timed_in_thread(fn) -> tuple[float, float]:
    """(seconds fn took, the longest the main thread waited between two 0.1 s ticks meanwhile)."""
    done, box = threading.Event(), {}

    def run():
        start = time.perf_counter()
        try:
            box["value"] = fn()
        finally:
            box["seconds"] = time.perf_counter() - start
            done.set()

    ticks = [time.perf_counter()]
    threading.Thread(target=run, daemon=True).start()
    while not done.is_set():
        time.sleep(0.1)
        ticks.append(time.perf_counter())
    return box, float(np.diff(ticks).max())


def main(game: str = "breakout", *counts: str) -> None:
    for n in [int(c) for c in counts] or [32, 128]:
        made, made_gap = timed_in_thread(lambda: AtariVectorEnv(game, n, img_height=84, img_width=84, stack_num=4))
        envs = made["value"]
        reset, reset_gap = timed_in_thread(lambda: envs.reset(seed=np.arange(n)))
        envs.close()
        print(
            f"{game} {n} envs: construct {made['seconds']:.1f} s (main thread's longest wait {made_gap:.1f} s), "
            f"seeded reset {reset['seconds']:.1f} s (longest wait {reset_gap:.1f} s), "
            f"{1000 * made['seconds'] / n:.0f} ms per emulator built",
            flush=True,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
