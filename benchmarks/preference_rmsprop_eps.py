"""How much of the GA3C network RMSProp's epsilon swamps, in a real preference_ga3c_atari.py run.

Where a weight's running RMS gradient sqrt(v) is below eps, RMSProp's step lr * g / (sqrt(v) + eps) is about
lr / eps * g: plain SGD, not the adaptive step. This resumes a copy of a run (or starts a fresh true-reward run of an
env id) with the script's own code, for UPDATES agent updates, and prints the gradient norm before clipping and, per
parameter tensor, the share of weights with sqrt(v) < eps and the median sqrt(v). The run dir itself is not touched.
    python benchmarks/preference_rmsprop_eps.py RUN_DIR_OR_ENV_ID [UPDATES] [script flags, e.g. --ga3c.rms-eps 0.1]
Result (2026-11-26, 2-core AVX2 VM, 1,000 updates each): runs/pref_breakout_rl (eps 0.1, at 6.08M agent steps):
gradient norm median 10.3 (clipped at 40: 1 %); 84.6 % of the weights with 1e-10 <= sqrt(v) < eps, 15.1 % with none;
the FC layer's median sqrt(v) 6.8e-4, 150x below eps. runs/pref_breakout_rl_eps1e-5 (eps 1e-5, at 3.28M): norm median
29.8 (clipped: 31 %); 3.5 % swamped, 63.5 % with no gradient (57 % of the FC layer's units are dead ReLUs).
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
    flags += ["--ga3c.learning-rate", str(run["ga3c"]["learning_rate"]), "--ga3c.rms-eps", str(run["ga3c"]["rms_eps"])]
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
        (
            tuple(q.shape),
            ((r >= 1e-10) & (r < group["eps"])).float().mean().item(),
            r.median().item(),
            r.numel(),
            (r < 1e-10).float().mean().item(),
        )
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
swamped, dead = (sum(r[i] * r[3] for r in last["rows"]) / total for i in (1, 4))
print(
    f"of {total:,} weights: {swamped:.1%} with 1e-10 <= sqrt(v) < eps = {last['eps']:g} (SGD-like steps), "
    f"{dead:.1%} with no gradient (sqrt(v) < 1e-10: dead ReLUs)"
)
for shape, share, median, _, none in last["rows"]:
    print(f"  {str(shape):18} swamped {share:6.1%}  no gradient {none:6.1%}  median sqrt(v) {median:.2e}")
