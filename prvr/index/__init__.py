"""The video index: encoded videos ranked exactly for a query vector, in one ``Gallery`` over two stores.

Outside ``prvr.index``, code imports only what this module exports. Inside: ``gallery`` (the ``Gallery``:
opening, identity checks, encoding, catalogue, rank tail), ``storage`` (the ``GalleryStore`` interface the
stores implement), ``backends`` (``open_gallery``, ``private_gallery``), ``video_index`` (the built-in store:
``store`` segments + manifest with atomic updates, ``snapshot`` one generation of it), ``qdrant`` /
``qdrant_store`` (a Qdrant collection: the engine in this process, or a server), ``upgrade`` (the previous
schema's built-in index brought over), ``move`` (a gallery from one store to another), ``schema`` (the schema
version, record fields and per-video arrays, declared once), ``encoding`` (input videos, their checks and
their encoding by the model), ``query`` (a query's checks: ``k``, weights, ``QueryError``), ``sketch`` (8-bit
sketch, bound data), ``kernels`` (numba passes), ``rank`` (``top_k``, the bounds and exact kernels' drivers),
``approximate`` (faiss candidates), ``scoring`` (exact scores and evidence, read through ``VideoArrays``),
``words`` (the words channel: a video's timed text stored, matched dense and lexically) and ``evidence`` (what
rank returns).
"""

from prvr.index.backends import gallery_dir, open_gallery, private_gallery
from prvr.index.encoding import (
    GalleryError,
    GalleryVideo,
    ReferenceQueries,
    bank_vectors,
    frame_factors,
    half_up,
    localisation_arrays,
)
from prvr.index.evidence import Evidence, VideoEvidence
from prvr.index.gallery import Gallery, IndexMismatchError
from prvr.index.move import move as move_gallery
from prvr.index.qdrant import QdrantConfig, QdrantIndex
from prvr.index.qdrant_store import QdrantConnectionError, QdrantTarget
from prvr.index.query import (
    APPROXIMATE_FROM,
    MAX_K,
    SEARCH_MODES,
    QueryError,
    SearchMode,
    Weights,
    check_k,
    check_weights,
    search_mode,
)
from prvr.index.schema import FIXED, RAGGED, RECORD, SCHEMA_VERSION, WORDS
from prvr.index.scoring import VideoArrays, query_vector
from prvr.index.storage import DataFolder, GalleryStore
from prvr.index.store import IndexStoreError
from prvr.index.store import media_paths as stored_media_paths
from prvr.index.video_index import IndexConfig, VideoIndex
from prvr.index.words import WORDS_MATCH, QueryTerms, WordMatch

__all__ = ["APPROXIMATE_FROM", "FIXED", "MAX_K", "SEARCH_MODES", "SearchMode", "search_mode",
           "RAGGED", "RECORD", "SCHEMA_VERSION", "DataFolder", "Evidence", "Gallery",
           "GalleryError", "GalleryStore", "GalleryVideo", "IndexConfig", "IndexMismatchError",
           "IndexStoreError", "QdrantConfig", "QdrantConnectionError", "QdrantIndex", "QdrantTarget",
           "QueryError", "QueryTerms", "ReferenceQueries", "VideoArrays", "VideoEvidence", "VideoIndex",
           "WORDS", "WORDS_MATCH", "Weights", "WordMatch",
           "bank_vectors", "check_k", "check_weights", "frame_factors", "gallery_dir", "half_up",
           "localisation_arrays", "move_gallery", "open_gallery", "private_gallery", "query_vector",
           "stored_media_paths"]
