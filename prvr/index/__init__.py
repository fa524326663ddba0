"""The video index: encoded videos on disk, ranked exactly for a query vector (``VideoIndex.rank`` ->
``Evidence``). Modules: ``store`` (segments + manifest, atomic updates), ``ingest`` (input videos and their
encoding), ``sketch`` (8-bit sketch, bound data), ``kernels`` (numba passes), ``rank`` (the rank tail),
``approximate`` (faiss candidates), ``evidence`` (what rank returns), ``snapshot`` (one generation of
the stored arrays), ``video_index`` (the class)."""

from prvr.index.evidence import Evidence, VideoEvidence
from prvr.index.ingest import GalleryError, GalleryVideo
from prvr.index.store import IndexStoreError
from prvr.index.video_index import IndexConfig, IndexMismatchError, VideoIndex

__all__ = ["Evidence", "GalleryError", "GalleryVideo", "IndexConfig", "IndexMismatchError", "IndexStoreError",
           "VideoEvidence", "VideoIndex"]
