"""Tests of preference_ga3c_atari.py: the math against hand-computed values, the red-black sort tree, GA3C learning a
tiny problem, the reward model learning from synthetic preferences, smoke runs, resume, the contract and bad input."""

import json
import math
import time

import numpy as np
import pytest
import torch

import preference_ga3c_atari as pref

SCRIPT = "preference_ga3c_atari.py"
TINY = ["--total-timesteps", "1500", "--ga3c.workers", "4", "--ga3c.min-batch-segments", "4", "--eval.episodes", "1",
        "--env.max-episode-frames", "800", "--labels.pretrain", "6", "--labels.budget", "12", "--labels.clip-length",
        "5", "--reward.pretrain-epochs", "2", "--reward.batch-size", "4", "--labels.rate-scale", "1000",
        "--reward.labels-per-step", "0.02", "--torch-threads", "1"]  # fmt: skip


# ---- the math ------------------------------------------------------------------------------------------------------
def test_preference_loss_matches_hand_values():
    # P(left) = 0.9 * sigmoid(1) + 0.05 = 0.707953...
    p = 0.9 / (1 + math.exp(-1.0)) + 0.05
    one = pref.preference_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0]), 0.1)
    assert one.item() == pytest.approx(-math.log(p), rel=1e-6)
    equal = pref.preference_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5]), 0.1)
    assert equal.item() == pytest.approx(-0.5 * math.log(p) - 0.5 * math.log(1 - p), rel=1e-6)
    # the random-response term bounds the loss of a confidently wrong prediction: -log(0.05) at most
    wrong = pref.preference_loss(torch.tensor([100.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.1)
    assert wrong.item() == pytest.approx(-math.log(0.05), rel=1e-4)


def test_quantile_targets_are_scaled_normal_quantiles():
    targets = pref.quantile_targets(4, 25)
    expected = 25 * np.array([-1.1503494, -0.3186394, 0.3186394, 1.1503494])
    np.testing.assert_allclose(targets.numpy(), expected, rtol=1e-5)
    assert pref.quantile_targets(1, 25).tolist() == [0.0]


def test_label_schedule():
    assert pref.desired_labels(0, 10_000_000, 3000, 500) == 500
    assert pref.desired_labels(10_000_000, 10_000_000, 3000, 500) == 3000
    assert pref.desired_labels(20_000_000, 10_000_000, 3000, 500) == 3000
    # halfway in rate terms: log(2) / log(3) of the post-pretraining labels
    assert pref.desired_labels(5_000_000, 10_000_000, 3000, 500) == 500 + round(2500 * math.log(2) / math.log(3))
    steps = [pref.desired_labels(s, 10_000_000, 3000, 500) for s in range(0, 10_000_001, 1_000_000)]
    gains = np.diff(steps)
    assert (gains >= 0).all() and gains[0] > gains[-1]  # the rate decays


def test_disagreement_picks_the_most_disputed_pair():
    probs = torch.tensor([[0.5, 0.1, 0.9], [0.5, 0.9, 0.8], [0.5, 0.5, 0.85]])  # members x pairs
    var = pref.disagreement(probs)
    assert int(torch.argmax(var)) == 1
    assert var[0].item() == 0.0
    assert var[1].item() == pytest.approx(np.var([0.1, 0.9, 0.5]), rel=1e-6)


def test_adaptive_l2():
    assert pref.adapt_l2(1.0, train_loss=1.0, val_loss=2.0) == pytest.approx(1.1)
    assert pref.adapt_l2(1.0, train_loss=1.0, val_loss=1.0) == pytest.approx(1 / 1.1)
    assert pref.adapt_l2(1.0, train_loss=1.0, val_loss=1.3) == 1.0


def test_nstep_returns_hand_values_with_batch_not_equal_to_length():
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    returns = pref.nstep_returns(rewards, torch.tensor([10.0, 4.0]), 0.5)
    np.testing.assert_allclose(returns.numpy(), [[2.5, 3.0, 6.0], [0.5, 1.0, 2.0]])


def test_a3c_loss_hand_values():
    logits = torch.zeros(1, 2, 2, requires_grad=True)  # pi = (0.5, 0.5)
    values = torch.tensor([[0.0, 1.0]], requires_grad=True)
    actions = torch.tensor([[0, 1]])
    returns = torch.tensor([[1.0, 1.0]])
    policy_loss, value_loss, entropy = pref.a3c_loss(logits, values, actions, returns, entropy_beta=0.01)
    log_half = math.log(0.5)
    # advantages 1 and 0; entropy ln 2 per step; sums over the batch
    assert policy_loss.item() == pytest.approx(-(log_half * 1 + 0.01 * math.log(2)) - (0 + 0.01 * math.log(2)))
    assert value_loss.item() == pytest.approx(0.5 * (1.0 + 0.0))
    assert entropy.item() == pytest.approx(math.log(2))
    policy_loss.backward()
    assert values.grad is None or torch.all(values.grad == 0)  # the advantage is a constant for the policy term


def test_clip_observations_rebuild_the_stacks():
    frames = torch.arange(7, dtype=torch.uint8)[:, None, None].expand(7, 84, 84).contiguous()  # T=4, S=4
    obs = pref.clip_observations(frames, 4)
    assert obs.shape == (4, 4, 84, 84)
    assert obs[:, :, 0, 0].tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
    assert pref.clip_observations(frames[:4], 1).shape == (4, 1, 84, 84)


def test_synthetic_labeller_treats_ties_as_indifference():
    assert pref.synthetic_answer(1.0, 0.0) == "left"
    assert pref.synthetic_answer(0.0, 1.0) == "right"
    assert pref.synthetic_answer(0.0, 0.0) == "equal"


def test_reward_net_ignores_the_masked_score_rows():
    torch.manual_seed(0)
    net = pref.RewardNet(4, (10, 5), dropout=0.0).eval()
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    changed = obs.clone()
    changed[:, :, :10] = 255 - changed[:, :, :10]
    changed[:, :, 79:] = 0
    assert torch.equal(net(obs), net(changed))
    changed[:, :, 40] = 255 - changed[:, :, 40]
    assert not torch.equal(net(obs), net(changed))


def test_ensemble_output_is_normalised():
    torch.manual_seed(0)
    ens = pref.RewardEnsemble(3, 4, (0, 0), dropout=0.0, output_std=0.05).eval()
    obs = torch.randint(0, 255, (64, 4, 84, 84), dtype=torch.uint8)
    raw = ens.member_rewards(obs)
    ens.mean.copy_(raw.mean(1))
    ens.std.copy_(raw.std(1))
    out = ens(obs)
    assert abs(out.mean().item()) < 1e-6
    # the mean of 3 members each of std 1, scaled by 0.05: at most 0.05
    assert 0.0 < out.std().item() <= 0.05 + 1e-6


# ---- the red-black sort tree ---------------------------------------------------------------------------------------
def insert_by_oracle(tree, clip, value, values):
    """Insert a clip, answering each comparison from hidden values (the synthetic labeller's rule)."""
    node = tree.add_clip(clip)
    while node is not None:
        other = tree.nodes[node]["clips"][0]
        node = tree.answer(clip, node, pref.synthetic_answer(value, values[other]))


@pytest.mark.parametrize("seed", range(5))
def test_sort_tree_stays_red_black_and_ranks_like_a_sort(seed):
    rng = np.random.default_rng(seed)
    values = {clip: float(rng.integers(0, 40)) for clip in range(120)}  # many ties
    tree = pref.SortTree()
    for clip, value in values.items():
        insert_by_oracle(tree, clip, value, values)
        pref.check_red_black(tree)
    ranked = tree.ranked_clips()
    assert sorted(c for c, _ in ranked) == list(values)  # no clip lost or duplicated
    ranks = np.array([r for _, r in ranked])
    vals = np.array([values[c] for c, _ in ranked])
    assert (np.diff(ranks) >= 0).all() and (np.diff(vals) >= 0).all()  # in-order = sorted
    assert len(tree.nodes) == len(set(values.values()))  # ties bound to one node each
    for clip_a, rank_a in ranked:  # equal values <=> equal ranks
        for clip_b, rank_b in ranked[:10]:
            assert (rank_a == rank_b) == (values[clip_a] == values[clip_b])


def test_sort_tree_interleaved_insertions_survive_rotations():
    """Several clips are mid-insertion while others finish and rotate the tree above them."""
    rng = np.random.default_rng(3)
    values = {clip: float(v) for clip, v in enumerate(rng.permutation(60))}
    tree, pending = pref.SortTree(), {}
    for clip in range(60):
        node = tree.add_clip(clip)
        if node is not None:
            pending[clip] = node
        for other in list(pending)[: int(rng.integers(0, 3))]:  # answer a few pending comparisons
            node = pending.pop(other)
            ref = tree.nodes[node]["clips"][0]
            nxt = tree.answer(other, node, pref.synthetic_answer(values[other], values[ref]))
            if nxt is not None:
                pending[other] = nxt
            pref.check_red_black(tree)
    while pending:
        other, node = pending.popitem()
        ref = tree.nodes[node]["clips"][0]
        nxt = tree.answer(other, node, pref.synthetic_answer(values[other], values[ref]))
        if nxt is not None:
            pending[other] = nxt
    pref.check_red_black(tree)
    order = [values[c] for c, _ in tree.ranked_clips()]
    assert order == sorted(values.values())


def test_sort_tree_state_round_trips_through_json():
    values = {clip: float(clip % 7) for clip in range(20)}
    tree = pref.SortTree()
    for clip, value in values.items():
        insert_by_oracle(tree, clip, value, values)
    node = tree.add_clip(99)  # one clip mid-insertion
    again = pref.SortTree(json.loads(json.dumps(tree.state())))
    assert again.ranked_clips() == tree.ranked_clips()
    assert again.position(99) == tree.position(99) and node == again.position(99)[0]
    pref.check_red_black(again)


def test_check_red_black_catches_a_broken_tree():
    values = {clip: float(clip) for clip in range(10)}
    tree = pref.SortTree()
    for clip, value in values.items():
        insert_by_oracle(tree, clip, value, values)
    tree.nodes[tree.root]["red"] = True
    with pytest.raises(AssertionError):
        pref.check_red_black(tree)


# ---- behaviour: GA3C learns a tiny problem -------------------------------------------------------------------------
class ToyVectorEnv:
    """AtariVectorEnv's async interface on a one-step game: the bright half of the frame names the rewarded action."""

    def __init__(self, num_envs, batch_size, seed=0):
        self.num_envs, self.batch_size = num_envs, batch_size
        self.rng = np.random.default_rng(seed)
        self.state = self.rng.integers(0, 2, num_envs)
        self.order = list(range(num_envs))
        self.rewards = []

    def frames(self, ids):
        obs = np.zeros((len(ids), 1, 84, 84), np.uint8)
        for j, env in enumerate(ids):
            obs[j, 0, :, :42] = 255 * (self.state[env] == 0)
            obs[j, 0, :, 42:] = 255 * (self.state[env] == 1)
        return obs

    def reset(self, seed=None):
        ids = np.array(self.order[: self.batch_size])
        self.order = self.order[self.batch_size :] + list(ids)
        self.pending = ids
        return self.frames(ids), {"env_id": ids}

    def send(self, actions):
        reward = (actions == self.state[self.pending]).astype(np.float32)
        self.rewards += reward.tolist()
        self.last = dict(zip(self.pending.tolist(), reward))
        self.state[self.pending] = self.rng.integers(0, 2, len(self.pending))

    def recv(self):
        ids = np.array(self.order[: self.batch_size])
        self.order = self.order[self.batch_size :] + list(ids)
        reward = np.array([self.last.get(int(e), 0.0) for e in ids], np.float32)
        self.pending = ids
        none = np.zeros(len(ids), bool)
        return self.frames(ids), reward, none, none, {"env_id": ids}


def test_ga3c_threads_learn_a_tiny_problem_on_the_true_reward():
    torch.manual_seed(0)
    envs = ToyVectorEnv(8, 8)
    net = pref.GA3CNet(1, 2)
    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3, alpha=0.99, eps=0.1)
    ga3c = pref.GA3CArgs(t_max=5, min_batch_segments=8, gamma=0.0, entropy_beta=0.01)
    shared = pref.Shared(32)
    shared.random_actions = False
    recorder = pref.ClipRecorder(5, 1, 1, 8, np.random.default_rng(0))
    pref.start_thread(shared, pref.run_predictor, envs, net, shared, 5, 2, recorder, 0)
    pref.start_thread(shared, pref.run_trainer, net, optimizer, lambda obs, true: true, shared, ga3c)
    deadline = time.time() + 60
    while shared.updates < 300 and time.time() < deadline and shared.error is None:
        time.sleep(0.1)
    shared.stop.set()
    pref.join_threads(shared)
    assert shared.error is None
    assert shared.updates >= 100
    assert np.mean(envs.rewards[:400]) < 0.7  # it starts at chance
    assert np.mean(envs.rewards[-800:]) > 0.9  # and learns the rewarded action
    assert shared.lag >= 0


def test_clip_recorder_cuts_clips_and_restarts_at_a_new_game():
    rec = pref.ClipRecorder(length=3, stack=2, slots=1, num_envs=1, rng=np.random.default_rng(0))
    ids, over = np.array([0]), np.array([False])
    out = []
    for t in range(3):
        obs = np.full((1, 2, 84, 84), t, np.uint8)
        obs[0, -1] = t + 10
        out += rec.observe(ids, obs, np.array([t]), np.array([float(t)]), over, "test")
    assert len(out) == 1
    clip = out[0]
    assert clip["frames"].shape == (4, 84, 84)  # T + S - 1
    assert clip["frames"][:, 0, 0].tolist() == [0, 10, 11, 12]
    assert clip["actions"].tolist() == [0, 1, 2] and clip["true_rewards"].tolist() == [0.0, 1.0, 2.0]
    obs = np.zeros((1, 2, 84, 84), np.uint8)
    rec.observe(ids, obs, np.array([0]), np.array([0.0]), over, "test")
    assert rec.observe(ids, obs, np.array([0]), np.array([0.0]), np.array([True]), "test") == []
    assert rec.active[0]["actions"] == []  # a new game restarts the clip
