"""The label store and the labelling web app of preference_ga3c_atari.py (RL from human preferences).

`LabelStore`: one SQLite file per env (clips shared by all experiments of that env, as in rl-teacher-atari) with
each experiment's queries, answers, sort tree and status. The learning code adds clips and queries; a labeller
(synthetic or a person through the web app) answers them; the learning code reads answers in order.
`serve_labelling_app`: a stdlib `ThreadingHTTPServer` with the comparison page, the sort-tree page, the tree view
and JSON endpoints. Clips are rendered once, at `add_clip`, as looping greyscale GIFs (see `render_clip_gif`).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ANSWERS = ("left", "right", "equal", "cant_tell")
QUERY_KINDS = ("pair", "tree")
CLIP_FPS = 15.0  # Atari with frameskip 4: 60 / 4 agent steps per second, the speed a person sees the game at
CLIP_VIEW_PX = 336  # clips are upscaled (nearest neighbour) to about this many pixels on their long side
CLIP_HOLD_LAST_MS = 300  # the last frame is held so the loop's seam is visible
SCHEMA_VERSION = 1


class UnknownQuery(Exception):
    """No query with this id (for this experiment)."""


class StaleQuery(Exception):
    """The query exists but is no longer pending (answered, or cancelled)."""


def render_clip_gif(frames: np.ndarray, fps: float = CLIP_FPS) -> tuple[bytes, bytes]:
    """A looping animated GIF of grey uint8 frames (T, H, W), upscaled, and a PNG of its first frame (the poster).

    Why GIF: it plays in every current browser with no plugin and no codec (an `<img>`, looping by itself), and a
    grey frame has at most 256 levels, so GIF's 256-colour palette stores it losslessly: the few-pixel Pong ball
    stays sharp, where a low-bitrate WebM would smear it. Real Atari clips are a few KB (Pillow stores only the
    changed rectangle of each frame).
    """
    from PIL import Image

    frames = np.asarray(frames)
    if frames.ndim != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"frames must be uint8 (T, H, W) with T >= 1, got {frames.dtype} {frames.shape}")
    h, w = frames.shape[1:]
    scale = max(1, round(CLIP_VIEW_PX / max(h, w)))
    images = [Image.fromarray(f, "L").resize((w * scale, h * scale), Image.NEAREST) for f in frames]
    # GIF stores durations in centiseconds: round the cumulative time so the average rate is exactly `fps`.
    ends_cs = np.round(np.arange(1, len(frames) + 1) * 100.0 / fps).astype(int)
    durations = (np.diff(ends_cs, prepend=0) * 10).tolist()
    durations[-1] += CLIP_HOLD_LAST_MS
    gif = io.BytesIO()
    images[0].save(gif, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    poster = io.BytesIO()
    images[0].save(poster, format="PNG")
    return gif.getvalue(), poster.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _json_or_none(text):
    return None if text is None else json.loads(text)


class LabelStore:
    """SQLite store of one env's clips (shared by all experiments of that env) and of each experiment's queries,
    answers, sort tree and status. Thread-safe: one sqlite3 connection (check_same_thread=False) behind one lock,
    WAL mode, parameterised SQL, every write in one transaction. Several processes may open the same file (two
    experiments of one env): SQLite's file locks and a busy timeout serialise their writes.

    Files: root/"{env_slug}.sqlite" and root/"{env_slug}_clips/" holding, per clip, "<name>.npz" (frames, actions,
    true rewards, stack), "<name>.gif" (what people watch) and "<name>.png" (its first frame). Each clip's name is
    random, so a name is never reused (not even after delete_clips) and browsers may cache clips forever.
    Query ids and clip ids are never reused either (AUTOINCREMENT); answer sequence numbers only grow.
    """

    def __init__(self, root: str | Path, env_id: str):
        self.env_id = env_id
        slug = env_id.replace("/", "_")
        self.root = Path(root)
        self.path = self.root / f"{slug}.sqlite"
        self.clips_dir = self.root / f"{slug}_clips"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._create_schema()  # executescript commits by itself, so it runs outside _write
            with self._write():
                row = self._db.execute("SELECT value FROM meta WHERE key='env_id'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta(key, value) VALUES ('env_id', ?)", (env_id,))
                    self._db.execute("INSERT INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                    self._db.execute("INSERT INTO meta(key, value) VALUES ('answer_seq', '0')")
                elif row[0] != env_id:
                    raise ValueError(
                        f"label store {self.path} holds clips of env {row[0]!r}, not {env_id!r}: "
                        f"use another directory for {env_id!r}"
                    )
        except BaseException:
            self._db.close()
            raise
        self.clips_dir.mkdir(exist_ok=True)
        self._remove_stale_tmp()

    # ---- plumbing ----
    def _create_schema(self) -> None:
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS clips (
                id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, length INTEGER NOT NULL,
                stack INTEGER NOT NULL, true_return REAL NOT NULL, source TEXT NOT NULL, created REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS queries (
                id INTEGER PRIMARY KEY AUTOINCREMENT, experiment TEXT NOT NULL, kind TEXT NOT NULL,
                left_clip INTEGER NOT NULL REFERENCES clips(id), right_clip INTEGER NOT NULL REFERENCES clips(id),
                node INTEGER, status TEXT NOT NULL DEFAULT 'pending', created REAL NOT NULL,
                lease_client TEXT, lease_until REAL, answer TEXT, labeller TEXT, answered_at REAL, seq INTEGER);
            CREATE INDEX IF NOT EXISTS queries_open ON queries(experiment, status, kind, id);
            CREATE UNIQUE INDEX IF NOT EXISTS queries_seq ON queries(experiment, seq) WHERE seq IS NOT NULL;
            CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, status TEXT, tree TEXT);
            """
        )

    @contextmanager
    def _write(self):
        """One write transaction, taken up front (BEGIN IMMEDIATE) so concurrent writers queue, never deadlock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, params=()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _remove_stale_tmp(self) -> None:
        """A killed write leaves name.tmp; files older than a minute are no other process's write in flight."""
        cutoff = time.time() - 60.0
        for tmp in self.clips_dir.glob("*.tmp"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
            except FileNotFoundError:
                pass

    # ---- clips ----
    def add_clip(
        self, frames: np.ndarray, actions: np.ndarray, true_rewards: np.ndarray, stack: int, source: str
    ) -> int:
        """Save a clip's arrays and its rendered GIF, then record it; returns the clip id.

        frames: uint8 (T + stack - 1, H, W) single grey frames (step t sees frames[t:t+stack]); actions (T,);
        true_rewards (T,), the game's score change per step; stack >= 1 frames per observation.
        """
        frames = np.asarray(frames)
        actions = np.asarray(actions)
        true_rewards = np.asarray(true_rewards)
        stack = int(stack)
        if stack < 1:
            raise ValueError(f"stack must be >= 1 frames per observation, got {stack}")
        if frames.dtype != np.uint8 or frames.ndim != 3:
            raise ValueError(f"frames must be uint8 (T + stack - 1, H, W), got {frames.dtype} {frames.shape}")
        t = len(actions)
        if t < 1 or actions.shape != (t,) or true_rewards.shape != (t,) or len(frames) != t + stack - 1:
            raise ValueError(
                f"a clip of T steps needs actions (T,), true_rewards (T,) and T + stack - 1 frames; got actions "
                f"{actions.shape}, true_rewards {true_rewards.shape}, frames {frames.shape} with stack {stack}"
            )
        if not np.all(np.isfinite(true_rewards)):
            raise ValueError("true_rewards must be finite")
        name = f"clip_{secrets.token_hex(8)}"
        arrays = io.BytesIO()
        np.savez(
            arrays, frames=frames, actions=actions.astype(np.int64), true_rewards=true_rewards.astype(np.float32),
            stack=np.int64(stack),
        )  # fmt: skip
        gif, poster = render_clip_gif(frames[stack - 1 :])
        _write_atomic(self.clips_dir / f"{name}.npz", arrays.getvalue())
        _write_atomic(self.clips_dir / f"{name}.png", poster)
        _write_atomic(self.clips_dir / f"{name}.gif", gif)
        true_return = float(true_rewards.astype(np.float64).sum())
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO clips(name, length, stack, true_return, source, created) VALUES (?, ?, ?, ?, ?, ?)",
                (name, t, stack, true_return, str(source), time.time()),
            )
            return int(cur.lastrowid)

    def _clip_name(self, clip_id: int) -> str:
        rows = self._read("SELECT name FROM clips WHERE id=?", (int(clip_id),))
        if not rows:
            raise KeyError(f"no clip {clip_id} in {self.path}")
        return rows[0][0]

    def clip_arrays(self, clip_id: int) -> dict:
        """{"frames", "actions", "true_rewards", "stack"} of a clip (KeyError if there is no such clip)."""
        with np.load(self.clips_dir / f"{self._clip_name(clip_id)}.npz") as z:
            return {
                "frames": z["frames"], "actions": z["actions"], "true_rewards": z["true_rewards"],
                "stack": int(z["stack"]),
            }  # fmt: skip

    def clip_info(self, clip_id: int) -> dict:
        """{"id", "length", "true_return", "source", "media"}; media is the GIF's file name in clips_dir."""
        rows = self._read("SELECT id, length, true_return, source, name FROM clips WHERE id=?", (int(clip_id),))
        if not rows:
            raise KeyError(f"no clip {clip_id} in {self.path}")
        i, length, ret, source, name = rows[0]
        return {"id": i, "length": length, "true_return": ret, "source": source, "media": f"{name}.gif"}

    def clip_ids(self) -> list[int]:
        return [r[0] for r in self._read("SELECT id FROM clips ORDER BY id")]

    def clip_media(self, clip_ids) -> dict[int, dict]:
        """{clip id: {"media": GIF file name, "poster": PNG file name, "length"}} for the ids that exist."""
        ids = sorted({int(i) for i in clip_ids})
        out = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for i, name, length in self._read(f"SELECT id, name, length FROM clips WHERE id IN ({marks})", chunk):
                out[i] = {"media": f"{name}.gif", "poster": f"{name}.png", "length": length}
        return out

    # ---- queries and answers ----
    def add_query(self, experiment: str, kind: str, left: int, right: int, node: int | None = None) -> int:
        """A pending query: kind "pair" (is left or right better?) or "tree" (left = the clip being inserted into
        the sort tree, right = a clip bound to tree node `node`). Returns its id."""
        if kind not in QUERY_KINDS:
            raise ValueError(f"query kind must be one of {QUERY_KINDS}, got {kind!r}")
        if kind == "tree" and node is None:
            raise ValueError("a tree query needs the tree node it compares against")
        with self._write() as db:
            found = db.execute("SELECT COUNT(*) FROM clips WHERE id IN (?, ?)", (int(left), int(right))).fetchone()[0]
            if found != len({int(left), int(right)}):
                raise KeyError(f"query on clips {left}, {right}: not both are in {self.path}")
            cur = db.execute(
                "INSERT INTO queries(experiment, kind, left_clip, right_clip, node, created) VALUES (?, ?, ?, ?, ?, ?)",
                (experiment, kind, int(left), int(right), None if node is None else int(node), time.time()),
            )
            return int(cur.lastrowid)

    def pending_queries(self, experiment: str, kind: str | None = None) -> list[dict]:
        """Pending queries, oldest first: {"id", "kind", "left", "right", "node", "created"}."""
        sql = (
            "SELECT id, kind, left_clip, right_clip, node, created FROM queries WHERE experiment=? AND status='pending'"
        )
        params: tuple = (experiment,)
        if kind is not None:
            sql += " AND kind=?"
            params += (kind,)
        rows = self._read(sql + " ORDER BY id", params)
        keys = ("id", "kind", "left", "right", "node", "created")
        return [dict(zip(keys, r)) for r in rows]

    def next_queries(self, experiment: str, kind: str, client: str, count: int = 1, lease_s: float = 30.0) -> list:
        """The `count` oldest pending queries of `kind` not leased to another client within lease_s, leased to
        `client` (the web app shows one and preloads the next)."""
        now = time.time()
        with self._write() as db:
            rows = db.execute(
                "SELECT id, kind, left_clip, right_clip, node, created FROM queries "
                "WHERE experiment=? AND status='pending' AND kind=? "
                "AND (lease_client IS NULL OR lease_client=? OR lease_until < ?) ORDER BY id LIMIT ?",
                (experiment, kind, client, now, int(count)),
            ).fetchall()
            db.executemany(
                "UPDATE queries SET lease_client=?, lease_until=? WHERE id=?",
                [(client, now + lease_s, r[0]) for r in rows],
            )
        keys = ("id", "kind", "left", "right", "node", "created")
        return [dict(zip(keys, r)) for r in rows]

    def next_query(self, experiment: str, kind: str, client: str, lease_s: float = 30.0) -> dict | None:
        """The oldest pending query of `kind` not leased to another client within lease_s, now leased to `client`
        (two people labelling at once see different queries); None if there is none."""
        found = self.next_queries(experiment, kind, client, 1, lease_s)
        return found[0] if found else None

    def renew_leases(self, experiment: str, query_ids, client: str, lease_s: float = 30.0) -> list[int]:
        """Extend `client`'s leases on these pending queries (taking any whose lease lapsed); returns the ids held."""
        now = time.time()
        held = []
        with self._write() as db:
            for qid in query_ids:
                cur = db.execute(
                    "UPDATE queries SET lease_client=?, lease_until=? WHERE id=? AND experiment=? AND status='pending' "
                    "AND (lease_client IS NULL OR lease_client=? OR lease_until < ?)",
                    (client, now + lease_s, int(qid), experiment, client, now),
                )
                if cur.rowcount:
                    held.append(int(qid))
        return held

    def _raise_not_pending(self, db, experiment: str, query_id: int) -> None:
        row = db.execute("SELECT status FROM queries WHERE id=? AND experiment=?", (query_id, experiment)).fetchone()
        if row is None:
            raise UnknownQuery(f"no query {query_id} in experiment {experiment!r}")
        raise StaleQuery(f"query {query_id} of experiment {experiment!r} is {row[0]}, no longer pending")

    def answer(self, experiment: str, query_id: int, answer: str, labeller: str) -> None:
        """Record the answer ("left", "right", "equal", "cant_tell") to a pending query, with the next answer
        sequence number. Unknown id -> UnknownQuery; not pending -> StaleQuery; bad answer -> ValueError."""
        if answer not in ANSWERS:
            raise ValueError(f"answer must be one of {ANSWERS}, got {answer!r}")
        query_id = int(query_id)
        with self._write() as db:
            seq = int(db.execute("SELECT value FROM meta WHERE key='answer_seq'").fetchone()[0]) + 1
            cur = db.execute(
                "UPDATE queries SET status='answered', answer=?, labeller=?, answered_at=?, seq=?, lease_client=NULL, "
                "lease_until=NULL WHERE id=? AND experiment=? AND status='pending'",
                (answer, str(labeller), time.time(), seq, query_id, experiment),
            )
            if cur.rowcount != 1:
                self._raise_not_pending(db, experiment, query_id)
            db.execute("UPDATE meta SET value=? WHERE key='answer_seq'", (str(seq),))

    def answers_after(self, experiment: str, seq: int) -> list[dict]:
        """Answered queries with answer sequence number > seq, in answer order: {"seq", "id", "kind", "left",
        "right", "node", "answer", "labeller", "answered_at"}."""
        rows = self._read(
            "SELECT seq, id, kind, left_clip, right_clip, node, answer, labeller, answered_at FROM queries "
            "WHERE experiment=? AND seq > ? ORDER BY seq",
            (experiment, int(seq)),
        )
        keys = ("seq", "id", "kind", "left", "right", "node", "answer", "labeller", "answered_at")
        return [dict(zip(keys, r)) for r in rows]

    def cancel_query(self, experiment: str, query_id: int) -> None:
        """Pending -> "cancelled" (an answer to it is then stale). Unknown id -> UnknownQuery; already answered or
        cancelled -> StaleQuery (an answer that raced the cancel is kept and shows up in answers_after)."""
        query_id = int(query_id)
        with self._write() as db:
            cur = db.execute(
                "UPDATE queries SET status='cancelled', lease_client=NULL, lease_until=NULL "
                "WHERE id=? AND experiment=? AND status='pending'",
                (query_id, experiment),
            )
            if cur.rowcount != 1:
                self._raise_not_pending(db, experiment, query_id)

    def count_answers(self, experiment: str, kind: str | None = None) -> int:
        sql = "SELECT COUNT(*) FROM queries WHERE experiment=? AND status='answered'"
        params: tuple = (experiment,)
        if kind is not None:
            sql += " AND kind=?"
            params += (kind,)
        return int(self._read(sql, params)[0][0])

    def count_pending(self, experiment: str) -> dict[str, int]:
        """{"pair": n, "tree": m}: pending queries of each kind."""
        rows = self._read(
            "SELECT kind, COUNT(*) FROM queries WHERE experiment=? AND status='pending' GROUP BY kind", (experiment,)
        )
        return {kind: 0 for kind in QUERY_KINDS} | {k: int(n) for k, n in rows}

    # ---- per-experiment tree and status ----
    def save_tree(self, experiment: str, tree: dict) -> None:
        text = json.dumps(tree)
        with self._write() as db:
            db.execute(
                "INSERT INTO experiments(name, tree) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET tree=excluded.tree",
                (experiment, text),
            )

    def load_tree(self, experiment: str) -> dict | None:
        rows = self._read("SELECT tree FROM experiments WHERE name=?", (experiment,))
        return _json_or_none(rows[0][0]) if rows else None

    def set_status(self, experiment: str, status: dict) -> None:
        text = json.dumps(status)
        with self._write() as db:
            db.execute(
                "INSERT INTO experiments(name, status) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET status=excluded.status",
                (experiment, text),
            )

    def get_status(self, experiment: str) -> dict:
        rows = self._read("SELECT status FROM experiments WHERE name=?", (experiment,))
        return (_json_or_none(rows[0][0]) if rows else None) or {}

    def experiments(self) -> list[str]:
        rows = self._read("SELECT name FROM experiments UNION SELECT DISTINCT experiment FROM queries ORDER BY 1")
        return [r[0] for r in rows]

    # ---- deletion ----
    def delete_labels(self, experiment: str) -> dict:
        """Delete the experiment's queries (pending, answered, cancelled) and its sort tree; keeps its status line.
        Returns {"queries", "answers", "trees"} deleted."""
        with self._write() as db:
            answers = db.execute(
                "SELECT COUNT(*) FROM queries WHERE experiment=? AND status='answered'", (experiment,)
            ).fetchone()[0]
            queries = db.execute("DELETE FROM queries WHERE experiment=?", (experiment,)).rowcount
            trees = db.execute(
                "UPDATE experiments SET tree=NULL WHERE name=? AND tree IS NOT NULL", (experiment,)
            ).rowcount
        return {"queries": int(queries), "answers": int(answers), "trees": int(trees)}

    def delete_clips(self) -> dict:
        """Delete every clip of the env (rows and files) and every experiment's queries and sort tree.
        Returns {"clips", "queries", "answers", "trees"} deleted."""
        with self._write() as db:
            answers = db.execute("SELECT COUNT(*) FROM queries WHERE status='answered'").fetchone()[0]
            queries = db.execute("DELETE FROM queries").rowcount
            trees = db.execute("UPDATE experiments SET tree=NULL WHERE tree IS NOT NULL").rowcount
            clips = db.execute("DELETE FROM clips").rowcount
        for f in self.clips_dir.iterdir():
            if f.is_file() and f.name.startswith("clip_"):
                f.unlink(missing_ok=True)
        return {"clips": int(clips), "queries": int(queries), "answers": int(answers), "trees": int(trees)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
