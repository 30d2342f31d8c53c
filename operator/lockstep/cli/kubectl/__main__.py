"""`python -m lockstep.cli.kubectl`: the `kubectl lockstep` command."""

from lockstep.cli.kubectl import main

raise SystemExit(main())
