"""The profile's `engine` label names the commit(s) its runs were recorded at."""

from sim.calibrate import _engine_label


def test_one_commit_is_cut_to_twelve_characters():
    assert _engine_label("8950eff1a58f974cbf4d01b94581009bbdf59e66") == "costline-engine@8950eff1a58f"


def test_pooled_commits_are_each_named_not_a_list_repr():
    label = _engine_label(["79e0853aaaa", "8126040bbbb-dirty", "8950eff1a58f974c", "dbe04df+supplement"])
    assert label == "costline-engine@79e0853,8126040-dirty,8950eff,dbe04df+supplement"


def test_no_commit_says_unknown():
    assert _engine_label(None) == "costline-engine@unknown"
    assert _engine_label([]) == "costline-engine@unknown"
