"""The bad-input tests that rnd_ppo_atari.py and trex_ppo_atari.py share, written once: only the game and its
misspellings differ. Each of tests/test_rnd_ppo_atari.py and tests/test_trex_ppo_atari.py imports them and defines
the fixture they use, `atari`: (the script's module, its game's env id, {bad env id: the fix its one-line error must
name}), so pytest runs each test once per script."""

from __future__ import annotations

import pytest
from conftest import (
    assert_bad_policy_file_refused_by_eval_only,
    assert_exp_names_and_long_paths_refused,
    one_line_exit_2,
)

__all__ = [  # what each test file imports and pytest then runs there
    "test_env_ids_of_other_families_retired_versions_and_near_misses",
    "test_exp_names_that_are_not_a_folder_name_and_paths_too_long_are_refused",
    "test_eval_only_of_a_bad_policy_file_is_one_line_and_writes_nothing",
]


def test_env_ids_of_other_families_retired_versions_and_near_misses(atari, tmp_path):
    script, _, env_id_cases = atari
    for env_id, fix in env_id_cases.items():
        line = one_line_exit_2(lambda: script.main(script.parse_args(["--env-id", env_id, "--run-dir", str(tmp_path)])))
        assert fix in line, (env_id, line)


def test_exp_names_that_are_not_a_folder_name_and_paths_too_long_are_refused(atari, tmp_path, monkeypatch):
    """--exp-name '../..' made folders elsewhere, a 300-byte name a traceback (the cases: conftest's helper)."""
    script, game, _ = atari
    monkeypatch.chdir(tmp_path)
    assert_exp_names_and_long_paths_refused(lambda argv: script.main(script.parse_args(argv)), tmp_path, game)


@pytest.mark.filterwarnings("error")  # a warning printed before the error line fails the test
@pytest.mark.parametrize("how", ["tensor", "foreign dict", "empty", "random bytes", "no args.json"])
def test_eval_only_of_a_bad_policy_file_is_one_line_and_writes_nothing(atari, tmp_path, how):
    """Issue 48 battery, finding 5's class: --eval-only on a run dir of this script whose policy.pt is not a policy
    (a bare tensor, another dict, empty, random bytes), or on a folder without args.json: exit 2, one line naming
    the file or the flag, no warning before it, nothing written."""
    script, game, _ = atari
    run = lambda argv: script.main(script.parse_args(argv))  # noqa: E731
    assert_bad_policy_file_refused_by_eval_only(run, tmp_path / "run", how, f"{script.__name__}.py", game)
