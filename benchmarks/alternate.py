"""Alternating A/B: which of two (or more) versions of a training command is faster, on a machine whose own speed
drifts by more than the difference?

All commands start together, but only one runs at a time: the others are paused with SIGSTOP and the turn passes
every ``--window`` seconds (SIGCONT), for ``--seconds`` in total. Each command must log a TensorBoard scalar
(``--tag``, default ``charts/SPS``) once per iteration: the wall times of consecutive points give one iteration's
duration, and only iterations that lie entirely inside one of that command's running windows are kept. Slow and
fast stretches of the machine are thereby shared evenly between the versions, which back-to-back runs cannot do.

Usage (each --cmd is NAME and a command line; the harness appends ``--run-dir <tmp>/NAME``):
    python benchmarks/alternate.py --window 20 --seconds 480 \\
        --cmd before "python /tmp/old/trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 --reward-model M.pt" \\
        --cmd after "python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 --reward-model M.pt"
Prints, per command, the number of in-window iterations and the median / mean steps per second.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def in_window_seconds_per_step(points: list[tuple[int, float]], windows: list[tuple[float, float]]) -> list[float]:
    """Seconds per step of each interval between consecutive (step, wall time) points that lies entirely inside one
    of the (start, end) running windows."""
    out = []
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if s1 > s0 and any(a <= t0 and t1 <= b for a, b in windows):
            out.append((t1 - t0) / (s1 - s0))
    return out


def read_points(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for d in sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            points += [(e.step, e.wall_time) for e in acc.Scalars(tag)]
    return sorted(points)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmd", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True)
    parser.add_argument("--window", type=float, default=20.0, help="seconds per turn")
    parser.add_argument("--seconds", type=float, default=480.0, help="total duration")
    parser.add_argument("--tag", default="charts/SPS", help="scalar logged once per iteration")
    args = parser.parse_args(argv)
    if len(args.cmd) < 2 or len({n for n, _ in args.cmd}) != len(args.cmd):
        parser.error("give at least two --cmd with distinct names")
    tmp = Path(tempfile.mkdtemp(prefix="alternate_"))
    procs, windows = {}, {name: [] for name, _ in args.cmd}
    for name, cmd in args.cmd:
        procs[name] = subprocess.Popen(
            [*shlex.split(cmd), "--run-dir", str(tmp / name)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        procs[name].send_signal(signal.SIGSTOP)
    names = [name for name, _ in args.cmd]
    end, turn = time.time() + args.seconds, 0
    try:
        while time.time() < end:
            name = names[turn % len(names)]
            procs[name].send_signal(signal.SIGCONT)
            start = time.time()
            time.sleep(args.window)
            procs[name].send_signal(signal.SIGSTOP)
            windows[name].append((start, time.time()))
            turn += 1
    finally:
        for p in procs.values():  # the scripts save and exit cleanly on SIGTERM
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait()
    for name in names:
        spp = in_window_seconds_per_step(read_points(tmp / name, args.tag), windows[name])
        if not spp:
            print(f"{name}: no iteration fitted inside a window (raise --window)")
            continue
        q1, _, q3 = statistics.quantiles(spp, n=4) if len(spp) > 1 else (spp[0], None, spp[0])
        print(
            f"{name}: {len(spp)} in-window iterations, median {1 / statistics.median(spp):.1f} SPS, "
            f"mean {len(spp) / sum(spp):.1f} SPS, quartiles {1 / q3:.1f}-{1 / q1:.1f}"
        )
    print(f"run dirs kept in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
