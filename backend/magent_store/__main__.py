"""Allow ``python -m magent_store`` as a synonym of the ``magent-store`` command."""

from magent_store.main import main

raise SystemExit(main())
