"""A run's TensorBoard scalars as one small CSV (tag, step, value), the committed record of a learning curve.

    python benchmarks/tb_to_csv.py runs/trex_paper_breakout_s1 benchmarks/results/trex_paper_breakout_s1/curves.csv
    python benchmarks/tb_to_csv.py RUN_DIR OUT.csv --prefix charts/ --prefix eval/   # only tags starting with these

Every event file under RUN_DIR is read (a resumed run writes one per start); a step logged twice for the same tag (a
resume that replays part of an iteration) keeps the value written last. Wall-clock times are left out on purpose:
the long runs share the CPU, so their timings are not results.
"""

import argparse
import csv
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run_dir: Path, prefixes: tuple[str, ...] = ()) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} over every event file under run_dir, later files overriding earlier ones."""
    curves: dict[str, dict[int, float]] = {}
    files = sorted(run_dir.rglob("events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime, p.name))
    for path in files:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if prefixes and not tag.startswith(prefixes):
                continue
            for event in acc.Scalars(tag):
                curves.setdefault(tag, {})[event.step] = event.value
    return curves


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--prefix", action="append", default=[], help="keep only tags starting with this (repeatable)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"error: {args.run_dir} is not a directory: pass a run dir", file=sys.stderr)
        return 2
    curves = scalars(args.run_dir, tuple(args.prefix))
    if not curves:
        print(f"error: no TensorBoard scalars under {args.run_dir}: has the run logged yet?", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["tag", "step", "value"])
        for tag in sorted(curves):
            for step in sorted(curves[tag]):
                out.writerow([tag, step, f"{curves[tag][step]:.6g}"])
    tmp.replace(args.out)
    print(f"{sum(map(len, curves.values()))} values of {len(curves)} tags -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
