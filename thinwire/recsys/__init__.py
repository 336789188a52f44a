"""Recommender models on sharded sparse parameters, trained the DES way (and its baselines).

    from thinwire.recsys import make_model, make_method, Comm
    model = make_model("deepfm", fields=7, k=8)
    method = make_method("des", model, Comm(), num_rows=3523)   # or "ps", "torchrec_tw", ...
    logits, loss = method.train_step(batch, global_batch=1024)

See docs/design.md, section "DES".
"""

from thinwire.recsys.baselines import METHODS, ParameterServer, make_method
from thinwire.recsys.comm import ByteCounter, Comm
from thinwire.recsys.data import Batch, Dataset, adult, movielens, synthetic
from thinwire.recsys.des import OwnerComputeHead
from thinwire.recsys.models import MODELS, ReferenceModel, make_model, roc_auc
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer, owner_of

__all__ = ["METHODS", "MODELS", "Batch", "ByteCounter", "Comm", "Dataset", "EmbeddingShard",
           "OwnerComputeHead", "ParameterServer", "ReferenceModel", "SparseOptimizer", "adult",
           "make_method", "make_model", "movielens", "owner_of", "roc_auc", "synthetic"]
