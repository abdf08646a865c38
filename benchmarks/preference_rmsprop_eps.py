"""How much of the GA3C network RMSProp's epsilon swamps, in a real preference_ga3c_atari.py run.

Where a weight's running RMS gradient sqrt(v) is below eps, RMSProp's step lr * g / (sqrt(v) + eps) is about
lr / eps * g: plain SGD, not the adaptive step. This resumes a copy of a run (or starts a fresh true-reward run of an
env id) with the script's own code, for UPDATES agent updates, and prints the gradient norm before clipping and, per
parameter tensor, the share of weights with sqrt(v) < eps and the median sqrt(v). The run dir itself is not touched.
    python benchmarks/preference_rmsprop_eps.py RUN_DIR_OR_ENV_ID [UPDATES] [script flags, e.g. --ga3c.rms-eps 0.1]
Result (2026-11-26, 2-core AVX2 VM): on runs/pref_breakout_rl (trained with eps 0.1 to 6.08M agent steps), 1,231
updates: gradient norm median 9.7 (p10 5.0, p90 20.1; the clip at 40 never bit); 99.8 % of the weights had
sqrt(v) < 0.1, the FC layer's (256 x 2592) median sqrt(v) 6.2e-4 -- 160x below eps.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import preference_ga3c_atari as p  # noqa: E402

target, updates = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 1000
extra = sys.argv[3 if len(sys.argv) > 2 and sys.argv[2].isdigit() else 2 :]
tmp = Path(tempfile.mkdtemp())
if Path(target).is_dir():
    run = json.loads((Path(target) / "args.json").read_text())
    shutil.copytree(target, tmp / "run")
    flags = ["--env-id", run["env_id"], "--labeler", run["labeler"], "--feedback", run["feedback"]]
    flags += ["--seed", str(run["seed"]), "--exp-name", run["exp_name"], "--torch-threads", "1"]
else:
    flags = ["--env-id", target, "--labeler", "rl", "--torch-threads", "1"]
flags += ["--run-dir", str(tmp / "run"), "--ga3c.env-threads", "1", *extra]

norms, last = [], {}
clip_grad_norm = torch.nn.utils.clip_grad_norm_
rmsprop_step = torch.optim.RMSprop.step


def clip(params, *a, **k):
    norm = clip_grad_norm(params, *a, **k)
    norms.append(float(norm))
    return norm


def step(self, *a, **k):
    out = rmsprop_step(self, *a, **k)
    group = self.param_groups[0]
    last["eps"] = group["eps"]
    last["rows"] = [
        (tuple(q.shape), (r < group["eps"]).float().mean().item(), r.median().item(), r.numel())
        for q in group["params"]
        for r in [self.state[q]["square_avg"].sqrt()]
    ]
    if len(norms) >= updates:
        os.kill(os.getpid(), signal.SIGTERM)  # the script saves (into the copy) and exits
    return out


torch.nn.utils.clip_grad_norm_ = clip
torch.optim.RMSprop.step = step
try:
    p.main(tyro.cli(p.Args, args=flags))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
n = np.array(norms)
print(
    f"{len(n)} updates; gradient norm before clipping: median {np.median(n):.1f}, p10 {np.percentile(n, 10):.1f}, "
    f"p90 {np.percentile(n, 90):.1f}, clipped at 40: {(n > 40).mean():.0%}"
)
total = sum(r[3] for r in last["rows"])
swamped = sum(r[1] * r[3] for r in last["rows"]) / total
print(f"weights with sqrt(v) < eps = {last['eps']:g}: {swamped:.1%} of {total:,}")
for shape, share, median, _ in last["rows"]:
    print(f"  {str(shape):18} sqrt(v) < eps: {share:6.1%}   median sqrt(v) {median:.2e}")
