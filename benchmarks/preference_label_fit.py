"""How well can a pairwise run's labels be fitted, and how well do its (and other runs') reward models order them?
Reads a pairwise run's answered labels (the synthetic labeller's, or the labelling app's store); writes nothing.

1. Every reward checkpoint named (the run's own first, then --also RUN_DIR ...) orders the run's decisive labels
   (left or right, not equal): the share ordered correctly, split by what made the label decisive (the clips' game
   scores differ, or only their lost lives), of the last 100, and the Spearman correlation between each clip's summed
   learned reward and its synthetic score (points - life penalty x lives lost).
2. A fresh predictor (the script's RewardNet, loss, dropout, adaptive L2, batch and learning rate from the run's
   args.json) is trained offline on a random 1 - 1/e of the labels for --updates steps, far more than the run could
   afford, and its accuracy on the held-out decisive labels is printed as it trains: if it climbs well above what the
   run's model reached, the run was short of reward-model training, not of labels.

    python benchmarks/preference_label_fit.py RUN_DIR [--also OTHER_RUN ...] [--updates 3000] [--seed 0] [--dropout P]
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import preference_ga3c_atari as pref  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--also", nargs="*", default=[], help="other runs whose reward checkpoints order these labels")
parser.add_argument("--updates", type=int, default=3000, help="offline updates of the fresh predictor (0: none)")
parser.add_argument("--eval-every", type=int, default=250)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--dropout", type=float, default=None, help="the fresh predictor's dropout (default: the run's)")
cli = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(cli.seed)
rng = np.random.default_rng(cli.seed)

run = Path(cli.run_dir)
args = json.loads((run / "args.json").read_text())
rom, _ = pref.resolve_env_id(args["env_id"])
stack = max(1, args["env"]["stacked_frames"])
penalty = args["labels"]["life_penalty"]
penalty = (0.0 if rom == "pong" else 1.0) if penalty < 0 else penalty
mask = tuple(
    v if v >= 0 else d
    for v, d in zip(
        (args["reward"]["mask_top"], args["reward"]["mask_bottom"]), pref.SCORE_MASKS.get(rom, pref.DEFAULT_MASK)
    )
)
synthetic = pref.SyntheticLabeller(args["labels"]["store_dir"], args["env_id"], args["exp_name"], penalty)
if synthetic.answers:  # the synthetic labeller keeps its own labels; a person's are in the labelling app's store
    store = synthetic
    clip_info = {c: {"true_return": points, "lives_lost": lost} for c, (points, lost) in synthetic.clips.items()}.get
else:  # a --labeler human run, or a synthetic run made before the synthetic labeller kept its own labels
    from preference_labelling_app import LabelStore

    store = LabelStore(args["labels"]["store_dir"], args["env_id"])
    clip_info = store.clip_info
labels = [
    (a["left"], a["right"], {"left": 1.0, "right": 0.0, "equal": 0.5}[a["answer"]])
    for a in store.answers_after(args["exp_name"], 0)
    if a["kind"] == "pair" and a["answer"] != "cant_tell"
]
clips = sorted({c for label in labels for c in label[:2]})
info = {c: clip_info(c) for c in clips}
obs = {c: pref.clip_observations(torch.from_numpy(store.clip_arrays(c)["frames"]), stack) for c in clips}
score = {c: info[c]["true_return"] - penalty * info[c]["lives_lost"] for c in clips}
decisive = [label for label in labels if label[2] != 0.5]
by_points = np.array([info[a]["true_return"] != info[b]["true_return"] for a, b, _ in decisive])
print(
    f"{run}: {len(labels)} labels ({len(decisive)} decisive: {by_points.sum()} by points, "
    f"{(~by_points).sum()} by lost lives only) on {len(clips)} clips"
)


def ordered(sums: dict, subset) -> np.ndarray:
    """Per label of `subset`: does the clip with the larger summed reward carry the label's preference?"""
    return np.array([(sums[a] > sums[b]) == (mu == 1.0) for a, b, mu in subset])


# 1. The runs' own reward checkpoints --------------------------------------------------------------------------
for other in [run, *map(Path, cli.also)]:
    state = torch.load(other / "checkpoints" / "reward_model.pt", weights_only=False)
    members = sum(key.endswith("head.2.bias") for key in state["model"])
    model = pref.RewardEnsemble(members, stack, mask, 0.0, 1.0)
    model.load_state_dict(state["model"])
    model.eval()
    with torch.no_grad():
        sums = {c: model(obs[c]).sum().item() for c in clips}
    right = ordered(sums, decisive)
    rho = spearmanr([sums[c] for c in clips], [score[c] for c in clips]).statistic
    print(
        f"  {other.name} ({state['updates']:,} updates): ordered {right.mean():.1%} of decisive labels "
        f"({right[by_points].mean():.1%} by points, {right[~by_points].mean():.1%} by lives only, "
        f"last 100 {right[-100:].mean():.1%}); Spearman(clip sum, score) {rho:.2f}"
    )

# 2. A fresh predictor trained offline for longer ---------------------------------------------------------------
if cli.updates:
    r = args["reward"]
    held = rng.random(len(labels)) < 1 / math.e
    train_idx, held_idx = np.flatnonzero(~held), np.flatnonzero(held)
    held_decisive = [labels[i] for i in held_idx if labels[i][2] != 0.5]
    train_decisive = [labels[i] for i in train_idx if labels[i][2] != 0.5]
    seen = [train_decisive[i] for i in rng.permutation(len(train_decisive))[: len(held_decisive)]]  # as many
    dropout = r["dropout"] if cli.dropout is None else cli.dropout
    net = pref.RewardNet(stack, mask, dropout)
    optimizer = torch.optim.Adam(net.parameters(), lr=r["lr"])
    l2, train_loss, start = r["l2_init"], 1.0, time.time()

    def loss_on(idx):
        pick = [labels[i] for i in idx]
        sums = net(torch.cat([obs[c] for p in pick for c in p[:2]])).view(len(pick), 2, -1).sum(-1)
        mu = torch.tensor([p[2] for p in pick])
        return pref.preference_loss(sums[:, 0], sums[:, 1], mu, r["random_response"])

    print(
        f"  fresh predictor: {len(train_idx)} training labels, {len(held_idx)} held out "
        f"({len(held_decisive)} decisive), batch {r['batch_size']}, lr {r['lr']}, dropout {dropout}"
    )
    for update in range(1, cli.updates + 1):
        net.train()
        loss = loss_on(rng.choice(train_idx, r["batch_size"]))
        weights = sum(p.pow(2).sum() for n, p in net.named_parameters() if "weight" in n)
        optimizer.zero_grad()
        (loss + l2 * weights).backward()
        optimizer.step()
        train_loss = 0.9 * train_loss + 0.1 * loss.item()
        net.eval()
        with torch.no_grad():
            if update % 20 == 0:  # the script's L2 adaptation, on held-out labels every 20 updates
                val = loss_on(rng.choice(held_idx, r["batch_size"])).item()
                l2 = pref.adapt_l2(l2, train_loss, val)
            if update % cli.eval_every == 0 or update == cli.updates:
                sums = {c: net(obs[c]).sum().item() for c in {c for p in seen + held_decisive for c in p[:2]}}
                train_right = ordered(sums, seen)
                print(
                    f"    update {update:5d} ({update * r['batch_size'] / len(train_idx):5.1f} epochs): "
                    f"train {train_right.mean():.1%} (a sample), "
                    f"held-out {ordered(sums, held_decisive).mean():.1%} "
                    f"of decisive labels; train loss {train_loss:.3f}, l2 {l2:.2e}, "
                    f"{time.time() - start:.0f} s",
                    flush=True,
                )
