"""The ``clip-flash`` command: each subcommand's help names it and describes it for a user, and ``serve`` without
its extra says what to install instead of failing on an import."""
from __future__ import annotations

import argparse

import pytest

from clip_flash import cli


@pytest.mark.parametrize("name", ["info", "measure-attention", "embed", "serve", "bench"])
def test_each_subcommands_help_names_it(name, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([name, "--help"])
    assert stopped.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith(f"usage: clip-flash {name} ")
    assert "``" not in help_text  # no docstring markup in front of a user


def test_info_still_runs_and_prints_json(capsys):
    import json

    assert cli.main(["info", "--json"]) == 0
    assert "backends" in json.loads(capsys.readouterr().out)


def test_serve_without_its_extra_says_what_to_install(monkeypatch, capsys):
    from clip_flash.serve import cli as serve_cli

    monkeypatch.setattr(serve_cli, "missing_serve_packages", lambda: ["uvicorn", "orjson"])
    parser = serve_cli.add_arguments(argparse.ArgumentParser())
    assert serve_cli.run(parser.parse_args([])) == 2
    assert 'lacks uvicorn, orjson here: pip install -e ".[serve]"' in capsys.readouterr().err


def test_the_serve_extra_is_installed_where_the_tests_run():
    from clip_flash.serve.cli import missing_serve_packages

    assert missing_serve_packages() == []


def test_no_subcommand_names_them_all(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "a subcommand is needed: " + ", ".join(cli.SUBCOMMANDS) in err and "args" not in err
