"""Cost model and scaling simulator: alpha-beta networks, thinwire's algorithms, a FLOP-based
compute model, DDP's bucketed overlap, and calibration against measured runs.
See docs/design.md, "Cost model and simulator"."""
