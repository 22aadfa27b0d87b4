"""`python -m proxy.simulator [flags]` is `responses-repair-proxy simulate [flags]`."""

import sys

from proxy.simulator.server import main

raise SystemExit(main(sys.argv[1:]))
