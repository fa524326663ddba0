"""The two-branch models: MS-SL (``mssl``: encoders from ``layers``, scoring in ``branches``, losses in
``losses``, the official preprocessing in ``preprocess``, MS-SL++ medoids in ``clustering``, the seed papers'
options in ``ral`` and ``regularizers``), its checkpoints (``checkpoint``), and the training-free models in
the same form (``training_free``; ``bridge`` for the offline ``lite`` profile, ``zero_shot`` for ``clip``)."""
