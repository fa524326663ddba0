"""How a Qdrant server could carry a video's arrays, measured in three forms: as today (the packed bytes as
base64 text in the payload), as one uint8 multivector (raw bytes on the server's disk), and typed (the float32
arrays as float32 multivector rows, the rest packed as uint8 rows, the layout in the payload); JSON lines.

    python -m benchmarks.server_arrays [--videos 100] [--repeats 5]

No Qdrant server runs here, so each form's answer is built as a server sends it (REST: JSON; gRPC: the
``qdrant_client.grpc`` messages, serialized) for the arrays a rank fetches of a video beyond the sketches it
holds in memory (``GROUPS``' "exact" and "evidence" points of ``benchmarks.search_speed``'s synthetic videos,
written by a gallery into the engine in memory and read back), and the client's side is timed: parsing the
answer and turning it back into the video's arrays, which must equal the written ones to the last bit.
Reported per video: raw bytes, bytes on the wire, what the server keeps on disk (the payload's text, or the
vectors' padded rows), and the client's milliseconds, p50 over repeats. The server's own time to read and
send is not in it (no server runs here).
"""

from __future__ import annotations

import argparse
import base64
import json
import time

import numpy as np

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from benchmarks.search_speed import identity_attention_model, reference_bank, synthetic_videos
from prvr.index import QdrantIndex
from prvr.index.qdrant_store import array_id, pack, unpack

ROW = 1024  # bytes a row of the uint8 multivector (a server takes at most 1,048,576 elements a multivector)
READ = ("exact", "evidence")  # the groups a rank fetches from the server (the sketches are read at open)
FORMS = ("base64_payload", "uint8_multivector", "typed_multivectors")  # as each reader names them


def packed_arrays(videos: int) -> list[bytes]:
    """The packed bytes of the groups in READ for ``videos`` synthetic videos, as the gallery writes them."""
    records, fixed, ragged, _ = next(iter(synthetic_videos(videos, "exact", 0, batch=videos, workers=1)))
    model = identity_attention_model()
    gallery = QdrantIndex.create("qdrant+local://:memory:", model, references=reference_bank(model))
    try:  # written by the gallery (the engine, in memory) and read back as its points hold them
        gallery.add_encoded(records, fixed, ragged)
        ids = [array_id(seq, g) for seq in range(videos) for g in READ]
        got = gallery.storage.stores.arrays.retrieve(ids, None)
    finally:
        gallery.close()
    return [bytes(got[i]["data"]) for i in ids]


def rows(data: bytes | np.ndarray, dtype: type = np.uint8) -> np.ndarray:
    """Bytes (or a 1-d array) as a multivector's rows of ROW elements, the last one padded with zeros (the
    layout says where each array ends, so padding reads as nothing)."""
    flat = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else np.asarray(data, dtype)
    out = np.zeros((max(1, -(-len(flat) // ROW)), ROW), dtype)
    out.reshape(-1)[: len(flat)] = flat
    return out


def typed(data: bytes) -> tuple[list, np.ndarray, bytes]:
    """A video's packed arrays split by type: (a layout of [name, float32?, shape], the float32 arrays'
    values as float32 rows, the other arrays packed as bytes)."""
    arrays = unpack({"data": data})
    floats = [a.reshape(-1) for a in arrays.values() if a.dtype == np.float32]
    layout = [[n, a.dtype == np.float32, list(a.shape)] for n, a in arrays.items()]
    rest = pack({n: a for n, a in arrays.items() if a.dtype != np.float32})["data"]
    return layout, rows(np.concatenate(floats) if floats else np.zeros(0, np.float32), np.float32), rest


def from_typed(layout: list, values: np.ndarray, rest: bytes) -> dict[str, np.ndarray]:
    """``typed``'s parts back as the video's arrays."""
    out, others, at, flat = {}, unpack({"data": rest}), 0, values.reshape(-1)
    for name, is_float, shape in layout:
        if is_float:
            count = int(np.prod(shape))
            out[name] = flat[at: at + count].reshape(shape)
            at += count
        else:
            out[name] = others[name]
    return out


def rest_bodies(datas: list[bytes], parts: list[tuple]) -> dict[str, bytes]:
    """Each form's REST answer to one retrieve of these points (``parts``: each one's ``typed``; floats as a
    server writes them: shortest text that reads back the same float32)."""
    b64 = [{"id": i, "payload": {"data": base64.b64encode(d).decode()}} for i, d in enumerate(datas)]
    u8 = [{"id": i, "vector": {"data": rows(d).tolist()}} for i, d in enumerate(datas)]
    ty = []
    for i, (layout, values, rest) in enumerate(parts):
        f32 = ",".join("[" + ",".join(map(str, r)) + "]" for r in values)  # each float32's shortest text
        ty.append(f'{{"id":{i},"payload":{{"layout":{json.dumps(layout)}}},'
                  f'"vector":{{"f32":[{f32}],"bytes":{json.dumps(rows(rest).tolist())}}}}}')
    return {"base64_payload": json.dumps({"result": b64}).encode(),
            "uint8_multivector": json.dumps({"result": u8}).encode(),
            "typed_multivectors": ('{"result":[' + ",".join(ty) + "]}").encode()}


def grpc_bodies(datas: list[bytes], parts: list[tuple]) -> dict[str, bytes]:
    """Each form's gRPC answer to one retrieve of these points (``GetResponse``; ``parts``: each one's
    ``typed``)."""
    from qdrant_client import grpc as g

    def multi(r: np.ndarray) -> g.VectorOutput:
        return g.VectorOutput(multi_dense=g.MultiDenseVector(vectors=[g.DenseVector(data=x) for x in r]))

    b64 = g.GetResponse(result=[g.RetrievedPoint(id=g.PointId(num=i), payload={
        "data": g.Value(string_value=base64.b64encode(d).decode())}) for i, d in enumerate(datas)])
    u8 = g.GetResponse(result=[g.RetrievedPoint(id=g.PointId(num=i), vectors=g.VectorsOutput(
        vectors=g.NamedVectorsOutput(vectors={"data": multi(rows(d))}))) for i, d in enumerate(datas)])
    ty = []
    for i, (layout, values, rest) in enumerate(parts):
        ty.append(g.RetrievedPoint(id=g.PointId(num=i), payload={"layout": g.Value(string_value=json.dumps(
            layout))}, vectors=g.VectorsOutput(vectors=g.NamedVectorsOutput(vectors={
                "f32": multi(values), "bytes": multi(rows(rest))}))))
    return {"base64_payload": b64.SerializeToString(), "uint8_multivector": u8.SerializeToString(),
            "typed_multivectors": g.GetResponse(result=ty).SerializeToString()}


def read_rest(form: str, body: bytes) -> list[dict[str, np.ndarray]]:
    """The client's side of a REST answer: each point's arrays."""
    points = json.loads(body)["result"]
    if form == "base64_payload":
        return [unpack({"data": base64.b64decode(p["payload"]["data"])}) for p in points]
    if form == "uint8_multivector":
        return [unpack({"data": np.asarray(p["vector"]["data"], np.uint8).tobytes()}) for p in points]
    return [from_typed(p["payload"]["layout"], np.asarray(p["vector"]["f32"], np.float32),
                       np.asarray(p["vector"]["bytes"], np.uint8).tobytes()) for p in points]


def read_grpc(form: str, body: bytes) -> list[dict[str, np.ndarray]]:
    """The client's side of a gRPC answer, read from the message itself (qdrant-client's own conversion
    makes Python lists of every value): each point's arrays."""
    from qdrant_client import grpc as g

    def multi(point, name: str, dtype: type) -> np.ndarray:
        return np.array([r.data for r in point.vectors.vectors.vectors[name].multi_dense.vectors], np.float32
                        ).astype(dtype)

    answer = g.GetResponse.FromString(body)
    if form == "base64_payload":
        return [unpack({"data": base64.b64decode(p.payload["data"].string_value)}) for p in answer.result]
    if form == "uint8_multivector":
        return [unpack({"data": multi(p, "data", np.uint8).tobytes()}) for p in answer.result]
    return [from_typed(json.loads(p.payload["layout"].string_value), multi(p, "f32", np.float32),
                       multi(p, "bytes", np.uint8).tobytes()) for p in answer.result]


def server_disk(form: str, data: bytes, part: tuple) -> int:
    """Bytes a server keeps of one point's arrays in this form (the payload's text, or the vectors' rows;
    ``part``: its ``typed``)."""
    if form == "base64_payload":
        return len(base64.b64encode(data))
    if form == "uint8_multivector":
        return rows(data).nbytes
    layout, values, rest = part
    return len(json.dumps(layout)) + values.nbytes + rows(rest).nbytes


def timed_ms(fn, *args, repeats: int) -> float:
    """p50 milliseconds of fn(*args)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def main() -> None:
    """One JSON line per form and protocol."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    datas = packed_arrays(args.videos)
    truth, parts = [unpack({"data": d}) for d in datas], [typed(d) for d in datas]
    n, raw = args.videos, sum(len(d) for d in datas)
    for protocol, bodies, read in (("rest", rest_bodies(datas, parts), read_rest),
                                   ("grpc", grpc_bodies(datas, parts), read_grpc)):
        for form, body in bodies.items():
            back = read(form, body)
            for got, want in zip(back, truth, strict=True):  # to the last bit
                if list(got) != list(want) or not all(np.array_equal(got[k], want[k]) and got[k].dtype ==
                                                      want[k].dtype for k in want):
                    raise SystemExit(f"{protocol} {form}: the arrays read back differ from the written ones")
            disk = sum(server_disk(form, d, t) for d, t in zip(datas, parts, strict=True))
            ms = timed_ms(read, form, body, repeats=args.repeats)
            print(json.dumps({"protocol": protocol, "form": form, "videos": n, "groups": list(READ),
                              "raw_bytes_per_video": round(raw / n),
                              "wire_bytes_per_video": round(len(body) / n),
                              "server_disk_bytes_per_video": round(disk / n),
                              "client_ms_per_video": round(ms / n, 3)}), flush=True)


if __name__ == "__main__":
    main()
