"""Sub-command modules of the ``elasticslice`` CLI; each exposes ``register(group)``."""
