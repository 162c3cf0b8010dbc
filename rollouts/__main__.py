"""`python -m rollouts ...` (what `torchrun -m rollouts train grpo ...` runs): the CLI."""

import sys

from rollouts.cli import main

sys.exit(main())
