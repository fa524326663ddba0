"""Training and evaluation data: the official MS-SL layout and the project's HDF5 feature files
(``official``), and a learnable synthetic set written in that layout (``synthetic``)."""
