"""``python -m geode``: the same as the ``geode`` command."""

from geode.cli import main

raise SystemExit(main())
