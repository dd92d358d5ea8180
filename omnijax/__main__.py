"""``python -m omnijax``: the ``omnijax`` program (generate, caption, demo)."""

from omnijax.demo.cli import main

raise SystemExit(main())
