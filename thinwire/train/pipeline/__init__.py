"""`thinwire pipeline train`: the pipeline-parallel training command built on the library's
``thinwire.pipeline`` (schedules, stages, engines): its options and launch (``cli``), what
each launched rank runs (``run``, ``python -m thinwire.train.pipeline train ...``) and the
bundled data set a run trains on (``data``)."""
