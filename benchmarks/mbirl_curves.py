"""Tables and figures of several mbirl_antmaze.py / hype_irl_mujoco.py runs in docs/mbirl_antmaze.md: every evaluation
of each run (success, learner steps, real steps including the discriminator's), and a figure against real steps.
--set picks the runs (the run dirs under runs/mbirl_evidence of the benchmarks/mbirl_antmaze.sh steps named below):

  long          UMaze past 10k learner steps: HyPER at 20k learner steps (20 actor updates per step) beside HyPE at
                30k, about the same real steps (`[SEED=2] ... antmaze_long`, `... hype_antmaze_long`; and the 10k-step
                20-update run of seed 3 for reference)
  c840k-umaze   UMaze on the 840k controller's data: HyPER (`[SEED=n] TAG=c840k ... antmaze_updates20`) and HyPE
                (`[SEED=n] TAG=c840k ... hype_antmaze`), seeds 1-3
  c840k-large   Large-Diverse on its 512 episodes: HyPER (`TAG=c840k DEMOS=512 BC=300000 UPD=20 STEPS=20000 ...
                antmaze_large_data`) and HyPE (`TAG=c840k DEMOS=512 ... hype_large_data`), [SEED=2|3]

    python benchmarks/mbirl_curves.py --set long --figure docs/assets/mbirl_antmaze/antmaze_umaze_long.png
"""

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path("runs/mbirl_evidence")
SETS = {  # name -> (title, expert data's success rate, {label: (run dir, line style, colour)})
    "long": ("AntMaze UMaze, 20 actor updates per step: longer runs", 0.8125, {
        "HyPER 20k, seed 1": ("antmaze_umaze_u20_20k", "-", "C0"),
        "HyPER 20k, seed 2": ("antmaze_umaze_u20_20k_s2", "-", "C2"),
        "HyPER 10k, seed 3": ("antmaze_umaze_u20_s3", ":", "C4"),
        "HyPE 30k, seed 1": ("hype_antmaze_umaze_30k", "--", "C1"),
        "HyPE 30k, seed 2": ("hype_antmaze_umaze_30k_s2", "--", "C3"),
    }),
    "c840k-umaze": ("AntMaze UMaze on the 840k controller's data", 0.91, {
        "HyPER, seed 1": ("antmaze_umaze_u20_c840k", "-", "C0"),
        "HyPER, seed 2": ("antmaze_umaze_u20_s2_c840k", "-", "C2"),
        "HyPER, seed 3": ("antmaze_umaze_u20_s3_c840k", "-", "C4"),
        "HyPE, seed 1": ("hype_antmaze_umaze_c840k", "--", "C1"),
        "HyPE, seed 2": ("hype_antmaze_umaze_s2_c840k", "--", "C3"),
        "HyPE, seed 3": ("hype_antmaze_umaze_s3_c840k", "--", "C5"),
    }),
    "c840k-large": ("AntMaze Large-Diverse-GR on the 840k controller's 512 episodes", 0.83, {
        "HyPER (300k BC, 20 updates per step), seed 1": ("antmaze_large_d512_bc300k_u20_c840k", "-", "C0"),
        "HyPE, seed 1": ("hype_antmaze_large_d512_c840k", "--", "C1"),
        "HyPER (300k BC, 20 updates per step), seed 2": ("antmaze_large_d512_bc300k_u20_s2_c840k", "-", "C2"),
        "HyPE, seed 2": ("hype_antmaze_large_d512_s2_c840k", "--", "C3"),
        "HyPER (300k BC, 20 updates per step), seed 3": ("antmaze_large_d512_bc300k_u20_s3_c840k", "-", "C4"),
        "HyPE, seed 3": ("hype_antmaze_large_d512_s3_c840k", "--", "C5"),
    }),
}  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=SETS, default="long")
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args()
    title, expert, runs = SETS[args.set]
    curves = []
    for label, (name, style, color) in runs.items():
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
    by_method = {}  # "HyPER ..., seed n" -> "HyPER ...": the mean over the seeds found
    for label, hist, _, _ in curves:
        by_method.setdefault(label.split(", seed")[0], []).append(hist)
    for method, hists in by_method.items():
        finals = [h[-1]["success_rate"] for h in hists]
        real = [h[-1]["total_env_steps"] for h in hists]
        print(f"\n{method}: final {' / '.join(f'{f:.2f}' for f in finals)} = mean {np.mean(finals):.2f} over"
              f" {len(finals)} seed(s), at {min(real):,}-{max(real):,} real steps")  # fmt: skip
    if args.figure and curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for label, hist, style, color in curves:
            x = [h["total_env_steps"] for h in hist]
            ax.plot(x, [h["success_rate"] for h in hist], style, color=color, marker=".", label=label)
        ax.axhline(expert, color="gray", lw=0.8, label=f"expert data ({expert:.0%})")
        ax.set(xlabel="real env steps (incl. the discriminator's)", ylabel="success (25 episodes)", title=title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
