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
    keys = {name: {tuple(t) for t in items} for name, items in s.items()}
    assert {k: len(v) for k, v in keys.items()} == {"sft": 300, "train": 200, "eval": 100}
    assert not (keys["sft"] & keys["train"]) and not (keys["sft"] & keys["eval"]) and not (keys["train"] & keys["eval"])


def test_records_use_the_verl_format():
    rec = task.record([1, 2], "train", 7)
    assert rec["prompt"] == [{"role": "user", "content": "Add 1+2"}]
    assert rec["reward_model"]["ground_truth"] == "3" and rec["data_source"] == task.DATA_SOURCE
