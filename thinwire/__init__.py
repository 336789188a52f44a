"""thinwire: distributed training for clusters whose network is the bottleneck."""

__version__ = "0.1.0"
