"""The video index: encoded videos ranked exactly for a query vector, behind one gallery contract.

``gallery`` (the contract both backends implement, and what they share), ``backends`` (``open_gallery``),
``video_index`` (the built-in index: ``store`` segments + manifest with atomic updates, ``snapshot`` one
generation of it), ``qdrant`` / ``qdrant_store`` (a Qdrant collection), ``schema`` (the per-video arrays,
declared once), ``ingest`` (input videos and their encoding), ``sketch`` (8-bit sketch, bound data),
``kernels`` (numba passes), ``rank`` (the rank tail), ``approximate`` (faiss candidates), ``scoring`` (exact
scores and evidence) and ``evidence`` (what rank returns).
"""

from prvr.index.evidence import Evidence, VideoEvidence
from prvr.index.gallery import Gallery, IndexMismatchError, QueryError
from prvr.index.ingest import GalleryError, GalleryVideo
from prvr.index.store import IndexStoreError
from prvr.index.video_index import IndexConfig, VideoIndex

__all__ = ["Evidence", "Gallery", "GalleryError", "GalleryVideo", "IndexConfig", "IndexMismatchError",
           "IndexStoreError", "QueryError", "VideoEvidence", "VideoIndex"]
