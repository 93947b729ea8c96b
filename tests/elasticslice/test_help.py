"""Every command and group of `elasticslice` explains itself: a description, and help for
every option (`emulator init --project` used to have none)."""
from __future__ import annotations

import click
from click.testing import CliRunner

from elasticslice.cli import cli


def _walk(group: click.Group, path: tuple[str, ...] = ()):
    if hasattr(group, "load_all"):
        group.load_all()
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _walk(command, (*path, name))


def test_every_command_and_option_has_help():
    seen = 0
    for path, command in _walk(cli):
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, path
        assert (command.help or "").strip(), f"{' '.join(path)}: no description"
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert (param.help or "").strip(), f"{' '.join(path)} {param.opts[0]}: no help"
        seen += 1
    assert seen >= 20


def test_the_command_table_names_what_each_module_registers():
    """The command line imports a command's module only when it runs (COMMANDS): a command
    the table forgot would be missing, one it misplaces would fail to load."""
    import importlib

    from elasticslice.cli import COMMAND_MODULES, COMMANDS, FriendlyGroup
    seen = {}
    for module in COMMAND_MODULES:
        group = FriendlyGroup("probe")
        importlib.import_module(f"elasticslice.commands.{module}").register(group)
        seen.update(dict.fromkeys(group.commands, module))
    assert seen == COMMANDS


def test_a_command_imports_only_its_own_module():
    """`elasticslice getversion` does not pay for the emulator, the manager or Dask."""
    import subprocess
    import sys
    code = ("import sys\nfrom elasticslice.cli import cli\n"
            "try:\n    cli(['getversion', '--help'], prog_name='elasticslice')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('elasticslice.emulator', 'elasticslice.managers', "
            "'distributed', 'elasticslice.pilots.cluster') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Show the SA's and the CM's GetVersion" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]"


def test_emulator_group_help_shows_how_to_start():
    result = CliRunner().invoke(cli, ["emulator", "--help"])
    assert "emulator init  --dir" in result.output and "emulator serve --dir" in result.output


def test_a_usage_error_is_one_line_that_names_the_help(tmp_path):
    """What broke: `elasticslice run --nosuch` printed click's usage block before its error
    (troy's commands said one line); now both say one line and exit 2."""
    import subprocess
    import sys
    for args, line in ((["run", "--nosuch"],
                        "Error: No such option '--nosuch'. (see 'elasticslice run --help')"),
                       (["emulator", "serve", "--port", "x"],
                        "Error: Invalid value for '--port': 'x' is not a valid integer range. "
                        "(see 'elasticslice emulator serve --help')")):
        out = subprocess.run([sys.executable, "-m", "elasticslice.cli", *args],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert out.returncode == 2, out
        assert out.stderr.strip().splitlines() == [line] and out.stdout == ""


def test_an_unretrieved_future_at_exit_is_no_traceback_after_the_last_line(tmp_path):
    """What broke: `elasticslice run --timeout` ended with its one line, then asyncio's
    "Future exception was never retrieved ... TimeoutError" (a Dask future collected at
    exit). It is shown with --debug only."""
    import subprocess
    import sys
    code = ("import asyncio, logging\n"
            "from elasticslice.cli import setup_logging\n"
            "import sys\n"
            "setup_logging(sys.argv[1] == 'debug')\n"
            "loop = asyncio.new_event_loop()\n"
            "f = loop.create_future(); f.set_exception(TimeoutError('Timeout')); del f\n"
            "import gc; gc.collect()\n")
    quiet = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=60)
    loud = subprocess.run([sys.executable, "-c", code, "debug"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert "never retrieved" in loud.stderr      # the case happens
    assert "never retrieved" not in quiet.stderr and "Timeout" not in quiet.stderr
