"""AntMaze UMaze past 10k learner steps: HyPER at 20k learner steps (20 actor updates per step) beside HyPE at 30k,
about the same real env steps. The table and figure in docs/mbirl_antmaze.md.

Reads the run dirs of `[SEED=2] bash benchmarks/mbirl_antmaze.sh antmaze_long` and `... hype_antmaze_long`
(and, where it is on disk, the 10k-step 20-update run of seed 3 for reference) and prints every evaluation:

    python benchmarks/mbirl_umaze_long.py --figure docs/assets/mbirl_antmaze/antmaze_umaze_long.png
"""

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path("runs/mbirl_evidence")
RUNS = {  # label -> run dir, line style
    "HyPER 20k, seed 1": ("antmaze_umaze_u20_20k", "-", "C0"),
    "HyPER 20k, seed 2": ("antmaze_umaze_u20_20k_s2", "-", "C2"),
    "HyPER 10k, seed 3": ("antmaze_umaze_u20_s3", ":", "C4"),
    "HyPE 30k, seed 1": ("hype_antmaze_umaze_30k", "--", "C1"),
    "HyPE 30k, seed 2": ("hype_antmaze_umaze_30k_s2", "--", "C3"),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args()
    curves = []
    for label, (name, style, color) in RUNS.items():
        path = ROOT / name / "results.json"
        if not path.exists():
            print(f"{label}: no results.json in {path.parent} (not run, or not finished)")
            continue
        res = json.loads(path.read_text())
        hist, learner = res["history"], res.get("real_steps", res.get("policy_env_steps"))  # mbirl / hype
        half = [h["success_rate"] for h in hist if h["step"] >= hist[-1]["step"] / 2]
        print(f"\n{label} ({name}): final {hist[-1]['success_rate']:.2f} at {learner:,} learner steps,"
              f" {res['total_env_steps']:,} real steps incl. the discriminator's; mean of the second half"
              f" {np.mean(half):.2f}; best {max(h['success_rate'] for h in hist):.2f}")  # fmt: skip
        print("| learner steps | " + " | ".join(f"{h['step'] // 1000}k" for h in hist) + " |")
        print("|---|" + "---:|" * len(hist))
        print("| success | " + " | ".join(f"{h['success_rate']:.2f}" for h in hist) + " |")
        print("| real steps | " + " | ".join(f"{h['total_env_steps'] / 1000:.0f}k" for h in hist) + " |")
        curves.append((label, hist, style, color))
    if args.figure and curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for label, hist, style, color in curves:
            x = [h["total_env_steps"] for h in hist]
            ax.plot(x, [h["success_rate"] for h in hist], style, color=color, marker=".", label=label)
        ax.axhline(0.8125, color="gray", lw=0.8, label="expert data (81 %)")
        ax.set(xlabel="real env steps (incl. the discriminator's)", ylabel="success (25 episodes)",
               title="AntMaze UMaze, 20 actor updates per step: longer runs")  # fmt: skip
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
