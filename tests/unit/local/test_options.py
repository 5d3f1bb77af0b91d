"""`magic local` refuses bad flags before any work starts: exit 2 and a line naming the flag and
what it allows (argparse's own format for its flags; the stage schema's problems named by their flag,
with no pydantic URL and no traceback)."""

from __future__ import annotations

import pytest

from magic.cli import main


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--steps", "-5"], "argument --steps: must be at least 1, got -5"),
        (["--val-every", "-1"], "argument --val-every: must be at least 0, got -1"),
        (["--eval-samples", "0"], "argument --eval-samples: must be at least 1, got 0"),
        (["--eval-prompts", "0"], "argument --eval-prompts: must be at least 1, got 0"),
        (["--val-prompts", "0"], "argument --val-prompts: must be at least 1, got 0"),
        (["--rollout-workers", "0"], "argument --rollout-workers: must be at least 1, got 0"),
        (["--T1", "zero"], "argument --T1: expected an integer, got 'zero'"),
        (["--timeout", "0"], "argument --timeout: must be at least 1, got 0"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(capsys, flags, named):
    with pytest.raises(SystemExit) as done:
        main(["local", *flags])
    assert done.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--D_R", "0"], "--rollout-batch-size/--D_R: Input should be greater than or equal to 1, got 0"),
        (["--entropy-target", "-1"], "--entropy-target/--tgt_ent: Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_stage_setting_exits_2_naming_its_flag_before_any_work(capsys, tmp_path, flags, named):
    code = main(["local", "--out", str(tmp_path / "out"), "--demo-dir", str(tmp_path / "demo"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
    assert "errors.pydantic.dev" not in err and "Traceback" not in err
    assert not (tmp_path / "demo").exists() and not (tmp_path / "out").exists()  # refused before the warm start


@pytest.mark.parametrize("command", [["local"], ["eval"], ["export"], ["status"], ["stage", "start"], ["run", "create"], ["dataset", "register"]])
def test_help_texts_print_as_written(capsys, command):
    """argparse doubles `%` in help strings, never in descriptions: no command prints "%%"."""
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    assert "%%" not in capsys.readouterr().out


def test_the_next_commands_run_as_printed(monkeypatch, tmp_path):
    """After `make run`, `magic` is .venv/bin/magic, not on the PATH: the hints say so."""
    import sys

    from magic.local.launcher import next_commands

    venv_magic = tmp_path / ".venv" / "bin" / "magic"
    venv_magic.parent.mkdir(parents=True)
    venv_magic.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(venv_magic), "local"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    text = next_commands(tmp_path / "out", tmp_path / "out" / "run.png", 40)
    assert "  .venv/bin/magic local --steps 120" in text and "(.venv/bin/magic local --help)" in text
    assert "reward" not in text  # the plot has no reward curve: the hint names what it has
