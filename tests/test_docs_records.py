"""Every result number on README's scripts table and on the docs pages' Results sections has a committed record.

What is checked, page by page:

- README.md: the Speed and Headline cells of the scripts table (one row per script).
- docs/<script>.md: from `## Results` to the next `## ` heading, every table row that reports ours (a row whose
  first cell starts with "paper" is the paper's and is left out) and every **bold** span.

From that text the numbers that are not results are removed first (NOT_RESULTS below: flags in backticks, the
paper's columns, seed counts, budgets and frame counts that are settings, windows of steps, ...). Every number
left must then be found in the page's records (RECORDS_OF: the text of files under benchmarks/results/, .md,
.json and .jsonl read as text; the curve CSVs are not read), allowing the fair differences of formatting:
thousands separators, a leading "+", the Unicode minus "−", trailing zeros, a "k"/"M" suffix, a record's value
rounded to the precision the page shows, and a percentage written as a fraction or back (83 % = 0.83).

A number that the page computes from records (a mean ± std over seeds, a ratio of two throughput records) is
listed in DERIVED with the records it comes from; the test recomputes it from them and checks that the page shows
it rounded to the digits it prints.
"""

import bisect
import json
import math
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# The pages checked, each with the records its numbers may come from (globs under benchmarks/results/).
RECORDS_OF = {
    "README": ["**/*.md", "**/*.json", "*.jsonl"],
    "trex_ppo_atari": ["trex_ppo_atari.md", "trex_paper_breakout_s1/*.json", "trex_paper_breakout_s1/*.md"],
    "rnd_ppo_atari": [
        "rnd_ppo_atari.md",
        "rnd_montezuma_table.md",  # the 10M-frame runs' table, written by montezuma-plot from their curves
        "rnd_montezuma_*/results.json",
        "rnd_montezuma_coverage.jsonl",  # cells reached by the finished policies (benchmarks/rnd_coverage.py)
    ],
    "filter_irl_mujoco": ["filter_irl_mujoco.md", "hype_irl_mujoco.md", "hopper_paper/*.md", "hopper_paper/*/*.json"],
    "hype_irl_mujoco": ["hype_irl_mujoco.md", "filter_irl_mujoco.md", "hopper_paper/*.md", "hopper_paper/*/*.json"],
    "preference_ga3c_atari": ["preference_ga3c_atari.md", "preference_ga3c_atari_windows.md"],
    "mbirl_antmaze": ["mbirl_antmaze_runs/*.json"],
    "simple_worldmodel_atari": [
        "simple_quick_pong_s1/*.json",
        "simple_quick_pong_s1/*.log",
        "simple_cpu_pong_s1/*.md",  # table.md: the CPU run's table, written from its learning_curve.csv
        "simple_cpu_pong_s1/*.json",  # the random baseline's evaluation
        "simple_cpu_pong_s1/*.jsonl",  # the reward probes (pong-cpu-probe, -open-loop, -refit)
        "simple_worldmodel_atari.md",  # the paper's table, with its source
    ],
}
SKIPPED: set[str] = set()  # pages left out by name (none now)

# Text removed before the numbers are read: what these match is a setting, a label or the paper's, not a result.
NOT_RESULTS = [
    r"`[^`]*`",  # code: flags, commands, file names (`--rnd.int-coef 0`, `hype_irl_mujoco.py`)
    r"\]\([^)]*\)",  # link targets
    r"\b[A-Za-z][\w-]*-v\d\b|\bH[12]00\b",  # env ids and GPU names (Hopper-v5, H200)
    r"[\d.,]+ ?% (of the paper's|budget)|\(\d+ ?%\)|\([\d.]+\)",  # budget fractions: "10 % budget", "(2 %)", "(0.13)"
    r"\bpaper\b[^;|\n]*",  # the paper's number: "paper 221.3", "paper ≈ RL" (up to the next ';' or cell)
    r"\(?\d+ seeds?( each)?\)?|\bseeds? \d+(–\d+)?",  # seed counts: "(3 seeds)", "1 seed each", "seed 1"
    r"[\d.,]+[kM]? (learner |BC |agent )?(steps|updates|frames)\b",  # budgets: "300k BC updates", "5.0M frames"
    r"\bat [\d.]+–[\d.]+M\b",  # windows of agent steps: "9.8 at 3.5–4M"
    r"\bstep 0\b|ρ [\d.]+ → [\d.]+",  # HyPER's step 0, HyPE's ρ schedule
    r"\b\d+ evaluation (games|episodes)\b",  # the evaluation's size: "(3 evaluation games; ...)"
    r"[\d.]+ label samples trained per agent step",  # a flag's value (preference's label-training rate)
]

# ---------------------------------------------------------------------------------------------------- derived
# Numbers a page computes from records, each recomputed here from the records it names.


def record(path: str) -> dict:
    return json.loads((RESULTS / path).read_text())


def throughput(label: str) -> list[dict]:
    """The throughput.jsonl lines with this label that carry the one published metric, train_sps_slope."""
    lines = [json.loads(x) for x in (RESULTS / "throughput.jsonl").read_text().splitlines() if x.strip()]
    return [d for d in lines if d["label"] == label and d.get("train_sps_slope") is not None]


def slope(label: str) -> float:
    return statistics.mean(d["train_sps_slope"] for d in throughput(label))


def to_raw_env(label: str) -> list[float]:
    """[train_sps_slope, its ratio to the raw env SPS of the same harness run] of the latest `label` line."""
    line = throughput(label)[-1]
    return [line["train_sps_slope"], line["train_sps_slope"] / line["raw_env_sps"]]


def median_to_raw_env(label: str) -> list[float]:
    """[median of the tag, its ratio to the raw env] of the latest `label` line: the rates that are not agent steps
    (SimPLe's sim/SPS, HyPER's model rollouts) are published as the median, as benchmarks/README.md says."""
    line = throughput(label)[-1]
    return [line["train_sps"], line["train_sps"] / line["raw_env_sps"]]


def slope_ratio(ours: str, baseline: str) -> float:
    """Mean train_sps_slope of `ours` over that of `baseline`, measured in the same window on the same machine."""
    return slope(ours) / slope(baseline)


def seed_records(stem: str) -> list[dict]:
    """The three seeds' results.json of an mbirl_antmaze_runs run: {stem}.json, {stem}_s2.json, {stem}_s3.json."""
    return [record(f"mbirl_antmaze_runs/{stem}{s}.json") for s in ("", "_s2", "_s3")]


def at_step(run: dict, learner_step: int) -> dict:
    """The evaluation of a run's history at one learner step."""
    return next(h for h in run["history"] if h["step"] == learner_step)


def cells_per_game(run: str) -> list[float]:
    """Mean ± sample std of the cells a policy reached per game, from its line of rnd_montezuma_coverage.jsonl."""
    lines = (RESULTS / "rnd_montezuma_coverage.jsonl").read_text().splitlines()
    cells = next(d for d in map(json.loads, lines) if d["run"] == run)["cells_per_game"]
    return [statistics.mean(cells), statistics.stdev(cells)]


def mean_pstd(values: list[float]) -> list[float]:
    """Mean ± population std over seeds, the convention the pages state."""
    return [statistics.mean(values), statistics.pstdev(values)]


def printed(path: str, anchor: str, number: str) -> list[float]:
    """The numbers matching `number` on the first line of a history file that contains `anchor`."""
    line = next(x for x in (RESULTS / path).read_text().splitlines() if anchor in x)
    return [float(x) for x in re.findall(number, line)]


HYPER, HYPE = seed_records("antmaze_large_c840k_hyper"), seed_records("antmaze_large_c840k_hype")
TREX_SEED_MEANS = ("trex_ppo_atari.md", "| evaluation, 30 games per seed", r"([\d.]+) ±")  # 11.03 ± 4.26 / ...
SUCCESS, REAL_STEPS = "success_rate", "total_env_steps"

# (page, the text as shown): recompute() -> the values it shows, in order.
DERIVED = {
    # README's Speed column: ratios of train_sps_slope, the one metric of benchmarks/README.md
    ("README", "1.4× CleanRL"): lambda: [slope_ratio("trex-policy-ab-new", "cleanrl-ppo_atari-ab")],
    ("README", "0.07× raw env"): lambda: [slope("rnd-after") / throughput("rnd-after")[0]["raw_env_sps"]],
    ("README", "3.2–4.0× T-REX's PPO"): lambda: sorted(  # GA3C over T-REX's PPO, two back-to-back pairs
        slope_ratio(f"pair{i}-ga3c-rl", f"pair{i}-trex-policy") for i in (1, 2)
    ),
    ("README", "1.46× CleanRL SAC"): lambda: [slope_ratio("filter-irl-ab", "cleanrl-sac-ab")],
    ("README", "1.50× CleanRL SAC"): lambda: [slope_ratio("hype-irl-ab", "cleanrl-sac-ab")],
    # README's GPU figures (one H200): the slope, and its ratio to the raw env of the same harness run
    ("README", "H200 9,230–11,484 SPS"): lambda: sorted(r["train_sps_slope"] for r in throughput("ga3c-rl-gpu-w128")),
    ("README", "H200 1,777 SPS, 0.32× raw env"): lambda: to_raw_env("trex-policy-gpu"),
    ("README", "H200 at 128 envs 9,427 SPS, 0.62× raw env"): lambda: [128, *to_raw_env("rnd-128envs-gpu")],
    ("README", "H200 121 SPS, 0.031× raw env"): lambda: to_raw_env("filter-irl-gpu"),
    ("README", "H200 118 SPS, 0.027× raw env"): lambda: to_raw_env("hype-irl-gpu"),
    ("README", "H200 1,775×"): lambda: median_to_raw_env("mbirl-antmaze-rollout-gpu")[1:],
    ("README", "H200 at paper sizes 1,238 SPS, 0.080×"): lambda: median_to_raw_env("simple-paper-gpu"),
    # means (and population stds) over seeds
    ("README", "0.12 ± 0.09"): lambda: mean_pstd([r[SUCCESS] for r in HYPER]),  # HyPER, Large-Diverse, final
    ("trex_ppo_atari", "mean 11.04"): lambda: [statistics.mean(printed(*TREX_SEED_MEANS))],
    ("mbirl_antmaze", "0.23 ± 0.10"): lambda: mean_pstd([at_step(r, 0)[SUCCESS] for r in HYPER]),  # BC alone
    ("mbirl_antmaze", "0.12 ± 0.09"): lambda: mean_pstd([r[SUCCESS] for r in HYPER]),
    ("mbirl_antmaze", "~169k"): lambda: [statistics.mean(r[REAL_STEPS] for r in HYPER)],
    ("mbirl_antmaze", "0.19 ± 0.05"): lambda: mean_pstd([at_step(r, 18000)[SUCCESS] for r in HYPER]),
    ("mbirl_antmaze", "~151k real steps"): lambda: [statistics.mean(at_step(r, 18000)[REAL_STEPS] for r in HYPER)],
    ("mbirl_antmaze", "0.00 ± 0.00"): lambda: mean_pstd([r[SUCCESS] for r in HYPE]),
    ("mbirl_antmaze", "160k"): lambda: [statistics.mean(r[REAL_STEPS] for r in HYPE)],
    ("mbirl_antmaze", "0.05 ± 0.02"): lambda: mean_pstd([max(h[SUCCESS] for h in r["history"]) for r in HYPE]),  # best
    # cells of Montezuma's first room reached per game by a policy (mean ± sample std over its 30 games)
    ("rnd_ppo_atari", "86.3 ± 10.0"): lambda: cells_per_game("runs/rnd_montezuma_rnd_s1"),
    ("rnd_ppo_atari", "74.0 ± 12.4"): lambda: cells_per_game("runs/rnd_montezuma_ppo_s1"),
    ("rnd_ppo_atari", "76.9 ± 12.9"): lambda: cells_per_game("runs/rnd_montezuma_rnd_s2"),
    ("rnd_ppo_atari", "78.3 ± 15.9"): lambda: cells_per_game("runs/rnd_montezuma_ppo_s2"),
    ("rnd_ppo_atari", "71.8 ± 14.4"): lambda: cells_per_game("random"),
}


# ---------------------------------------------------------------------------------------------------- numbers

# A number as a page or a record writes it: sign, digits with optional thousands separators, decimals, suffix.
NUMBER = re.compile(r"(?<![\w.\-])([−+-]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?: ?(%|×)|([kMB])\b)?")
SCALE = {"k": 1e3, "M": 1e6, "B": 1e9}


def parse(m: re.Match) -> tuple[float, float, bool]:
    """(value, half a unit of the last digit shown, written as a percentage)."""
    sign, whole, frac, unit, scale = m.groups()
    value = float(whole.replace(",", "") + (frac or "")) * SCALE.get(scale, 1.0)
    half = 0.5 * 10.0 ** -(len(frac) - 1 if frac else 0) * SCALE.get(scale, 1.0)
    return (-value if sign in ("−", "-") else value), half, unit == "%"


def values_of(matches: list[re.Match]) -> list[float]:
    """The numbers, sorted; a percentage also counts as a fraction (83 % -> 0.83)."""
    values = []
    for value, _, percent in map(parse, matches):
        values += [value, value / 100] if percent else [value]
    return sorted(values)


def json_objects(path: Path) -> list[list]:
    """The numbers directly inside each object of a JSON record (and each list of numbers), one list per object."""
    found_, todo = [], [json.loads(path.read_text())]
    while todo:
        node = todo.pop()
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
        found_.append([c for c in children if isinstance(c, (int, float)) and not isinstance(c, bool)])
        todo += [c for c in children if isinstance(c, (dict, list))]
    return [f for f in found_ if f]


def record_numbers(page: str) -> tuple[list[float], list[list[float]]]:
    """Every number of the page's records, and the groups a "mean ± std" may come from: each "a ± b" written in
    a .md record, each object of a .json record and each line of a .jsonl record (its mean and std are two
    fields)."""
    everything, groups = [], []
    for pattern in RECORDS_OF[page]:
        for path in sorted(RESULTS.glob(pattern)):
            numbers = list(NUMBER.finditer(path.read_text()))
            everything += numbers
            if path.suffix == ".json":  # each object's own numbers: a long history holds every pair by chance
                groups += [values_of(list(NUMBER.finditer(json.dumps(obj)))) for obj in json_objects(path)]
            elif path.suffix == ".jsonl":  # each line is one record, as a .json file is
                groups += [values_of(list(NUMBER.finditer(line))) for line in path.read_text().splitlines()]
            else:
                text = path.read_text()
                groups += [
                    values_of([m, n]) for m, n in zip(numbers, numbers[1:]) if text[m.end() : n.start()] == " ± "
                ]
    return values_of(everything), groups


def found(shown: re.Match, values: list[float]) -> bool:
    """Some value (sorted) rounds to the shown number at the shown precision (as is, or as % <-> fraction)."""
    value, half, percent = parse(shown)
    candidates = [(value, half), (value / 100, half / 100)] if percent else [(value, half), (value * 100, half * 100)]
    for v, h in candidates:
        i = bisect.bisect_left(values, v - h * (1 + 1e-9))
        if i < len(values) and values[i] <= v + h * (1 + 1e-9):
            return True
    return False


# ---------------------------------------------------------------------------------------------------- pages


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def readme_text() -> str:
    """The Speed and Headline cells of README's scripts table, one line per script (SKIPPED left out)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    header = cells(next(x for x in lines if x.startswith("| Script |")))
    keep = [i for i, h in enumerate(header) if h.startswith(("Speed", "Headline"))]
    rows = [r for r in lines if r.startswith("| [`") and not any(f"`{s}.py`" in r for s in SKIPPED)]
    return "\n".join(" | ".join(cells(r)[i] for i in keep) for r in rows)


# Columns that hold the paper's numbers or the settings, by their header, left out of a docs table.
SETTINGS_COLUMNS = re.compile(r"^(paper|what differs|policy budget|demonstrator|frames|envs|seeds|learner env steps)")


def results_text(page: str) -> str:
    """Of the page's Results section: the cells of our rows (settings columns left out) and the bold spans."""
    text = (ROOT / "docs" / f"{page}.md").read_text()
    section = re.search(r"^## Results\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL).group(1)
    kept, header = [], []
    for line in section.splitlines():
        if not line.startswith("|"):  # prose: its bold spans; a table ends here
            kept += re.findall(r"\*\*(.+?)\*\*", line)
            header = []
        elif not header:
            header = cells(line)
        elif not re.fullmatch(r"[-:| ]+", line.strip()) and not cells(line)[0].startswith("paper"):
            kept.append(" | ".join(c for h, c in zip(header, cells(line)) if not SETTINGS_COLUMNS.match(h)))
    return "\n".join(kept)


PAGES = [p for p in RECORDS_OF if p not in SKIPPED]


def page_text(page: str) -> str:
    return readme_text() if page == "README" else results_text(page)


def unrecorded(page: str, text: str | None = None) -> list[str]:
    """The result numbers of the page (or of `text`, read as that page) that no record of RECORDS_OF[page] holds."""
    text = page_text(page) if text is None else text
    for p, shown in DERIVED:
        if p == page:
            assert shown in text, f"DERIVED {shown!r} is no longer on {page}: update DERIVED"
            text = text.replace(shown, " ")
    for pattern in NOT_RESULTS:
        text = re.sub(pattern, " ", text)
    anywhere, groups = record_numbers(page)
    missing = []
    for line in text.splitlines():
        numbers = list(NUMBER.finditer(line))
        for m, after in zip(numbers, numbers[1:] + [None]):
            if after and line[m.end() : after.start()] == " ± ":  # a mean ± std: both from one record
                if not any(found(m, group) and found(after, group) for group in groups):
                    missing.append(f"{line[m.start() : after.end()]!r} in: {line.strip()[:140]}")
            elif not found(m, anywhere):
                missing.append(f"{m.group(0)!r} in: {line.strip()[:140]}")
    return missing


@pytest.mark.parametrize("page", PAGES)
def test_every_result_number_has_a_committed_record(page):
    missing = unrecorded(page)
    assert missing == [], f"{page}: numbers with no committed record:\n" + "\n".join(missing)


@pytest.mark.parametrize("page, shown", DERIVED, ids=[f"{page}: {shown}" for page, shown in DERIVED])
def test_derived_numbers_recompute_from_their_records(page, shown):
    numbers = [parse(m) for m in NUMBER.finditer(shown)]
    values = DERIVED[page, shown]()
    assert len(numbers) == len(values), (shown, values)
    for (number, half, _), value in zip(numbers, values):
        assert math.isclose(value, number, abs_tol=half * (1 + 1e-9)), (
            f"{page} shows {shown}, the records give {values}"
        )


def test_the_check_tells_recorded_numbers_from_unrecorded_ones():
    """Written as the records have them or fairly reformatted (605 ± 80, 818.0, 74 % for 0.74, +605, 0.7 for 0.74),
    settings and the paper's left out: found. Made up, a minus added, more digits than recorded, or a mean with
    another row's std: flagged."""
    found_ = "| **605 ± 80** | 818.0 | 74 % | 1,588 | +605 | 0.7 | seed 1 | paper 9,876.5 |\n"
    flagged = "| 9,876.5 | −605 | 0.7412 | 605 ± 73 |"
    assert unrecorded("filter_irl_mujoco", found_ + flagged) == [
        f"{n!r} in: {flagged}" for n in ("9,876.5", "−605", "0.7412", "605 ± 73")
    ]
