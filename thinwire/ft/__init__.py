"""Fault tolerance: training that keeps going when a node is lost (torchft's quorum and
healing underneath, thinwire's state and collectives on top)."""
