import json

import pytest

from magic.controller.datasets import DatasetError, PromptSource, load_jsonl
from magic.store.datasets import DatasetIndex


def write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_verl_records_are_read(tmp_path):
    p = write(tmp_path, [
        {"prompt": [{"role": "user", "content": "1+1"}], "data_source": "math", "reward_model": {"ground_truth": "2"}, "extra_info": {"i": 0}},
        {"prompt": "plain string prompt", "reward_model": {"ground_truth": 3}},
    ])
    recs = load_jsonl(p)
    assert recs[0].messages == (("user", "1+1"),) and recs[0].ground_truth == "2" and recs[0].uid == "d:1"
    assert recs[1].messages == (("user", "plain string prompt"),) and recs[1].ground_truth == "3" and recs[1].data_source == "math"


@pytest.mark.parametrize(
    "row, match",
    [
        ("{not json", "invalid JSON"),
        ({"prompt": [], "reward_model": {"ground_truth": "1"}}, "prompt"),
        ({"prompt": "x"}, "ground_truth"),
        ({"prompt": "x", "reward_model": {"ground_truth": "1"}, "extra_info": 3}, "extra_info"),
        ([1, 2], "JSON object"),
    ],
)
def test_malformed_records_name_the_line(tmp_path, row, match):
    p = write(tmp_path, [{"prompt": "ok", "reward_model": {"ground_truth": "1"}}, row])
    with pytest.raises(DatasetError, match=match) as err:
        load_jsonl(p)
    assert "d:2" in str(err.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="no records"):
        load_jsonl(write(tmp_path, [""]))


@pytest.mark.parametrize("name", ["x" * 300 + ".jsonl", "a\x00b.jsonl", "é" * 200 + ".jsonl"])
def test_paths_the_filesystem_refuses_are_a_dataset_error(tmp_path, name):
    """A name too long for the filesystem or with a NUL byte (what an API client may send) is a
    clear refusal, never an OSError/ValueError escaping as a server error."""
    with pytest.raises(DatasetError, match="not a readable path"):
        load_jsonl(str(tmp_path / name))


def test_prompt_source_is_deterministic_and_covers_each_epoch(tmp_path):
    p = write(tmp_path, [{"prompt": str(i), "reward_model": {"ground_truth": str(i)}} for i in range(10)])
    recs = load_jsonl(p)
    a, b = PromptSource(recs, seed=3), PromptSource(recs, seed=3)
    assert [r.uid for r in a.take(0, 25)] == [r.uid for r in b.take(0, 25)]
    first_epoch = [r.uid for r in a.take(0, 10)]
    assert sorted(first_epoch) == sorted(r.uid for r in recs)
    assert [r.uid for r in a.take(7, 5)] == [r.uid for r in b.take(0, 12)][7:12]
    assert first_epoch != [r.uid for r in PromptSource(recs, seed=4).take(0, 10)]


def test_parquet_records_and_summary(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from magic.config.schema import DatasetSpec
    from magic.controller.datasets import load_records, summarise

    rows = [
        {"prompt": [{"role": "user", "content": "1+1"}], "data_source": "math", "reward_model": {"ground_truth": "2"}, "extra_info": {"i": 0}},
        {"prompt": [{"role": "user", "content": "print 3"}], "data_source": "code", "reward_model": {"ground_truth": "3"}, "extra_info": {"i": 1}},
    ]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    recs = load_records(path, "ds")
    assert [r.uid for r in recs] == ["ds:1", "ds:2"] and recs[1].data_source == "code"
    info, _ = summarise(DatasetSpec(name="ds", path=str(path)))
    assert info.format == "parquet" and info.records == 2 and info.data_sources == {"math": 1, "code": 1}
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="format"):
        load_records(tmp_path / "x.csv")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="Parquet"):
        load_records(tmp_path / "bad.parquet")


def test_changed_file_is_refused_after_registration(tmp_path, r):
    from magic.config.schema import DatasetSpec
    from magic.controller.datasets import DatasetRegistry

    p = write(tmp_path, [{"prompt": "x", "reward_model": {"ground_truth": "1"}}])
    reg = DatasetRegistry(DatasetIndex(r))
    info, created = reg.register(DatasetSpec(name="d", path=str(p)))
    assert created and reg.load("d")[0].uid == "d:1"
    p.write_text(p.read_text() + json.dumps({"prompt": "y", "reward_model": {"ground_truth": "2"}}) + "\n")
    with pytest.raises(DatasetError, match="changed since it was registered"):
        reg.load("d")


def test_a_huge_line_is_refused_without_being_held(tmp_path):
    """A sparse file (one "line" of NULs) is refused after at most MAX_LINE_CHARS are read."""
    from magic.controller import datasets

    path = tmp_path / "sparse.jsonl"
    with path.open("wb") as f:
        f.truncate(datasets.MAX_LINE_CHARS + 4096)
    with pytest.raises(datasets.DatasetError, match="line longer than"):
        datasets.load_records(path)
