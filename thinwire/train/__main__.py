"""`python -m thinwire.train [OPTIONS]`: what the cluster launcher (or torchrun) runs per rank."""

import sys

from thinwire.train.modes import main

sys.exit(main())
