"""`python -m thinwire.train [OPTIONS]`: what the cluster launcher (or torchrun) runs per rank."""

import sys

from thinwire.train.entry import main

sys.exit(main())
