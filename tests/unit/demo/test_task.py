import doctest

from magic.demo import task


def test_doctests():
    assert doctest.testmod(task).failed == 0


def test_solution_adds_left_to_right_and_boxes_the_sum():
    text = task.solution_text([3, 5, 2, 7])
    assert text.splitlines() == ["8+2+7", "10+7", "17", "\\boxed{17}"]


def test_reasoning_length_grows_with_the_number_of_terms():
    lengths = {n: len(task.solution_text([5] * n)) for n in range(task.MIN_TERMS, task.MAX_TERMS + 1)}
    assert all(lengths[n] < lengths[n + 1] for n in range(task.MIN_TERMS, task.MAX_TERMS))


def test_splits_are_disjoint_and_sized():
    s = task.make_splits(seed=1, n_sft=300, n_train=200, n_eval=100)
    assert {name: len(items) for name, items in s.items()} == {"sft": 300, "train": 200, "eval": 100}
    keys = {name: {tuple(t) for t in items} for name, items in s.items()}
    assert len(keys["train"]) == 200 and len(keys["eval"]) == 100  # distinct problems
    assert not (keys["sft"] & keys["train"]) and not (keys["sft"] & keys["eval"]) and not (keys["train"] & keys["eval"])
    assert all(task.split_of(list(k)) == name for name, ks in keys.items() for k in ks)


def test_the_warm_start_sees_every_length_evenly():
    """The held-out set is drawn first but owns only its share of the 25 two-term problems, so
    the warm start still practises them (it used to see none of them)."""
    s = task.make_splits(seed=1, n_sft=7000, n_train=4000, n_eval=500)
    counts = {n: sum(len(t) == n for t in s["sft"]) for n in range(task.MIN_TERMS, task.MAX_TERMS + 1)}
    assert all(abs(c - 1000) < 150 for c in counts.values()), counts
    two = [t for t in s["sft"] if len(t) == 2]
    assert 10 <= len({tuple(t) for t in two}) <= 25 and not any(task.split_of(t) != "sft" for t in two)
    assert sum(len(t) == 2 for t in s["eval"]) >= 1


def test_asking_for_more_distinct_problems_than_a_split_holds_is_refused(monkeypatch):
    import pytest

    monkeypatch.setattr(task, "MAX_TERMS", 3)  # 25 + 125 problems, 15 of them held out
    with pytest.raises(ValueError, match="eval split holds too few distinct problems"):
        task.make_splits(seed=1, n_sft=0, n_train=0, n_eval=100)


def test_splits_are_reproducible():
    assert task.make_splits(seed=3, n_sft=50, n_train=40, n_eval=30) == task.make_splits(seed=3, n_sft=50, n_train=40, n_eval=30)


def test_records_use_the_verl_format():
    rec = task.record([1, 2], "train", 7)
    assert rec["prompt"] == [{"role": "user", "content": "Add 1+2"}]
    assert rec["reward_model"]["ground_truth"] == "3" and rec["data_source"] == task.DATA_SOURCE
