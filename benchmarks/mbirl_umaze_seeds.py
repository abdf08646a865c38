"""AntMaze UMaze, HyPER beside HyPE over learner seeds: the table and figure in docs/mbirl_antmaze.md.

Reads the run dirs written by `SEED=n bash benchmarks/mbirl_antmaze.sh antmaze_seed` (seed 1: `antmaze` and
`hype_antmaze`) and prints a markdown table; with --figure PATH draws success against real env steps (the
discriminator's included), one line per run.

    python benchmarks/mbirl_umaze_seeds.py --figure docs/assets/mbirl_antmaze/antmaze_umaze_seeds.png
"""

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path("runs/mbirl_evidence")


def runs(seed: int) -> tuple[Path, Path]:
    suffix = "" if seed == 1 else f"_s{seed}"
    return ROOT / f"antmaze_umaze{suffix}", ROOT / f"hype_antmaze_umaze{suffix}"


def history(run_dir: Path) -> list[dict] | None:
    path = run_dir / "results.json"
    return json.loads(path.read_text())["history"] if path.exists() else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args()
    print("| seed | HyPER: BC only (step 0) | HyPER final (10k learner steps; real steps) | HyPER mean of its 11"
          " evaluations | HyPE nearest HyPER's final real steps | HyPE final (20k learner steps; real steps) |"
          " HyPE best of 5 |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    finals = {"hyper": [], "hype": [], "bc": [], "hype_at_hyper_steps": []}
    curves = []
    for seed in args.seeds:
        hyper_dir, hype_dir = runs(seed)
        hyper, hype = history(hyper_dir), history(hype_dir)
        cells = [str(seed)]
        if hyper:
            finals["bc"].append(hyper[0]["success_rate"])
            finals["hyper"].append(hyper[-1]["success_rate"])
            last = hyper[-1]
            cells += [f"{hyper[0]['success_rate']:.2f}", f"{last['success_rate']:.2f} ({last['total_env_steps']:,})",
                      f"{np.mean([h['success_rate'] for h in hyper]):.2f}"]  # fmt: skip
            curves.append((f"HyPER seed {seed}", "C0", hyper))
        else:
            cells += ["—"] * 3
        if hype:
            finals["hype"].append(hype[-1]["success_rate"])
            if hyper:  # the HyPE evaluation at about the real steps HyPER ended on
                near = min(hype, key=lambda h: abs(h["total_env_steps"] - hyper[-1]["total_env_steps"]))
                finals["hype_at_hyper_steps"].append(near["success_rate"])
                cells.append(f"{near['success_rate']:.2f} ({near['total_env_steps']:,})")
            else:
                cells.append("—")
            cells += [f"{hype[-1]['success_rate']:.2f} ({hype[-1]['total_env_steps']:,})",
                      f"{max(h['success_rate'] for h in hype):.2f}"]  # fmt: skip
            curves.append((f"HyPE seed {seed}", "C1", hype))
        else:
            cells += ["—"] * 3
        print("| " + " | ".join(cells) + " |")
    for name, values in finals.items():
        if values:
            print(f"{name}: final success mean {np.mean(values):.3f} ± {np.std(values):.3f} over {len(values)} seeds")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        styles = ["-", "--", ":"]
        for i, (label, color, hist) in enumerate(curves):
            x = [h["total_env_steps"] for h in hist]
            ax.plot(x, [h["success_rate"] for h in hist], styles[(i // 2) % 3], color=color, marker=".", label=label)
        ax.axhline(0.8125, color="gray", lw=0.8, label="expert data (81 %)")
        ax.set(xlabel="real env steps (incl. the discriminator's)", ylabel="success (25 episodes)",
               title="AntMaze UMaze: HyPER vs HyPE, same expert data")  # fmt: skip
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
