"""Read learning curves off a published plot's pixels, so our runs can be drawn beside the paper's curves.

The HyPE/HyPER reference publishes its MuJoCo results only as plots (`garage/figures/*_results_iqm.png`, the IQM of
10 seeds); their numbers are not in the repository. This reads them back: the axes are calibrated from the plot's
own tick marks (ticks drawn inward: short dark segments just inside the left and bottom spines, each given its
value on the command line), and each curve is found by its colour, as the centre of the thickest run of pixel rows
of that colour in a 3-pixel column at every sampled x. The legend's box is left out. Where other lines hide a curve
the point is null. One pixel is about 17 return on the Hopper plot: the values are approximate, as reading them by
eye would be.

Usage (repository root; the figure from a clone of jren03/garage at 8f4fff0):
    git -C garage show 8f4fff0:garage/figures/hopper_results_iqm.png > /tmp/hopper_results_iqm.png
    python benchmarks/digitize_paper_curves.py /tmp/hopper_results_iqm.png \
        benchmarks/results/hopper_paper/paper_curves.json
The defaults (tick values, curve colours, legend box, samples every 50k steps to 950k) are the Hopper figure's,
the colours from the reference's `garage/plot.py`.
"""

import argparse
import json
from pathlib import Path

import numpy as np

COLOURS = {  # garage/plot.py's algorithm_to_color; "expert" is its green dashed line
    "filter": "#724BA1",
    "hype": "#F79646",
    "mm": "grey",
    "expert": "green",
}


def axis_map(pixels: list, values: list) -> tuple:
    """The straight line from pixel coordinates to axis values through the tick marks: (slope, intercept)."""
    if len(pixels) != len(values):
        raise SystemExit(f"error: found {len(pixels)} tick marks at {pixels}, given {len(values)} tick values")
    slope, intercept = np.polyfit(pixels, values, 1)
    worst = np.abs(slope * np.asarray(pixels) + intercept - np.asarray(values)).max()
    if worst > abs(slope):  # ticks off a straight line by more than a pixel: not a linear axis, or a wrong tick
        raise SystemExit(f"error: the ticks at {pixels} are not evenly spaced for the values {values}")
    return slope, intercept


def line_row(counts: np.ndarray) -> float | None:
    """The centre row of the thickest run of consecutive matching rows (counts: matching pixels per row). A
    curve is a run of 2-3 rows in every column; the anti-aliased edge of a black line is grey too, but thin."""
    runs, start = [], None
    for r, c in enumerate([*counts, 0]):
        if c and start is None:
            start = r
        elif not c and start is not None:
            runs.append((int(counts[start:r].sum()), start, r))
            start = None
    if not runs:
        return None
    _, r0, r1 = max(runs)
    return float(np.average(np.arange(r0, r1), weights=counts[r0:r1]))


def digitize(rgb: np.ndarray, x_ticks: list, y_ticks: list, samples: list, legend: tuple) -> dict:
    """rgb: (H, W, 3) uint8. Returns {"x": samples, name: [value or None per sample]} for every COLOURS entry."""
    import matplotlib.colors as mcolors

    dark = rgb.astype(int).sum(-1) < 150
    spine_col = int(dark.sum(0).argmax())
    spine_row = int(dark.sum(1).argmax())
    inside = dark[:, spine_col + 1 : spine_col + 5].all(1)  # y ticks: dark just right of the left spine
    tick_rows = [r for r in np.nonzero(inside)[0] if abs(r - spine_row) > 2]
    above = dark[spine_row - 4 : spine_row, :].all(0)  # x ticks: dark just above the bottom spine
    tick_cols = [c for c in np.nonzero(above)[0] if abs(c - spine_col) > 2]
    ys, yc = axis_map(tick_rows, y_ticks)
    xs, xc = axis_map(tick_cols, x_ticks)
    out = {"x": samples}
    for name, colour in COLOURS.items():
        target = np.array(mcolors.to_rgb(colour)) * 255
        match = np.sqrt(((rgb.astype(float) - target) ** 2).sum(-1)) < 45
        match[:, : spine_col + 2] = False
        match[spine_row:, :] = False
        r0, r1, c0, c1 = legend
        match[r0:r1, c0:c1] = False
        values = []
        for x in samples:
            col = int(round((x - xc) / xs)) + (1 if x == samples[0] else 0)  # the first sample: off the spine
            values.append(
                None if (row := line_row(match[:, col - 1 : col + 2].sum(1))) is None else round(ys * row + yc)
            )
        out[name] = values
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("png")
    p.add_argument("out")
    p.add_argument("--x-ticks", type=float, nargs="+", default=[0, 2e5, 4e5, 6e5, 8e5])
    p.add_argument("--y-ticks", type=float, nargs="+", default=[3000, 2000, 1000, 0])  # top to bottom
    p.add_argument("--samples", type=float, nargs="+", default=[50_000.0 * i for i in range(20)])
    p.add_argument("--legend", type=int, nargs=4, default=[170, 250, 180, 460], help="rows r0 r1, columns c0 c1")
    p.add_argument("--source", default="jren03/garage@8f4fff0 garage/figures/hopper_results_iqm.png")
    args = p.parse_args()
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(args.png)[..., :3] * 255).round().astype(np.uint8)
    curves = digitize(rgb, args.x_ticks, args.y_ticks, [int(s) for s in args.samples], tuple(args.legend))
    record = {
        "source": args.source,
        "what": "IQM over 10 seeds of the true return against learner env steps (Hopper-v3, p_tremble 0.01), read "
        "off the plot's pixels by benchmarks/digitize_paper_curves.py: about +-17 return per pixel; null where "
        "other lines hide the curve; the reference's step counts leave out the discriminator's own rollouts",
        **curves,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(f" {json.dumps(key)}: {json.dumps(value)}" for key, value in record.items())
    Path(args.out).write_text("{\n" + lines + "\n}\n")
    for name in COLOURS:
        print(name, curves[name])


if __name__ == "__main__":
    main()
