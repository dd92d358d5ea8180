"""The ``omnijax`` program: ``generate`` and ``score`` (app/cli.py) plus the ``caption``, ``batch``, ``demo`` and
``serve`` commands of demo/."""

from __future__ import annotations

from omnijax.app.cli import COMMANDS as APP_COMMANDS
from omnijax.app.cli import main as app_main
from omnijax.demo.cli_batch import add_batch_parser, run_batch_command
from omnijax.demo.cli_caption import add_caption_parser, run_caption
from omnijax.demo.cli_serve import add_serve_parser, run_serve
from omnijax.demo.cli_web import add_demo_parser, run_demo

COMMANDS = dict(APP_COMMANDS, caption=(add_caption_parser, run_caption), batch=(add_batch_parser, run_batch_command),
                demo=(add_demo_parser, run_demo), serve=(add_serve_parser, run_serve))


def main(argv=None) -> int:
    return app_main(argv, COMMANDS)
