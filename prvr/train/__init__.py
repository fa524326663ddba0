"""Training MS-SL with the official recipe: BertAdam and its schedule (``optim``), the loop, presets and
command line (``loop``; ``python -m prvr.train``)."""
