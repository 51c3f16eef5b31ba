"""`python -m hydra_node.cli` runs the command line."""

from hydra_node.cli.main import main

raise SystemExit(main())
