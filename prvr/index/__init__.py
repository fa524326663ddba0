"""The video index: encoded videos ranked exactly for a query vector, behind one gallery contract.

Outside ``prvr.index``, code imports only what this module exports. Inside: ``gallery`` (the contract both
backends implement, and what they share), ``backends`` (``open_gallery``), ``video_index`` (the built-in
index: ``store`` segments + manifest with atomic updates, ``snapshot`` one generation of it), ``qdrant`` /
``qdrant_store`` (a Qdrant collection: the engine in this process, or a server), ``move`` (a gallery from one
store to another), ``schema`` (the schema version, record fields and per-video arrays, declared once),
``ingest`` (input videos and their encoding), ``sketch`` (8-bit sketch, bound data), ``kernels`` (numba
passes), ``rank`` (the one rank tail), ``approximate`` (faiss candidates), ``scoring`` (exact scores and
evidence, read through ``VideoArrays``) and ``evidence`` (what rank returns).
"""

from prvr.index.backends import gallery_dir, open_gallery
from prvr.index.evidence import Evidence, VideoEvidence
from prvr.index.gallery import Gallery, IndexMismatchError, QueryError, Weights, check_k, check_weights
from prvr.index.ingest import (
    GalleryError,
    GalleryVideo,
    ReferenceQueries,
    bank_vectors,
    frame_factors,
    half_up,
    localisation_arrays,
)
from prvr.index.move import move as move_gallery
from prvr.index.qdrant import QdrantConfig, QdrantIndex
from prvr.index.qdrant_store import QdrantConnectionError, QdrantTarget
from prvr.index.schema import FIXED, RAGGED, RECORD, SCHEMA_VERSION
from prvr.index.scoring import VideoArrays, query_vector
from prvr.index.store import IndexStoreError
from prvr.index.store import media_paths as stored_media_paths
from prvr.index.video_index import IndexConfig, VideoIndex

__all__ = ["FIXED", "RAGGED", "RECORD", "SCHEMA_VERSION", "Evidence", "Gallery", "GalleryError",
           "GalleryVideo", "IndexConfig", "IndexMismatchError", "IndexStoreError", "QdrantConfig",
           "QdrantConnectionError", "QdrantIndex", "QdrantTarget", "QueryError", "ReferenceQueries",
           "VideoArrays", "VideoEvidence", "VideoIndex", "Weights", "bank_vectors", "check_k",
           "check_weights", "frame_factors", "gallery_dir", "half_up", "localisation_arrays", "move_gallery",
           "open_gallery",
           "query_vector", "stored_media_paths"]
