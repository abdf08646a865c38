"""The HyPER loop's rates from a mbirl_antmaze.py run dir's TensorBoard wall times (what `gpu.sh hyper-loop` brings
back): seconds per 100 learner steps (median, and overall after exploration), the wall time added by each model
retraining (the 100-step gap that holds it, less the median) with its epochs, actor updates/s, and the
discriminator's real steps per learner step. A resumed run's several event files are read in order.
    python benchmarks/mbirl_tb_rates.py RUN_DIR
Prints one JSON object."""

import json
import statistics
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

series = {}  # tag -> {step: (value, wall time, event file number)}
for i, f in enumerate(sorted(Path(sys.argv[1]).glob("events.out.tfevents.*"))):
    ea = EventAccumulator(str(f), size_guidance={"scalars": 0})
    ea.Reload()
    for tag in ea.Tags()["scalars"]:
        series.setdefault(tag, {}).update({e.step: (e.value, e.wall_time, i) for e in ea.Scalars(tag)})
loop = sorted(series["hyper/model_epochs"].items())  # logged every log-frequency steps of the loop
# (step, seconds, model epochs logged then, steps) between two logs of one process (a resume's restart left out)
gaps = [(s1, b[1] - a[1], b[0], s1 - s0) for (s0, a), (s1, b) in zip(loop, loop[1:]) if a[2] == b[2]]
median = statistics.median(g / n for _, g, _, n in gaps)
steps, (first, _), (last, _) = sum(n for *_, n in gaps), loop[0], loop[-1]
disc = series["hyper/disc_env_steps"][last][0] - series["hyper/disc_env_steps"][first][0]
updates = statistics.median(v[0] for v in series["hyper/actor_updates_per_s"].values())
print(json.dumps({
    "learner_steps": [first, last],
    "median_s_per_100_steps": round(100 * median, 2),
    "overall_steps_per_s": round(steps / sum(g for _, g, _, _ in gaps), 1),
    "slow_gaps (step, extra s, model epochs logged then)": [
        (s, round(g - median * n, 1), e) for s, g, e, n in gaps if g > 1.5 * median * n],
    "actor_updates_per_s_median": round(updates, 1),
    "disc_real_steps_per_learner_step": round(disc / (last - first), 1),
}))  # fmt: skip
