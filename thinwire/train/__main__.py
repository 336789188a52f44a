"""`python -m thinwire.train [OPTIONS]`: what the cluster launcher (or torchrun) runs per rank."""

import sys

from thinwire.train.loop import main

sys.exit(main())
