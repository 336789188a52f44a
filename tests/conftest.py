"""Suite-wide: pytest puts this folder on sys.path, so every test module can import the helpers
that live here (``procs``)."""
