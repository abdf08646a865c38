"""Tests of preference_labelling_app.py, the label store and web app of preference_ga3c_atari.py (issues 11, 12).

Unit tests of `LabelStore` against hand-checked values; the HTTP handlers against a temporary store; a load test
(1,000 answers posted concurrently by 20 clients); a real headless Chromium driving the pages (skipped with the
reason when Chromium, chromedriver or selenium is missing, unless the environment variable CI is set).
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark

import preference_labelling_app as labels

ENV = "ALE/Pong-v5"


def make_frames(t: int, stack: int, seed: int = 0) -> np.ndarray:
    """T + stack - 1 grey 84x84 frames of a square moving left to right (distinct per seed)."""
    frames = np.full((t + stack - 1, 84, 84), 40 + seed % 100, np.uint8)
    for i in range(len(frames)):
        x = (3 * i + seed) % 80
        frames[i, 40:44, x : x + 4] = 230
    return frames


def add_clip(store, t: int = 6, stack: int = 2, ret: float = 0.0, seed: int = 0) -> int:
    rewards = np.zeros(t, np.float32)
    rewards[-1] = ret
    return store.add_clip(make_frames(t, stack, seed), np.arange(t) % 3, rewards, stack, f"test@{seed}")


@pytest.fixture
def store(tmp_path):
    s = labels.LabelStore(tmp_path / "labels", ENV)
    yield s
    s.close()


# ---- the teacher reads a person's answers from the store ----
def test_the_teacher_asks_the_store_and_learns_from_a_person_s_answers(store):
    import torch

    import preference_ga3c_atari as pref

    args = pref.Args(exp_name="person")
    args.labels.clip_length, args.reward.ensemble = 6, 2
    model = pref.RewardEnsemble(2, 2, (10, 0), 0.0, 0.05)
    teacher = pref.Teacher(args, store, model, 2, torch.device("cpu"), np.random.default_rng(0))
    rewards = np.zeros(6, np.float32)
    clips = [make_frames(6, 2, seed) for seed in range(4)]
    teacher.add_clips([{"frames": f, "actions": np.zeros(6), "true_rewards": rewards, "source": "t"} for f in clips])
    assert teacher.ask(2) == 2 and teacher.outstanding() == (0, 2)  # queries wait for the person
    pending = store.pending_queries("person")
    store.answer("person", pending[0]["id"], "left", "web:alice")
    store.answer("person", pending[1]["id"], "cant_tell", "web:bob")  # a skip is no label
    assert teacher.absorb_answers() == 2 and teacher.outstanding() == (2, 0)
    assert [label[:3] for label in teacher.labels] == [(pending[0]["left"], pending[0]["right"], 1.0)]
    assert teacher.train(1) == {} and teacher.updates == 1


# ---- the store ----
def test_a_store_from_before_lives_lost_is_upgraded_in_place(tmp_path):
    import sqlite3

    old = labels.LabelStore(tmp_path / "labels", ENV)
    cid = add_clip(old, ret=2.0)
    old.close()
    with sqlite3.connect(old.path) as db:  # the clips table as it was
        db.execute("ALTER TABLE clips DROP COLUMN lives_lost")
    again = labels.LabelStore(tmp_path / "labels", ENV)
    try:
        assert again.clip_info(cid)["lives_lost"] == 0 and again.clip_info(cid)["true_return"] == 2.0
        new = again.add_clip(make_frames(6, 2), np.zeros(6), np.zeros(6, np.float32), 2, "x", lives_lost=3)
        assert again.clip_info(new)["lives_lost"] == 3
    finally:
        again.close()


def test_add_clip_saves_arrays_and_renders_the_clip_once(store):
    frames = make_frames(5, 4)
    actions = np.array([0, 1, 2, 3, 1])
    rewards = np.array([0, 1, 0, -1, 1], np.float32)
    cid = store.add_clip(frames, actions, rewards, 4, "random")
    info = store.clip_info(cid)
    assert info == {
        "id": cid,
        "length": 5,
        "true_return": 1.0,
        "lives_lost": 0,
        "source": "random",
        "media": info["media"],
    }
    arrays = store.clip_arrays(cid)
    np.testing.assert_array_equal(arrays["frames"], frames)
    np.testing.assert_array_equal(arrays["actions"], actions)
    np.testing.assert_array_equal(arrays["true_rewards"], rewards)
    assert arrays["actions"].dtype == np.int64 and arrays["true_rewards"].dtype == np.float32
    assert arrays["stack"] == 4
    from PIL import Image

    gif = Image.open(store.clips_dir / info["media"])
    assert gif.format == "GIF" and gif.info["loop"] == 0
    # The T frames the agent acted on (frames[stack-1:]), nothing lost (grey fits the palette).
    assert gif.size == (84, 84)
    shown = []
    for i in range(gif.n_frames):
        gif.seek(i)
        shown.append(np.asarray(gif.convert("L")))
    np.testing.assert_array_equal(np.stack(shown), frames[3:])
    assert store.clip_ids() == [cid]


def test_add_clip_rejects_inconsistent_shapes(store):
    with pytest.raises(ValueError, match="T \\+ stack - 1"):
        store.add_clip(make_frames(5, 1), np.zeros(5), np.zeros(5, np.float32), 4, "x")
    with pytest.raises(ValueError, match="uint8"):
        store.add_clip(make_frames(5, 1).astype(np.float32), np.zeros(5), np.zeros(5, np.float32), 1, "x")
    with pytest.raises(ValueError, match="stack"):
        store.add_clip(make_frames(5, 1), np.zeros(5), np.zeros(5, np.float32), -1, "x")
    assert store.clip_ids() == []
    # --stacked-frames 0 (no stacking): one frame per observation, stored as stack 1.
    cid = store.add_clip(make_frames(5, 1), np.zeros(5), np.zeros(5, np.float32), 0, "x")
    assert store.clip_arrays(cid)["stack"] == 1 and store.clip_info(cid)["length"] == 5


def test_gif_frame_durations_average_the_game_speed():
    gif_bytes, png = labels.render_clip_gif(make_frames(30, 1))
    from PIL import Image

    gif = Image.open(io.BytesIO(gif_bytes))
    durations = []
    for i in range(gif.n_frames):
        gif.seek(i)
        durations.append(gif.info["duration"])
    # 30 frames at 15 fps = 2,000 ms, plus the held last frame.
    assert sum(durations) == 2000 + labels.CLIP_HOLD_LAST_MS
    assert set(durations[:-1]) <= {60, 70}
    assert Image.open(io.BytesIO(png)).size == (84, 84)


def gif_frames(data: bytes, mode: str) -> np.ndarray:
    from PIL import Image

    gif, shown = Image.open(io.BytesIO(data)), []
    for i in range(gif.n_frames):
        gif.seek(i)
        shown.append(np.asarray(gif.convert(mode)))
    return np.stack(shown)


def test_a_colour_gif_keeps_every_pixel_of_a_128_colour_palette():
    rng = np.random.default_rng(0)
    palette = rng.integers(0, 256, (128, 3), dtype=np.uint8)  # as many colours as Atari's NTSC palette
    frames = palette[rng.integers(0, 128, (4, 210, 160))]
    gif, png = labels.render_clip_gif(frames)
    np.testing.assert_array_equal(gif_frames(gif, "RGB"), frames)
    np.testing.assert_array_equal(gif_frames(png, "RGB")[0], frames[0])
    with pytest.raises(ValueError, match="at most 256 colours"):
        labels.render_clip_gif(rng.integers(0, 256, (2, 20, 20, 3), dtype=np.uint8))


def record_clips(*args, **kwargs) -> list[dict]:
    """Clips of random play recorded as training records them for --labeler human: the colour-replay benchmark's
    record_clips (benchmarks/preference_colour_replay.py), loaded from its file."""
    return load_benchmark("preference_colour_replay").record_clips(*args, **kwargs)


def test_replayed_clips_are_the_recorded_ones_in_colour():
    """Breakout (FIRE at reset, short random games): each clip replayed from its game's seed, hidden no-ops and
    actions in one emulator gives exactly the grey frames the vector env gave, also in an env's later games."""
    clips = record_clips("breakout", 4, 700, seed=3)
    later = [c for c in clips if c["replay"]["game"] > 0]
    assert len(later) >= 3
    for clip in later[:4] + clips[:2]:
        colour = labels.replay_clip(clip["replay"], clip["frames"], 4)  # None unless the grey frames match
        assert colour is not None and colour.shape == (25, 210, 160, 3) and colour.dtype == np.uint8
        # the game in colour: more than grey levels, and the colours of Atari's palette only
        assert (colour[..., 0] != colour[..., 2]).any() and len(np.unique(colour.reshape(-1, 3), axis=0)) <= 128
        touched = clip["frames"].copy()
        touched[-1, 40, 40] ^= 1  # one grey level of one pixel: the replay no longer matches, refused
        assert labels.replay_clip(clip["replay"], touched, 4) is None
    # Other actions: the paddle held right, or held left, for the last 20 steps; it cannot end where it did both times.
    held = [clip["replay"] | {"actions": clip["replay"]["actions"].copy()} for _ in range(2)]
    held[0]["actions"][-20:], held[1]["actions"][-20:] = 2, 3  # RIGHT, LEFT in Breakout's minimal action set
    assert None in [labels.replay_clip(replay, clip["frames"], 4) for replay in held]


def test_with_sticky_actions_only_an_emulator_s_first_game_is_replayed():
    """ALE/*-v5: the emulator's random state at a later game's start depends on every game before it."""
    clips = record_clips("breakout", 4, 500, seed=5, sticky=0.25)
    first, later = [c for c in clips if c["replay"]["game"] == 0], [c for c in clips if c["replay"]["game"] > 0]
    assert first and later
    assert all(labels.replay_clip(c["replay"], c["frames"], 4) is not None for c in first[:3])
    assert all(labels.replay_clip(c["replay"], c["frames"], 4) is None for c in later)


def test_noop_counts_follow_the_emulators_generator():
    """libstdc++'s uniform_int_distribution over std::mt19937(seed): seed 1's first four draws in [0, 29], as
    the vector env's first four resets of an emulator seeded 1 drew them (found by replaying Pong and Breakout)."""
    assert [labels.noop_count(1, g, 30) for g in range(4)] == [12, 29, 21, 27]
    assert [labels.noop_count(7, g, 30) for g in range(4)] == [2, 6, 23, 9]
    assert {labels.noop_count(5, g, 1) for g in range(20)} == {0}  # noop_max 1 (or 0): never a hidden no-op


def test_a_clip_with_replay_is_stored_grey_for_the_reward_model_and_shown_in_colour(store):
    clip = record_clips("pong", 2, 300, seed=1)[-1]
    cid = store.add_clip(clip["frames"], clip["actions"], clip["true_rewards"], 4, "random", 0, clip["replay"])
    np.testing.assert_array_equal(store.clip_arrays(cid)["frames"], clip["frames"])  # what the reward model reads
    shown = gif_frames((store.clips_dir / store.clip_info(cid)["media"]).read_bytes(), "RGB")
    np.testing.assert_array_equal(shown, labels.replay_clip(clip["replay"], clip["frames"], 4))
    # A replay that does not reproduce the recorded frames (sticky actions in a later game): shown grey, as recorded.
    wrong = clip["replay"] | {"seed": clip["replay"]["seed"] + 1}
    cid = store.add_clip(clip["frames"], clip["actions"], clip["true_rewards"], 4, "random", 0, wrong)
    shown = gif_frames((store.clips_dir / store.clip_info(cid)["media"]).read_bytes(), "L")
    np.testing.assert_array_equal(shown, clip["frames"][3:])


def test_answer_once_then_stale_unknown_and_bad_answers(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    q = store.add_query("exp", "pair", a, b)
    store.answer("exp", q, "left", "alice")
    with pytest.raises(labels.StaleQuery):
        store.answer("exp", q, "right", "bob")
    with pytest.raises(labels.UnknownQuery):
        store.answer("exp", q + 100, "left", "alice")
    with pytest.raises(labels.UnknownQuery):  # a query of another experiment is unknown to this one
        store.answer("other", q, "left", "alice")
    q2 = store.add_query("exp", "pair", a, b)
    with pytest.raises(ValueError, match="answer must be"):
        store.answer("exp", q2, "both", "alice")
    assert [r["answer"] for r in store.answers_after("exp", 0)] == ["left"]
    assert store.pending_queries("exp")[0]["id"] == q2


def test_answers_after_is_in_answer_order_not_query_order(store):
    a, b, c = add_clip(store, seed=1), add_clip(store, seed=2), add_clip(store, seed=3)
    q1 = store.add_query("exp", "pair", a, b)
    q2 = store.add_query("exp", "tree", c, a, node=7)
    q3 = store.add_query("exp", "pair", b, c)
    store.answer("exp", q3, "equal", "s")
    store.answer("exp", q1, "cant_tell", "s")
    store.answer("exp", q2, "right", "s")
    got = store.answers_after("exp", 0)
    assert [r["id"] for r in got] == [q3, q1, q2]
    seqs = [r["seq"] for r in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert got[2] | {"answered_at": 0} == {
        "seq": seqs[2],
        "id": q2,
        "kind": "tree",
        "left": c,
        "right": a,
        "node": 7,
        "answer": "right",
        "labeller": "s",
        "answered_at": 0,
    }
    assert [r["id"] for r in store.answers_after("exp", seqs[0])] == [q1, q2]
    assert store.answers_after("exp", seqs[2]) == []
    assert store.count_answers("exp") == 3
    assert store.count_answers("exp", "tree") == 1 and store.count_answers("exp", "pair") == 2


def test_pending_queries_oldest_first_by_kind(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    q1 = store.add_query("exp", "pair", a, b)
    q2 = store.add_query("exp", "tree", a, b, node=0)
    q3 = store.add_query("exp", "pair", b, a)
    assert [q["id"] for q in store.pending_queries("exp")] == [q1, q2, q3]
    assert [q["id"] for q in store.pending_queries("exp", "pair")] == [q1, q3]
    first = store.pending_queries("exp", "tree")[0]
    assert {k: first[k] for k in ("id", "kind", "left", "right", "node")} == {
        "id": q2,
        "kind": "tree",
        "left": a,
        "right": b,
        "node": 0,
    }
    with pytest.raises(ValueError):
        store.add_query("exp", "triple", a, b)
    with pytest.raises(KeyError):
        store.add_query("exp", "pair", a, 999)


def test_leases_give_two_clients_different_queries_and_expire(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    q1 = store.add_query("exp", "pair", a, b)
    q2 = store.add_query("exp", "pair", b, a)

    def offered(client, kind="pair", **lease):
        return [q["id"] for q in store.next_queries("exp", kind, client, **lease)]

    assert offered("alice") == [q1]
    assert offered("alice") == [q1]  # still hers
    assert offered("bob") == [q2]
    assert offered("carol") == []
    assert offered("carol", "tree") == []
    # Alice's lease, renewed for 0 s, lapses at once: carol may take the oldest query.
    assert offered("alice", lease_s=0.0) == [q1]
    time.sleep(0.01)
    assert offered("carol") == [q1]
    assert offered("alice") == []
    # Anybody may still answer a leased query; then nobody is offered it.
    store.answer("exp", q1, "left", "bob")
    assert [q["id"] for q in store.next_queries("exp", "pair", "erin", count=5)] == []
    assert store.renew_leases("exp", [q2], "bob") == [q2]
    assert store.renew_leases("exp", [q2], "erin") == []


def test_cancel_makes_a_query_stale(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    q = store.add_query("exp", "tree", a, b, node=1)
    store.cancel_query("exp", q)
    assert store.pending_queries("exp") == []
    with pytest.raises(labels.StaleQuery):
        store.answer("exp", q, "left", "x")
    with pytest.raises(labels.StaleQuery):
        store.cancel_query("exp", q)
    with pytest.raises(labels.UnknownQuery):
        store.cancel_query("exp", q + 1)
    assert store.count_answers("exp") == 0


def test_tree_status_and_experiments(store):
    assert store.load_tree("exp") is None and store.get_status("exp") == {}
    tree = {
        "root": 1,
        "nodes": {"1": {"left": None, "right": None, "parent": None, "red": False, "clips": [3]}},
        "pending": {"4": 1},
    }
    store.save_tree("exp", tree)
    store.set_status("exp", {"labels": 3, "budget": 10})
    store.set_status("other", {"agent": "idle"})
    assert store.load_tree("exp") == tree
    assert store.get_status("exp") == {"labels": 3, "budget": 10}
    assert store.experiments() == ["exp", "other"]


def test_delete_labels_keeps_clips_and_other_experiments(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    store.answer("exp", store.add_query("exp", "pair", a, b), "left", "x")
    store.add_query("exp", "pair", a, b)
    keep = store.add_query("other", "pair", a, b)
    store.save_tree("exp", {"root": None, "nodes": {}, "pending": {}})
    assert store.delete_labels("exp") == {"queries": 2, "answers": 1, "trees": 1}
    assert store.pending_queries("exp") == [] and store.answers_after("exp", 0) == []
    assert store.load_tree("exp") is None
    assert [q["id"] for q in store.pending_queries("other")] == [keep]
    assert store.clip_ids() == [a, b]


def test_delete_clips_removes_rows_files_and_every_experiments_labels(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    store.answer("exp", store.add_query("exp", "pair", a, b), "left", "x")
    store.add_query("other", "tree", a, b, node=0)
    store.save_tree("other", {"root": None, "nodes": {}, "pending": {}})
    assert len(list(store.clips_dir.iterdir())) == 6  # npz + gif + png per clip
    assert store.delete_clips() == {"clips": 2, "queries": 2, "answers": 1, "trees": 1}
    assert store.clip_ids() == [] and list(store.clips_dir.iterdir()) == []
    assert store.pending_queries("other") == [] and store.load_tree("other") is None
    # Ids are never reused, so a cached clip or an old query id can never mean something new.
    c = add_clip(store, seed=3)
    assert c > b
    assert store.add_query("exp", "pair", c, c) > 2


def test_env_mismatch_names_both_ids(tmp_path):
    labels.LabelStore(tmp_path, "ALE/Pong-v5").close()
    # "ALE_Pong-v5" maps to the same file name; the recorded env id tells them apart.
    with pytest.raises(ValueError, match="'ALE/Pong-v5'.*'ALE_Pong-v5'"):
        labels.LabelStore(tmp_path, "ALE_Pong-v5")
    labels.LabelStore(tmp_path, "BreakoutNoFrameskip-v4").close()  # another env, another file: fine


def test_reopen_after_close_keeps_everything_including_pending(tmp_path):
    store = labels.LabelStore(tmp_path, ENV)
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    q1 = store.add_query("exp", "pair", a, b)
    q2 = store.add_query("exp", "tree", b, a, node=5)
    store.answer("exp", q1, "right", "alice")
    store.save_tree("exp", {"root": 5, "nodes": {}, "pending": {str(b): 5}})
    store.set_status("exp", {"labels": 1})
    media = store.clip_info(a)["media"]
    store.close()
    (store.clips_dir / "clip_dead.npz.tmp").write_bytes(b"half")  # a killed write
    import os

    os.utime(store.clips_dir / "clip_dead.npz.tmp", (0, 0))
    again = labels.LabelStore(tmp_path, ENV)
    try:
        assert again.clip_ids() == [a, b] and again.clip_info(a)["media"] == media
        assert [(r["id"], r["answer"]) for r in again.answers_after("exp", 0)] == [(q1, "right")]
        assert [q["id"] for q in again.pending_queries("exp")] == [q2]
        assert again.load_tree("exp")["pending"] == {str(b): 5}
        assert again.get_status("exp") == {"labels": 1}
        assert not (again.clips_dir / "clip_dead.npz.tmp").exists()
        again.answer("exp", q2, "equal", "bob")
        assert [r["seq"] for r in again.answers_after("exp", 0)] == [1, 2]
    finally:
        again.close()


def test_concurrent_answers_from_threads_are_each_stored_once(store):
    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    ids = [store.add_query("exp", "pair", a, b) for _ in range(200)]
    stale = []

    def worker(k):
        for q in ids:  # every thread tries every query; exactly one answer per query may win
            try:
                store.answer("exp", q, "left", f"t{k}")
            except labels.StaleQuery:
                stale.append(q)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = store.answers_after("exp", 0)
    assert sorted(r["id"] for r in got) == ids
    assert [r["seq"] for r in got] == list(range(1, 201))
    assert len(stale) == 3 * 200


# ---- the HTTP handlers ----
TESTER = "7e57e70000000000"  # a client id as the pages' cookie holds them (16 hex digits)


def client_headers(server, client: str = TESTER) -> dict:
    """What the app's page sends: its signed labeller token and a JSON body."""
    return {"X-Labeller": server.client_token(client), "Content-Type": "application/json"}


def call(server, method: str, path: str, body=None, headers: dict | None = None, client: str = TESTER):
    """One request to the app as `client`'s page sends it (headers add to or replace those); returns
    (status, parsed JSON or raw bytes, response headers)."""
    import http.client
    import json

    conn = http.client.HTTPConnection(*server.server_address, timeout=30)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        conn.request(method, path, body=data, headers=client_headers(server, client) | (headers or {}))
        response = conn.getresponse()
        raw = response.read()
        kind = response.getheader("Content-Type", "")
        parsed = json.loads(raw) if kind == "application/json" and raw else raw
        return response.status, parsed, dict(response.getheaders())
    finally:
        conn.close()


@pytest.fixture
def app(store):
    """The app serving experiment "exp" (pairwise) on a free loopback port, with 2 clips and 3 pair queries."""
    clips = [add_clip(store, seed=1, ret=1.0), add_clip(store, seed=2)]
    queries = [store.add_query("exp", "pair", clips[0], clips[1]) for _ in range(3)]
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)
    yield server, store, clips, queries
    server.shutdown()


API = "/api/experiments/exp"


def test_http_next_answer_and_skip(app):
    server, store, clips, queries = app
    alice, bob = "a11ce00000000000", "b0b0000000000000"
    status, body, _ = call(server, "GET", API + "/next?kind=pair&count=2", client=alice)
    assert status == 200 and [q["id"] for q in body["queries"]] == queries[:2]
    first = body["queries"][0]
    assert first["left"]["id"] == clips[0] and first["right"]["id"] == clips[1]
    # Bob is offered what alice does not hold.
    status, body, _ = call(server, "GET", API + "/next?count=2", client=bob)
    assert [q["id"] for q in body["queries"]] == queries[2:]
    # The clip is the file rendered at add_clip, cacheable for good.
    status, gif, headers = call(server, "GET", first["left"]["media"])
    assert status == 200 and headers["Content-Type"] == "image/gif"
    assert gif == (store.clips_dir / store.clip_info(clips[0])["media"]).read_bytes()
    assert "immutable" in headers["Cache-Control"]
    status, _, _ = call(server, "GET", first["left"]["media"], headers={"If-None-Match": headers["ETag"]})
    assert status == 304
    status, body, _ = call(server, "POST", API + "/answer", {"query_id": queries[0], "answer": "left"}, client=alice)
    assert (status, body) == (200, {"ok": True, "query_id": queries[0], "answer": "left"})
    # Bob cannot answer the pair alice holds: 409, nothing stored; alice can.
    skip = {"query_id": queries[1], "answer": "cant_tell"}
    status, body, _ = call(server, "POST", API + "/answer", skip, client=bob)
    assert status == 409 and "leased to another labeller" in body["error"]
    assert call(server, "POST", API + "/answer", skip, client=alice)[0] == 200
    got = store.answers_after("exp", 0)
    assert [(r["id"], r["answer"], r["labeller"]) for r in got] == [
        (queries[0], "left", f"web:{alice}"),
        (queries[1], "cant_tell", f"web:{alice}"),
    ]
    status, body, _ = call(server, "GET", API + "/status")
    assert status == 200 and body["answers"] == 2 and body["pending"] == {"pair": 1, "tree": 0}


def test_http_stale_and_unknown_queries(app):
    server, store, clips, queries = app
    assert call(server, "POST", API + "/answer", {"query_id": queries[0], "answer": "right"})[0] == 200
    status, body, _ = call(server, "POST", API + "/answer", {"query_id": queries[0], "answer": "left"})
    assert status == 409 and "no longer pending" in body["error"]
    store.cancel_query("exp", queries[1])
    assert call(server, "POST", API + "/answer", {"query_id": queries[1], "answer": "left"})[0] == 409
    status, body, _ = call(server, "POST", API + "/answer", {"query_id": 12345, "answer": "left"})
    assert status == 404 and "no query 12345" in body["error"]
    assert [r["answer"] for r in store.answers_after("exp", 0)] == ["right"]


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        {"answer": "left"},
        {"query_id": "1", "answer": "left"},
        {"query_id": True, "answer": "left"},
        {"query_id": 1, "answer": "up"},
        {"query_id": 1},
    ],
)
def test_http_malformed_answer_body_is_400(app, body):
    server, store, clips, queries = app
    status, reply, _ = call(server, "POST", API + "/answer", body)
    assert status == 400 and isinstance(reply["error"], str)
    assert store.count_answers("exp") == 0
    # The server is still fine afterwards.
    assert call(server, "POST", API + "/answer", {"query_id": queries[0], "answer": "equal"})[0] == 200


def test_http_missing_length_oversized_body_and_wrong_methods(app):
    import socket

    server, store, clips, queries = app
    with socket.create_connection(server.server_address, timeout=10) as s:
        host, token = "127.0.0.1:%d" % server.server_address[1], server.client_token(TESTER)
        head = f"POST {API}/answer HTTP/1.1\r\nHost: {host}\r\nX-Labeller: {token}\r\n"
        s.sendall(f"{head}Content-Type: application/json\r\n\r\n".encode())
        assert s.recv(4096).split(b"\r\n")[0] == b"HTTP/1.1 411 Length Required"
    big = b'{"query_id": 1, "answer": "left", "pad": "' + b"x" * 70000 + b'"}'
    assert call(server, "POST", API + "/answer", big)[0] == 413
    assert call(server, "GET", API + "/answer")[0] == 405
    assert call(server, "POST", API + "/next", {})[0] == 405
    assert call(server, "POST", "/experiments/exp/compare", {})[0] == 405
    assert call(server, "GET", API + "/next?count=99")[0] == 400
    assert call(server, "GET", API + "/next?kind=triple")[0] == 400
    assert store.count_answers("exp") == 0


def test_http_hostile_requests_are_4xx_and_leave_no_traceback(app, capfd):
    """Each request a client could send wrongly gets the app's JSON 4xx; nothing is stored, nothing printed."""
    import socket
    import struct

    server, store, clips, queries = app
    huge, answer = 2**63, API + "/answer"
    requests = {
        "count=²": ("GET", API + "/next?count=%C2%B2", None, {}),
        "count=-1": ("GET", API + "/next?count=-1", None, {}),
        "query_id 2**63": ("POST", answer, {"query_id": huge, "answer": "left"}, {}),
        "query_id 0": ("POST", answer, {"query_id": 0, "answer": "left"}, {}),
        "lease of 2**63": ("POST", API + "/lease", {"query_ids": [huge]}, {}),
        "a 3,000-deep body": ("POST", answer, b"[" * 3000, {}),
        "a 60,000-deep body": ("POST", answer, b"[" * 60000, {}),
        "a 5,000-digit id": ("POST", answer, b'{"query_id": ' + b"7" * 4000 + b"}", {}),
        "a non-ASCII token": ("GET", API + "/next", None, {"X-Labeller": "\u00e9"}),
        "Content-Length ²": ("POST", answer, b"{}", {"Content-Length": "\u00b2"}),
    }
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "BREW"):
        requests[method] = (method, answer, None, {})
    for what, (method, path, body, headers) in requests.items():
        status, reply, response_headers = call(server, method, path, body, headers)
        assert 400 <= status < 500, (what, status, reply)
        if method == "HEAD":
            assert status == 405 and response_headers["Allow"] == "GET, POST"
        else:
            assert isinstance(reply, dict) and reply["error"], what
        if method in ("PUT", "DELETE", "PATCH", "OPTIONS", "BREW"):
            assert status == 405, what
    # A browser dropping a keep-alive connection mid-request (a reset, not a close).
    with socket.create_connection(server.server_address) as s:
        s.sendall(b"GET " + API.encode() + b"/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.3)
    assert call(server, "GET", API + "/status")[0] == 200  # still serving
    assert store.count_answers("exp") == 0 and "Traceback" not in capfd.readouterr().err


def test_http_unknown_experiment_routes_and_files_are_404(app):
    server, store, clips, queries = app
    status, body, _ = call(server, "POST", "/api/experiments/other/answer", {"query_id": queries[0], "answer": "left"})
    assert status == 404 and "unknown experiment 'other'" in body["error"]
    assert call(server, "GET", "/api/experiments/other/next")[0] == 404
    assert call(server, "GET", "/experiments/other/compare")[0] == 404
    assert call(server, "GET", "/api/experiments/exp/nothing")[0] == 404
    assert call(server, "GET", "/nothing")[0] == 404
    assert call(server, "GET", "/clips/..%2F" + store.path.name)[0] == 404
    assert call(server, "GET", "/clips/clip_0123456789abcdef.gif")[0] == 404
    assert store.count_answers("exp") == 0 and store.count_answers("other") == 0


def test_http_pages_redirect_and_set_a_client_cookie(app):
    server, store, clips, queries = app
    status, _, headers = call(server, "GET", "/")
    assert status == 302 and headers["Location"] == "/experiments/exp/compare"
    import http.client

    conn = http.client.HTTPConnection(*server.server_address, timeout=10)
    conn.request("GET", "/experiments/exp/sort")
    response = conn.getresponse()
    page = response.read().decode()
    assert response.status == 200 and response.getheader("Set-Cookie").startswith("pl_client=")
    client = response.getheader("Set-Cookie").split(";")[0].partition("=")[2]
    assert server.client_token(client) in page  # the page's labeller token, bound to its cookie
    assert "Tree clip is better" in page and '"kind": "tree"' in page
    conn.close()
    tree_server = labels.serve_labelling_app(store, "exp", "sort-tree", port=0)
    try:
        assert call(tree_server, "GET", "/")[2]["Location"] == "/experiments/exp/sort"
    finally:
        tree_server.shutdown()


def test_http_only_the_app_s_own_pages_can_answer(app):
    server, store, clips, queries = app
    answer, port = {"query_id": queries[0], "answer": "left"}, server.server_address[1]
    token = server.client_token("a11ce00000000000")
    refused = {
        "no token": ({"X-Labeller": ""}, 403),
        "a forged token": ({"X-Labeller": token[:-1] + ("1" if token[-1] == "0" else "0")}, 403),
        "another origin's page": ({"Origin": "http://127.0.0.1:1"}, 403),
        "another host name (DNS rebinding)": ({"Host": f"labels.example:{port}"}, 403),
        "a no-cors text/plain post": ({"Content-Type": "text/plain"}, 415),
    }
    for what, (headers, expected) in refused.items():
        status, body, _ = call(server, "POST", API + "/answer", answer, headers=headers)
        assert status == expected and body["error"], what
    assert call(server, "GET", API + "/next", headers={"X-Labeller": ""})[0] == 403  # leasing needs it too
    assert store.count_answers("exp") == 0
    same_origin = {"Origin": f"http://127.0.0.1:{port}"}
    assert call(server, "POST", API + "/answer", answer, headers=same_origin)[0] == 200


def test_beyond_loopback_every_request_needs_the_start_up_token(store):
    server = labels.serve_labelling_app(store, "exp", "pairwise", host="0.0.0.0", port=0)
    try:
        token = server.access_token
        assert token and call(server, "GET", "/experiments/exp/compare")[0] == 403
        assert call(server, "GET", "/?token=wrong")[0] == 403
        status, _, headers = call(server, "GET", "/?token=" + token)
        assert status == 302 and headers["Set-Cookie"].startswith(f"pl_access={token};")
        cookie = {"Cookie": f"pl_access={token}"}
        assert call(server, "GET", "/experiments/exp/compare", headers=cookie)[0] == 200
        assert call(server, "GET", API + "/next", headers=cookie)[0] == 200
        assert call(server, "GET", "/", headers=cookie)[0] == 302  # a bookmark of the page, without the token
        assert call(server, "GET", API + "/next")[0] == 403
    finally:
        server.shutdown()


def test_tree_endpoint_adds_the_clips_media(app):
    server, store, clips, queries = app
    tree = {
        "root": 1,
        "nodes": {"1": {"left": None, "right": None, "parent": None, "red": False, "clips": [clips[0], clips[1]]}},
        "pending": {},
    }
    store.save_tree("exp", tree)
    status, body, _ = call(server, "GET", API + "/tree")
    assert status == 200 and body["tree"] == tree
    name = store.clip_info(clips[1])["media"]
    assert body["clips"][str(clips[1])] == {"media": "/clips/" + name, "poster": "/clips/" + name[:-4] + ".png"}


def test_port_in_use_raises_oserror(app):
    server = app[0]
    with pytest.raises(OSError):
        labels.serve_labelling_app(app[1], "exp", "pairwise", host="127.0.0.1", port=server.server_address[1])
    with pytest.raises(ValueError):
        labels.serve_labelling_app(app[1], "exp", "ranking", port=0)


# ---- load ----
def test_load_1000_answers_from_20_concurrent_clients(store):
    """20 clients post 1,000 answers at once (50 each) and then repeat 100 of them: exactly 1,000 stored, each
    query once, the repeats all 409."""
    import http.client
    import json
    from concurrent.futures import ThreadPoolExecutor

    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    ids = [store.add_query("exp", "pair", a, b) for _ in range(1000)]
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)
    barrier = threading.Barrier(20)

    def client(k: int):
        conn = http.client.HTTPConnection(*server.server_address, timeout=60)  # one keep-alive connection each
        statuses = []
        barrier.wait()
        mine = ids[k::20]
        for qid in mine + mine[:5]:
            body = json.dumps({"query_id": qid, "answer": labels.ANSWERS[qid % 4]})
            conn.request("POST", API + "/answer", body=body, headers=client_headers(server, f"{k:016x}"))
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        conn.close()
        return statuses

    try:
        with ThreadPoolExecutor(20) as pool:
            statuses = [s for result in pool.map(client, range(20)) for s in result]
    finally:
        server.shutdown()
    assert statuses.count(200) == 1000 and statuses.count(409) == 100 and len(statuses) == 1100
    got = store.answers_after("exp", 0)
    assert sorted(r["id"] for r in got) == ids
    assert [r["seq"] for r in got] == list(range(1, 1001))
    assert all(r["answer"] == labels.ANSWERS[r["id"] % 4] for r in got)
    assert store.pending_queries("exp") == []


def test_leased_labelling_by_20_clients_never_offers_one_query_twice(store):
    """20 clients each loop next -> answer over 200 queries: leases mean no two clients ever get the same one."""
    import http.client
    import json
    from concurrent.futures import ThreadPoolExecutor

    a, b = add_clip(store, seed=1), add_clip(store, seed=2)
    ids = [store.add_query("exp", "pair", a, b) for _ in range(200)]
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)

    def client(k: int):
        conn = http.client.HTTPConnection(*server.server_address, timeout=60)
        headers = client_headers(server, f"{k:016x}")
        answered, conflicts = [], 0
        while True:
            conn.request("GET", API + "/next?kind=pair", headers=headers)
            queries = json.loads(conn.getresponse().read())["queries"]
            if not queries:
                break
            conn.request("POST", API + "/answer", json.dumps({"query_id": queries[0]["id"], "answer": "left"}), headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                answered.append(queries[0]["id"])
            else:
                conflicts += 1
        conn.close()
        return answered, conflicts

    try:
        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(client, range(20)))
    finally:
        server.shutdown()
    answered = [q for got, _ in results for q in got]
    assert sorted(answered) == ids and sum(c for _, c in results) == 0
    assert store.count_answers("exp") == 200


# ---- a real browser ----
# Set to a folder to keep the screenshots: the docs show compare, sort and tree.png as
# docs/images/preference_*_colour.png, and the empty pages' in docs/assets/preference_ga3c_atari/.
SCREENSHOT_DIR_VAR = "PREFERENCE_WEBAPP_SCREENSHOTS"


def skip_or_fail(reason: str):
    """Browser tests skip where the browser is missing, but fail in CI, where it must be installed."""
    import os

    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the browser tests must run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from the OS packages, driven by selenium (flags from the project's notes)."""
    import shutil

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_or_fail("selenium is not installed (pip install selenium==4.51.0)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        skip_or_fail("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1000,760",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def pong_frames():
    """Clips of real Pong (random play, recorded as for --labeler human), from late enough that the ball moves."""
    return record_clips("pong", 2, 500, seed=0)[-12:]


def add_pong_clip(store, clips, k: int) -> int:
    """The k-th (mod 12) Pong clip, which the store replays in colour."""
    c = clips[k % len(clips)]
    return store.add_clip(c["frames"], c["actions"], c["true_rewards"], 4, f"random#{k}", 0, c["replay"])


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def shown_query(driver) -> int | None:
    value = driver.find_element("tag name", "body").get_attribute("data-query-id")
    return int(value) if value else None


def clip_loaded_size(driver, element_id: str) -> list:
    """[the clip's own width and height, its width and height on screen] once loaded, else []."""
    return driver.execute_script(
        "const img = document.getElementById(arguments[0]);"
        "return img.complete && img.naturalWidth ? [img.naturalWidth, img.naturalHeight, img.clientWidth, "
        "img.clientHeight] : [];",
        element_id,
    )


COLOUR_PIXELS = """
const img = document.getElementById(arguments[0]), canvas = document.createElement("canvas");
canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
const context = canvas.getContext("2d");
context.drawImage(img, 0, 0);
const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
let coloured = 0;
for (let i = 0; i < data.length; i += 4) if (data[i] !== data[i + 1] || data[i + 1] !== data[i + 2]) coloured += 1;
return [img.naturalWidth, img.naturalHeight, coloured / (data.length / 4)];
"""


def assert_clips_playing(driver, ids=("clip-left", "clip-right")):
    """Each clip is loaded in colour at the game's resolution (160x210, scaled up to fit the window, its shape
    kept) and playing: what the browser paints for it changes over time. (A canvas only draws the first frame.)"""
    for element_id in ids:
        size = wait_for(lambda: clip_loaded_size(driver, element_id), what=f"{element_id} to load")
        assert size[:2] == [160, 210] and size[2] > 160 and abs(size[2] / size[3] - 160 / 210) < 0.01, size
        width, height, coloured = driver.execute_script(COLOUR_PIXELS, element_id)
        assert (width, height) == (160, 210) and coloured > 0.5  # Pong's brown field, its orange and green paddles
        element = driver.find_element("id", element_id)
        first = element.screenshot_as_png
        wait_for(lambda: element.screenshot_as_png != first, timeout=5, what=f"{element_id} to play")


def save_screenshot(driver, tmp_path, name: str):
    import os
    import shutil

    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    keep = os.environ.get(SCREENSHOT_DIR_VAR)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)


def press(driver, key: str):
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(key).perform()


def test_browser_comparison_page(browser, pong_frames, store, tmp_path):
    from selenium.webdriver.common.keys import Keys

    clips = [add_pong_clip(store, pong_frames, k) for k in range(4)]
    queries = [store.add_query("exp", "pair", clips[i], clips[i + 1]) for i in range(3)]
    store.set_status("exp", {"labels": 0, "budget": 3000, "agent": "training, step 12,800", "feedback": "pairwise"})
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)
    try:
        browser.get("http://127.0.0.1:%d/" % server.server_address[1])
        assert browser.current_url.endswith("/experiments/exp/compare")
        wait_for(lambda: shown_query(browser) == queries[0], what="the first pair")
        assert_clips_playing(browser)
        wait_for(lambda: "Labels given: 0 of 3,000" in browser.find_element("id", "status").text, what="status")
        assert "training, step 12,800" in browser.find_element("id", "status").text
        save_screenshot(browser, tmp_path, "compare.png")
        # By click: the label lands in the database and the next (preloaded) pair appears.
        browser.find_element("id", "answer-left").click()
        wait_for(lambda: store.count_answers("exp") == 1, what="the click's answer in the database")
        wait_for(lambda: shown_query(browser) == queries[1], what="the second pair")
        assert_clips_playing(browser)
        # By key.
        press(browser, Keys.ARROW_RIGHT)
        wait_for(lambda: shown_query(browser) == queries[2], what="the third pair")
        press(browser, Keys.ARROW_DOWN)
        wait_for(lambda: store.count_answers("exp") == 3, what="the key answers in the database")
        got = store.answers_after("exp", 0)
        assert [(r["id"], r["answer"]) for r in got] == list(zip(queries, ["left", "right", "cant_tell"]))
        assert labels.CLIENT_ID.match(got[0]["labeller"][4:])  # the browser's cookie
        # Nothing left: the page says the agent is busy and polls until it asks again; the status line is current.
        wait_for(lambda: empty_state(browser) == "waiting", what="the waiting-for-the-agent state")
        wait_for(lambda: "Labels given: 3 of 3,000" in browser.find_element("id", "status").text, 2, "status")
        later = store.add_query("exp", "pair", clips[3], clips[0])
        wait_for(lambda: shown_query(browser) == later, what="a new query to appear by polling")
        press(browser, "e")
        wait_for(lambda: store.count_answers("exp") == 4, what="the equal answer")
        assert store.answers_after("exp", 0)[-1]["answer"] == "equal"
    finally:
        server.shutdown()


def test_browser_a_page_of_another_origin_cannot_answer(browser, store):
    """A page served from another loopback port posts answers to the app (the no-cors text/plain post that
    needs no preflight, and a JSON post): the first reaches the app and is refused, the second never leaves
    the browser (its preflight is refused); nothing is stored."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    query = store.add_query("exp", "pair", add_clip(store, seed=1), add_clip(store, seed=2))
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)
    app_url = "http://127.0.0.1:%d" % server.server_address[1]
    body = f'JSON.stringify({{query_id: {query}, answer: "left"}})'
    evil = f"""<!doctype html><script>
    const url = "{app_url}{API}/answer", body = {body};
    Promise.allSettled([
      fetch(url, {{method: "POST", mode: "no-cors", credentials: "include", body: body,
                   headers: {{"Content-Type": "text/plain"}}}}),
      fetch(url, {{method: "POST", credentials: "include", body: body,
                   headers: {{"Content-Type": "application/json"}}}}),
    ]).then((r) => {{ window.results = r.map((x) => x.status + ":" + (x.value ? x.value.type : "")); }});
    </script>""".encode()

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(evil)))
            self.end_headers()
            self.wfile.write(evil)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        browser.get(app_url + "/")  # the person's own page first: the browser holds the app's cookie
        wait_for(lambda: shown_query(browser) == query, what="the pair on the app's page")
        browser.get("http://127.0.0.1:%d/" % other.server_address[1])
        results = wait_for(lambda: browser.execute_script("return window.results"), what="the other page's posts")
        assert results == ["fulfilled:opaque", "rejected:"]  # the first got an answer (a 403), the second none
        assert store.count_answers("exp") == 0 and [q["id"] for q in store.pending_queries("exp")] == [query]
    finally:
        other.shutdown()
        other.server_close()
        server.shutdown()


def empty_state(driver) -> str | None:
    """Why the page has nothing to label ("waiting", "mode", "budget", "unreachable"), or None if it shows a pair."""
    empty = driver.find_element("id", "empty")
    return empty.get_attribute("data-state") if empty.is_displayed() else None


def test_browser_the_empty_page_says_why(browser, store, tmp_path):
    """Nothing to label: waiting for the agent (what it does, for how long), the other feedback mode's page
    (a link to the right one), the label budget spent (the flag that raises it), the server gone."""
    server = labels.serve_labelling_app(store, "exp", "pairwise", port=0)
    base = "http://127.0.0.1:%d/experiments/exp/" % server.server_address[1]
    agent = "pretraining the reward model on 500 labels, update 120/2000"
    store.set_status("exp", {"labels": 0, "budget": 2, "agent": agent, "updated": time.time()})
    text = lambda: browser.find_element("id", "empty-text").text  # noqa: E731
    try:
        browser.get(base + "compare")
        wait_for(lambda: empty_state(browser) == "waiting" and "2 s so far" in text(), what="the waiting state")
        assert agent in text()
        save_screenshot(browser, tmp_path, "empty_waiting.png")
        browser.get(base + "sort")
        wait_for(lambda: empty_state(browser) == "mode", what="the wrong-mode state")
        assert "This run asks for pairwise answers" in text()
        save_screenshot(browser, tmp_path, "empty_wrong_mode.png")
        browser.find_element("link text", "Compare pairs").click()
        wait_for(lambda: browser.current_url == base + "compare", what="the link to the right page")
        for _ in range(2):
            query = store.add_query("exp", "pair", add_clip(store, seed=1), add_clip(store, seed=2))
            store.answer("exp", query, "left", "test")
        wait_for(lambda: empty_state(browser) == "budget", what="the budget-spent state")
        assert "all 2 labels are given" in text() and "--labels.budget" in text()
        save_screenshot(browser, tmp_path, "empty_budget_spent.png")
    finally:
        server.shutdown()
    status = browser.find_element("id", "status")
    wait_for(lambda: "does not answer" in status.text, 3, "the status line to say the server is gone")


def sort_tree_fixture(store, pong_frames):
    """A 5-node red-black tree over Pong clips (node 2 holds a tie), two clips pending insertion."""
    clips = [add_pong_clip(store, pong_frames, k) for k in range(8)]
    node = lambda left, right, parent, red, bound: {  # noqa: E731
        "left": left,
        "right": right,
        "parent": parent,
        "red": red,
        "clips": bound,
    }
    tree = {
        "root": 2,
        "nodes": {
            "2": node(1, 4, None, False, [clips[2], clips[5]]),
            "1": node(None, None, 2, False, [clips[1]]),
            "4": node(3, 5, 2, True, [clips[4]]),
            "3": node(None, None, 4, False, [clips[3]]),
            "5": node(None, None, 4, False, [clips[0]]),
        },
        "pending": {str(clips[6]): 2, str(clips[7]): 2},
    }
    store.save_tree("exp", tree)
    return clips, tree


def test_browser_sort_tree_page(browser, pong_frames, store, tmp_path):
    from selenium.webdriver.common.keys import Keys

    clips, tree = sort_tree_fixture(store, pong_frames)
    q1 = store.add_query("exp", "tree", clips[6], clips[2], node=2)
    q2 = store.add_query("exp", "tree", clips[7], clips[5], node=2)
    store.add_query("exp", "pair", clips[0], clips[1])  # another kind: not shown on this page
    store.set_status("exp", {"labels": 9, "budget": 100, "agent": "pretraining the reward model"})
    server = labels.serve_labelling_app(store, "exp", "sort-tree", port=0)
    try:
        browser.get("http://127.0.0.1:%d/" % server.server_address[1])
        assert browser.current_url.endswith("/experiments/exp/sort")
        wait_for(lambda: shown_query(browser) == q1, what="the first tree comparison")
        assert_clips_playing(browser)
        assert "node 2" in browser.find_element("id", "caption-right").text
        wait_for(lambda: "Labels given: 0 of 100" in browser.find_element("id", "status").text, what="status")
        save_screenshot(browser, tmp_path, "sort.png")
        browser.find_element("id", "answer-equal").click()
        wait_for(lambda: shown_query(browser) == q2, what="the second tree comparison")
        press(browser, Keys.ARROW_LEFT)
        wait_for(lambda: store.count_answers("exp", "tree") == 2, what="both tree answers")
        assert [(r["id"], r["answer"]) for r in store.answers_after("exp", 0)] == [(q1, "equal"), (q2, "left")]
        assert store.count_answers("exp", "pair") == 0
        wait_for(lambda: browser.find_element("id", "empty").is_displayed(), what="the nothing-to-label state")
    finally:
        server.shutdown()


def test_browser_tree_view(browser, pong_frames, store, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    clips, tree = sort_tree_fixture(store, pong_frames)
    store.set_status("exp", {"labels": 14, "budget": 100, "agent": "training, step 40,960", "feedback": "sort-tree"})
    server = labels.serve_labelling_app(store, "exp", "sort-tree", port=0)
    try:
        browser.get("http://127.0.0.1:%d/experiments/exp/tree" % server.server_address[1])
        wait_for(lambda: "Labels given: 0 of 100" in browser.find_element("id", "status").text, what="status")
        nodes = wait_for(lambda: browser.find_elements("css selector", ".node"), what="the tree's nodes")
        assert len(nodes) == 5
        by_id = {n.get_attribute("data-node-id"): n for n in nodes}
        assert {k for k, n in by_id.items() if "red" in n.get_attribute("class").split()} == {"4"}
        # In-order, left to right = worst to best: nodes 1, 2, 3, 4, 5.
        xs = {k: n.location["x"] for k, n in by_id.items()}
        assert sorted(xs, key=xs.get) == ["1", "2", "3", "4", "5"]
        assert by_id["2"].location["y"] < by_id["4"].location["y"] < by_id["5"].location["y"]
        root_img = by_id["2"].find_element("tag name", "img")
        assert root_img.get_attribute("src").endswith(".png")  # a still until hovered
        assert "2 pending" in by_id["2"].text
        ActionChains(browser).move_to_element(by_id["2"]).perform()
        wait_for(lambda: root_img.get_attribute("src").endswith(store.clip_info(clips[2])["media"]), what="hover play")
        by_id["2"].click()  # the second clip bound to the node (a tie)
        wait_for(lambda: root_img.get_attribute("src").endswith(store.clip_info(clips[5])["media"]), what="click")
        assert "(2/2)" in by_id["2"].text
        save_screenshot(browser, tmp_path, "tree.png")
    finally:
        server.shutdown()


def test_the_app_s_queries_use_indexes_not_table_scans(store):
    """The speed of the next-query, answer and status requests with 10,000s of rows rests on these plans
    (timings: benchmarks/results/preference_webapp.md)."""
    plans = {
        "next": (
            "SELECT id FROM queries WHERE experiment=? AND status='pending' AND kind=? AND (lease_client IS NULL "
            "OR lease_client=? OR lease_until < ?) ORDER BY id LIMIT ?",
            ("e", "pair", "c", 0.0, 2),
        ),
        "answers_after": ("SELECT seq, id FROM queries WHERE experiment=? AND seq > ? ORDER BY seq", ("e", 0)),
        "count_answers": ("SELECT COUNT(*) FROM queries WHERE experiment=? AND status='answered'", ("e",)),
        "answer": ("UPDATE queries SET status='answered' WHERE id=? AND experiment=? AND status='pending'", (1, "e")),
    }
    for name, (sql, params) in plans.items():
        plan = " ".join(row[-1] for row in store._read("EXPLAIN QUERY PLAN " + sql, params))
        assert "SCAN" not in plan and ("INDEX" in plan or "PRIMARY KEY" in plan), (name, plan)
        assert "TEMP B-TREE" not in plan, (name, plan)
