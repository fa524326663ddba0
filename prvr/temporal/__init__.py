"""Query-independent temporal structure of one video's feature rows: segments at several scales
(``segments``), TF-PRVR's propagation over them (``propagation``) and query-bank statistics (``hubness``).
Plain numpy, below every other layer of ``prvr``."""
