import sys

from rollouts.cli import main

sys.exit(main())
