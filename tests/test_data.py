"""Reading the official layout and our HDF5 files, preprocessing once, collation, and bad-data errors."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from prvr.data.official import (
    BigFile,
    DataError,
    HDF5Source,
    OfficialSource,
    Packed,
    check_compatible,
    prepare_split,
    read_captions,
    read_video2frames,
)
from prvr.data.synthetic import SyntheticConfig, generate
from prvr.models.preprocess import clip_input, frame_input, pad, query_input

SMALL = SyntheticConfig(n_videos=(10, 4, 4), captions_per_video=3, distractors_per_video=1, visual_dim=20,
                        query_dim=12, min_frames=4, max_frames=200, seed=5)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One generated set; tests that damage data work on a copy (``official``)."""
    root = tmp_path_factory.mktemp("data")
    generate(SMALL, root)
    return root


@pytest.fixture
def official(pristine, tmp_path):
    """A private copy of the set: (root, folder of the collection, folder of the features)."""
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    base = tmp_path / SMALL.collection
    return tmp_path, base, base / "FeatureData" / SMALL.feature


def open_source(root: Path) -> OfficialSource:
    return OfficialSource(root, SMALL.collection, SMALL.feature)


def test_generator_is_deterministic(pristine, tmp_path):
    generate(SMALL, tmp_path)
    for rel in ("FeatureData/synthetic_feat/feature.bin", "TextData/synthetictrain.caption.txt"):
        a, b = pristine / SMALL.collection / rel, tmp_path / SMALL.collection / rel
        assert a.read_bytes() == b.read_bytes(), rel


def test_official_round_trip(pristine):
    source = open_source(pristine)
    assert (source.visual_dim, source.query_dim) == (SMALL.visual_dim, SMALL.query_dim)
    caps = source.captions("train")
    assert len(caps) == 30 and caps[0].cap_id == "train00000#enc#0" and caps[0].video_id == "train00000"
    big = BigFile(pristine / SMALL.collection / "FeatureData" / SMALL.feature)
    raw = np.fromfile(big.dir / "feature.bin", dtype="<f4").reshape(big.n_rows, big.dim)
    frames = source.video2frames["train00003"]
    first = big.row_of[frames[0]]
    np.testing.assert_array_equal(source.video_rows("train00003"), raw[first: first + len(frames)])


def test_prepare_split_preprocesses_like_the_official_loader(pristine):
    source = open_source(pristine)
    split = prepare_split(source, "train")
    assert split.video_ids == [f"train{i:05d}" for i in range(10)]  # order of first appearance
    lengths = [len(source.video2frames[v]) for v in split.video_ids]
    assert max(lengths) > 128 and min(lengths) < 32  # both re-binning paths are exercised
    for i, vid in enumerate(split.video_ids):
        rows = source.video_rows(vid)
        torch.testing.assert_close(split.clip_inputs[i], clip_input(rows))
        torch.testing.assert_close(split.frames[i], frame_input(rows))
    for j, cap in enumerate(split.captions):
        torch.testing.assert_close(split.queries[j], query_input(source.caption_tokens(cap.cap_id)))


def test_collate_matches_official_collate_train(pristine):
    source = open_source(pristine)
    split = prepare_split(source, "train")
    idx = torch.tensor([4, 0, 7, 2])
    batch = split.collate(idx)
    # the official collate, written plainly: sort by frame count (desc), pad, flatten captions in video order
    order = sorted(idx.tolist(), key=lambda i: -len(split.frames[i]))
    frames, frame_mask = pad([split.frames[i] for i in order])
    caps = [j for i in order for j, c in enumerate(split.captions) if c.video_id == split.video_ids[i]]
    tokens, token_mask = pad([split.queries[j] for j in caps])
    labels = [order.index(split.video_ids.index(split.captions[j].video_id)) for j in caps]
    torch.testing.assert_close(batch.clip_inputs, split.clip_inputs[order])
    torch.testing.assert_close(batch.frame_inputs, frames)
    torch.testing.assert_close(batch.frame_mask, frame_mask)
    torch.testing.assert_close(batch.query_inputs, tokens)
    torch.testing.assert_close(batch.query_mask, token_mask)
    assert batch.query_labels.tolist() == labels


def test_epoch_batches_cover_every_video_once(pristine):
    split = prepare_split(open_source(pristine), "train")
    batches = list(split.batches(4, torch.Generator().manual_seed(0)))
    assert [len(b.clip_inputs) for b in batches] == [4, 4, 2]
    assert sum(len(b.query_labels) for b in batches) == 30


def test_packed_gather_pads_with_zeros():
    packed = Packed.from_list([torch.ones(2, 3), 2 * torch.ones(4, 3), 3 * torch.ones(1, 3)])
    x, mask = packed.gather(torch.tensor([2, 1]))
    assert x.shape == (2, 4, 3) and mask.tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]
    assert x[0, 0].tolist() == [3, 3, 3] and x[0, 1:].abs().sum() == 0 and (x[1] == 2).all()


def test_missing_video_id(official):
    root, _, feat = official
    table = read_video2frames(feat / "video2frames.txt")
    del table["train00002"]
    (feat / "video2frames.txt").write_text(repr(table))
    with pytest.raises(DataError, match=r"video2frames\.txt: video id 'train00002' not found"):
        prepare_split(open_source(root), "train")


def test_missing_caption_features(official):
    root, base, _ = official
    import h5py

    with h5py.File(base / "TextData" / f"roberta_{SMALL.collection}_query_feat.hdf5", "a") as h5:
        del h5["val00001#enc#2"]
    with pytest.raises(DataError, match=r"query_feat\.hdf5: caption id 'val00001#enc#2' not found"):
        prepare_split(open_source(root), "val")


def test_wrong_dims_in_shape_file(official):
    root, _, feat = official
    n, dim = (feat / "shape.txt").read_text().split()
    (feat / "shape.txt").write_text(f"{n} {int(dim) + 1}")
    with pytest.raises(DataError, match=rf"feature\.bin.*shape\.txt says {n} x {int(dim) + 1}"):
        open_source(root)


def test_wrong_dims_against_a_model(pristine):
    with pytest.raises(DataError, match=r"checkpoint X expects visual 21 / query 12.*has visual 20 / query"):
        check_compatible(21, 12, None, open_source(pristine), "checkpoint X")


def test_nan_features_name_the_video(official):
    root, _, feat = official
    source = open_source(root)
    row = source.bigfile.row_of[source.video2frames["test00001"][2]]
    data = np.fromfile(feat / "feature.bin", dtype="<f4")
    data[row * SMALL.visual_dim + 5] = np.nan
    data.tofile(feat / "feature.bin")
    with pytest.raises(DataError, match=r"feature\.bin: video 'test00001': NaN or inf values in rows \[2\]"):
        prepare_split(open_source(root), "test")


def test_empty_video(official):
    root, _, feat = official
    table = read_video2frames(feat / "video2frames.txt")
    table["val00003"] = []
    (feat / "video2frames.txt").write_text(repr(table))
    with pytest.raises(DataError, match=r"video 'val00003' is empty \(0 rows\)"):
        prepare_split(open_source(root), "val")


def test_malformed_caption_line(official):
    root, base, _ = official
    path = base / "TextData" / f"{SMALL.collection}val.caption.txt"
    path.write_text(path.read_text() + "val00000#enc#9\n")
    with pytest.raises(DataError, match=r"val\.caption\.txt:13: malformed caption line 'val00000#enc#9'"):
        open_source(root).captions("val")


def test_duplicate_caption_id(tmp_path):
    (tmp_path / "c.txt").write_text("a#1 one\na#1 two\n")
    with pytest.raises(DataError, match=r"c\.txt:2: duplicate caption id 'a#1'"):
        read_captions(tmp_path / "c.txt")


def test_video2frames_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "v2f.txt").write_text(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    with pytest.raises(DataError, match="not a Python dict literal"):
        read_video2frames(tmp_path / "v2f.txt")
    assert not marker.exists()


def _our_files(tmp_path: Path, profile_name: str = "paper_test"):
    """Write a small video + caption feature file pair with extract's writer; returns paths and profile."""
    from extract.features import FeatureWriter, VideoFeatures
    from extract.profiles import get_profile

    profile = get_profile(profile_name)
    rng = np.random.default_rng(0)
    with FeatureWriter(tmp_path / "v.h5", profile) as fw:
        for i in range(4):
            n = 5 + 7 * i
            fw.add_video(f"vid/{i}", VideoFeatures(rng.standard_normal((n, profile.visual_dim)), np.arange(n),
                                                   np.arange(n) + 1.0, float(n), f"sha{i}", f"{i}.mp4"))
    with FeatureWriter(tmp_path / "c.h5", profile) as fw:
        for i in range(4):
            for j in range(2):
                fw.add_caption(f"c{i}{j}", f"caption {i} {j}", rng.standard_normal((3 + j, profile.text_dim)),
                               video_id=f"vid/{i}")
    return tmp_path / "v.h5", tmp_path / "c.h5", profile


def test_our_hdf5_files_with_split_lists(tmp_path):
    videos, captions, profile = _our_files(tmp_path)
    (tmp_path / "val.txt").write_text("c10\nc11 some text\nc30\n")
    source = HDF5Source(videos, captions, {"val": tmp_path / "val.txt"})
    assert source.profile == profile.identity()
    split = prepare_split(source, "val")
    assert split.video_ids == ["vid/1", "vid/3"] and split.cap_video.tolist() == [0, 0, 1]
    torch.testing.assert_close(split.clip_inputs[1], clip_input(source.video_rows("vid/3")))
    assert len(prepare_split(source, "all").captions) == 8
    with pytest.raises(DataError, match="no split list for 'train'"):
        source.captions("train")
    (tmp_path / "bad.txt").write_text("c10\nnope\n")
    with pytest.raises(DataError, match=r"c\.h5: caption id 'nope' not found"):
        HDF5Source(videos, captions, {"val": tmp_path / "bad.txt"}).captions("val")


def test_profile_mismatch_is_refused(tmp_path):
    from extract.profiles import ProfileMismatch

    videos, captions, profile = _our_files(tmp_path)
    other = {**profile.identity(), "version": profile.version + 1}
    with pytest.raises(ProfileMismatch, match="feature profile"):
        check_compatible(profile.visual_dim, profile.text_dim, other, HDF5Source(videos, captions), "ckpt")
