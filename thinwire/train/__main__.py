"""`python -m thinwire.train [OPTIONS]`: what the cluster launcher (or torchrun) runs per rank."""

from thinwire.rank_exit import exit_rank
from thinwire.train.entry import main

exit_rank(main())
