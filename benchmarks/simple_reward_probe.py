"""Does a SimPLe run's reward head see the rewards of real play? One step from real frames, held-out games only.

    python benchmarks/simple_reward_probe.py RUN_DIR [--fresh-head N [--open-loop H]] [--max-windows N]
        [--batch-size B] [--seed S] [--out FILE]

For every held-out window of the run's real collections (env 0 of each collection, never trained on), the world
model (RUN_DIR/world_model.pt, the last epoch's) predicts the reward of one step from the real 4-frame stack and
the real action, two ways: "prior", as the simulated env does for PPO (eval mode, the LSTM prior's bits), and
"posterior", with the bits the inference net reads from the true next frame (as in training, but with no dropout,
bit noise or prior sampling). Printed and written as one JSON line per way (to --out too, when given):

- the confusion counts: true class (-1, 0, +1) against the predicted class (the argmax the simulated env uses);
- the mean predicted probability of each non-zero class on the steps that had it and on those that did not, and
  the AUC of P(reward != 0) for telling the rewarded steps from the others (0.5: no signal; 1: perfect).

A head whose argmax never leaves 0 can still carry the signal below the threshold (AUC well above 0.5); an AUC
near 0.5 with the posterior's bits says the head has not learned where rewards come from at all; a high AUC with
the posterior's bits and a low one with the prior's says the prior is what loses them.

With --fresh-head N, a third line asks whether the information is in the features at all: a fresh logistic
regression (reward != 0 or not, classes weighted to balance) is fitted on the features the reward head reads
(prior's bits, eval mode), from every rewarded training-env window plus N random unrewarded ones, and scored by
its AUC on the held-out windows. A fresh head far above the trained one says the trained head is what fails (its
loss, its optimiser, the rarity of rewards); a fresh head near 0.5 says the world model's features do not carry
the reward yet.

With --open-loop H as well, a fourth line asks whether that signal survives the model's own rollouts, which is
what PPO trains on: from held-out real starts (H-step windows, --max-windows of them) the model runs open loop
under the real actions, as the simulated env runs it (eval mode, its temperatures), and at each step k both heads
score the features it reads; their AUCs against the reward real play got at step k, pooled over buckets of k.

The world model may be of file format 1 or 2: format 2 changed where two dropouts act in training only, so the
evaluation pass (and the posterior pass, run with dropout 0) is the same function of the same weights.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import simple_worldmodel_atari as simple  # noqa: E402


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Probability that a random positive scores above a random negative (ties count half): Mann-Whitney U."""
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--max-windows", type=int, default=0, help="0: every held-out window")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines to this file too")
    parser.add_argument("--fresh-head", type=int, default=0, help="unrewarded training windows for the fresh head")
    parser.add_argument("--open-loop", type=int, default=0, help="with --fresh-head: open-loop steps per rollout")
    args = parser.parse_args(argv)
    if args.open_loop < 0 or (args.open_loop and not args.fresh_head):
        raise simple.UsageError("--open-loop H (H >= 1 open-loop steps) scores the fresh head too: give --fresh-head N")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = load_world_model(args.run_dir / "world_model.pt")
    data = simple.load_collections(args.run_dir)
    windows = data.windows(1, held_out=True)
    if args.max_windows and len(windows) > args.max_windows:
        windows = windows[np.random.default_rng(args.seed).choice(len(windows), args.max_windows, replace=False)]
    held_out_features: list = []
    lines = [probe(model, data, windows, args.batch_size, "prior", held_out_features)]
    if args.fresh_head:
        line, fresh_score = fresh_head(model, data, np.concatenate(held_out_features), args)
        lines.append(line)
        if args.open_loop:
            lines.append(open_loop(model, data, fresh_score, args))
    lines.append(probe(model, data, windows, args.batch_size, "posterior"))
    for out in lines:
        out["run_dir"] = str(args.run_dir)
        print(json.dumps(out))
    if args.out:
        with open(args.out, "a") as f:
            f.write("".join(json.dumps(out) + "\n" for out in lines))
    return lines


def load_world_model(path: Path):
    """The run's world model (file format 1 or 2), or one line naming the file and the fix."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        if (ck["script"], ck["kind"]) == (simple.SCRIPT, "world_model") and ck["version"] in (1, 2):
            return simple.world_model_from(ck)
    except Exception:  # noqa: BLE001 -- unreadable, or not a world model: the same user error
        pass
    raise simple.UsageError(f"cannot read {path} as a world model: pass a run dir of simple_worldmodel_atari.py")


def probe(model, data, windows: np.ndarray, batch_size: int, latent: str, features: list | None = None) -> dict:
    """One step's reward prediction on each window, with the prior's or the posterior's bits; the reward head's
    inputs are appended to `features` (batches of numpy arrays) when given."""
    if latent == "posterior":  # training's forward pass with nothing random left: posterior bits, hard, always used
        cfg = model.cfg
        cfg.dropout = cfg.residual_dropout = cfg.bit_noise = cfg.bit_flip = cfg.prior_max_sampling = 0.0
        cfg.latent_use_max = 1.0
        model.train()
    else:
        model.eval()
    truth, probs = [], []
    keep = model.reward_head.register_forward_hook(
        lambda module, inputs, output: features.append(inputs[0].numpy()) if features is not None else None
    )
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            frames, actions, classes = data.sequences(windows[i : i + batch_size], 1)
            target = frames[:, simple.STACK] if latent == "posterior" else None
            _, reward_logits, _ = model(frames[:, : simple.STACK], actions[:, 0], target=target, step=10**9)
            probs.append(torch.softmax(reward_logits, -1).numpy())
            truth.append(classes[:, 0].numpy())
    keep.remove()
    truth, probs = np.concatenate(truth), np.concatenate(probs)
    predicted = probs.argmax(-1)
    confusion = {
        f"true {c - 1:+d}": {f"pred {p - 1:+d}": int(((truth == c) & (predicted == p)).sum()) for p in range(3)}
        for c in range(3)
    }
    out = {
        "latent": latent,
        "collections": len(data.collections),
        "held_out_steps": len(truth),
        "rewarded_steps": int((truth != 1).sum()),
        "confusion": confusion,
        "auc_nonzero": auc(1 - probs[:, 1], truth != 1),
    }
    for c, name in ((0, "minus"), (2, "plus")):
        has = truth == c
        out[f"p_{name}_when_{name}"] = float(probs[has, c].mean()) if has.any() else None
        out[f"p_{name}_otherwise"] = float(probs[~has, c].mean())
    return out


def fresh_head(model, data, held_out_features: np.ndarray, args) -> dict:
    """A fresh logistic regression on the frozen reward-head inputs: fitted on training-env windows (all rewarded
    ones and args.fresh_head unrewarded ones), scored on the held-out windows (AUC of reward != 0)."""
    train = data.windows(1, held_out=False)
    rewards = np.array([data.collections[c]["rewards"][t, e] for c, e, t in train])
    rng = np.random.default_rng(args.seed)
    quiet = np.flatnonzero(rewards == 0)
    picks = np.concatenate([np.flatnonzero(rewards != 0), rng.choice(quiet, min(args.fresh_head, len(quiet)), False)])
    features: list = []
    fit_probe = probe(model, data, train[picks], args.batch_size, "prior", features)
    x_train, y_train = torch.as_tensor(np.concatenate(features)), torch.as_tensor(rewards[picks] != 0).float()
    held_out = data.windows(1, held_out=True)
    y_held = np.array([data.collections[c]["rewards"][t, e] != 0 for c, e, t in held_out])
    if args.max_windows and len(held_out) > args.max_windows:  # the same subsample main() probed
        held_out_pick = np.random.default_rng(args.seed).choice(len(held_out), args.max_windows, replace=False)
        y_held = y_held[held_out_pick]
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    linear = torch.nn.Linear(x_train.shape[1], 1)
    positives = y_train.sum().clamp(min=1)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=(len(y_train) - positives) / positives)
    optimizer = torch.optim.LBFGS(linear.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(linear((x_train - mean) / std).squeeze(1), y_train) + 1e-3 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)

    def score(features) -> np.ndarray:
        with torch.no_grad():
            return linear((torch.as_tensor(features) - mean) / std).squeeze(1).numpy()

    score_train, score_held = score(x_train), score(held_out_features)
    return {
        "latent": "prior",
        "probe": "fresh linear head on the frozen reward-head inputs",
        "train_windows": len(picks),
        "train_rewarded": int(y_train.sum()),
        "trained_head_auc_on_them": fit_probe["auc_nonzero"],
        "fresh_head_auc_train": auc(score_train, y_train.numpy().astype(bool)),
        "held_out_steps": len(y_held),
        "rewarded_steps": int(y_held.sum()),
        "fresh_head_auc": auc(score_held, y_held),
    }, score


BUCKETS = ((1, 4), (5, 12), (13, 25), (26, None))  # open-loop steps pooled (about 2 % of steps are rewarded)


def bucket_aucs(trained: np.ndarray, fresh: np.ndarray, rewarded: np.ndarray) -> list[dict]:
    """Both heads' AUC per bucket of open-loop steps; arrays (sequences, H), step k in column k - 1; the last bucket
    runs to H."""
    horizon, out = rewarded.shape[1], []
    for first, last in BUCKETS:
        if first > horizon:
            break
        last = horizon if last is None else min(last, horizon)
        pos = rewarded[:, first - 1 : last].ravel()
        out.append(
            {
                "steps": f"{first}-{last}",
                "steps_scored": int(pos.size),
                "rewarded": int(pos.sum()),
                "trained_head_auc": auc(trained[:, first - 1 : last].ravel(), pos),
                "fresh_head_auc": auc(fresh[:, first - 1 : last].ravel(), pos),
            }
        )
    return out


def open_loop(model, data, fresh_score, args) -> dict:
    """Open-loop rollouts from held-out real starts under the real actions (the simulated env's own steps): per
    bucket of steps, the AUC of the trained head's P(reward != 0) and of the fresh head's score."""
    windows = data.windows(args.open_loop, held_out=True)
    if not len(windows):
        raise simple.UsageError(f"no held-out game of {args.open_loop} steps in the run: give a smaller --open-loop")
    if args.max_windows and len(windows) > args.max_windows:
        windows = windows[np.random.default_rng(args.seed).choice(len(windows), args.max_windows, replace=False)]
    model.eval()
    features, truth = [], []
    keep = model.reward_head.register_forward_hook(lambda module, inputs, output: features.append(inputs[0].numpy()))
    with torch.no_grad():
        for i in range(0, len(windows), args.batch_size):
            frames, actions, classes = data.sequences(windows[i : i + args.batch_size], args.open_loop)
            sim = simple.SimulatedEnv(model, model.cfg.pixel_temperature, model.cfg.latent_temperature)
            sim.reset(frames[:, : simple.STACK])
            for k in range(args.open_loop):
                sim.step(actions[:, k])
            truth.append(classes.numpy() != 1)  # (batch, H): rewarded at step k
    keep.remove()
    if len(features) != -(-len(windows) // args.batch_size) * args.open_loop:
        raise RuntimeError("the reward head ran other than once per simulated step: the features are misaligned")
    per_batch = [np.stack(features[i : i + args.open_loop], 1) for i in range(0, len(features), args.open_loop)]
    x, rewarded = np.concatenate(per_batch), np.concatenate(truth)  # (sequences, H, features), (sequences, H)
    with torch.no_grad():
        trained = 1 - torch.softmax(model.reward_head(torch.as_tensor(x)), -1)[..., 1].numpy()
    fresh = fresh_score(x.reshape(-1, x.shape[-1])).reshape(rewarded.shape)
    buckets = bucket_aucs(trained, fresh, rewarded)
    return {"latent": "prior", "probe": "open loop", "horizon": args.open_loop, "sequences": len(x), "buckets": buckets}


if __name__ == "__main__":
    try:
        main()
    except simple.UsageError as e:  # an unreadable or other-version run dir: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
