"""`python -m proxy` is the `responses-repair-proxy` command."""

from proxy.cli import main

raise SystemExit(main())
