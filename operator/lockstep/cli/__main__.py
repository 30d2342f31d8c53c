"""`python -m lockstep.cli`: the `lockstep` command."""

from lockstep.cli.main import main

raise SystemExit(main())
