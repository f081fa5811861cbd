"""docs/protocol.md's rules outside its generated schema tables, held to the code: a client written from the
document computes the same bytes and fingerprints as apexrl.

The schema tables between the ``schema:begin`` / ``schema:end`` marks are checked verbatim in
tests/replay/test_protocol.py; here each test reads a rule stated in the prose (a join character, a magic, a
version, a header layout, a fingerprint example) from the document and compares it with what the code does.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import struct

import lz4.block
import numpy as np
import pytest

from apexrl.replay.wire import schema, structure
from apexrl.replay.wire import steps as S
from apexrl.replay.wire.codec import FieldSpec

DOC = (pathlib.Path(__file__).parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")


def section(start: str, end: str) -> str:
    assert start in DOC and end in DOC, f"docs/protocol.md lost {start!r} or {end!r}"
    return DOC[DOC.index(start) : DOC.index(end, DOC.index(start))]


def one(pattern: str, text: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text))
    assert len(found) == 1, f"docs/protocol.md: expected one match of {pattern!r}, found {len(found)}"
    return found[0]


STEP_CHUNKS = section("**Step chunks**", "**Sequence items**")
SEQUENCE_ITEMS = section("**Sequence items**", "**Sampling.**")
EXAMPLE = section("<!-- step-fingerprint:begin -->", "<!-- step-fingerprint:end -->")


def doc_example() -> tuple[list[list], int]:
    """(structure, fingerprint) of the document's worked example."""
    structure_json = one(r"\nstructure: +(\[.*\])\n", EXAMPLE).group(1)
    fingerprint = int(one(r"\nfingerprint: +(\d+)\n", EXAMPLE).group(1))
    return json.loads(structure_json), fingerprint


def test_step_paths_join_with_the_character_the_document_states():
    joined = one(r"keys joined with `([^`]+)`", STEP_CHUNKS).group(1)
    assert joined == structure.SEPARATOR
    leaves = S.flatten({"obs": {"pixels": np.zeros((2, 2), np.uint8)}, "reward": np.float32(0)})
    assert list(leaves) == [f"obs{joined}pixels", "reward"]
    # The spec's field-name rule (Version 6, structured items) names the same character.
    spec_rule = one(r"Field names of a spec may join identifiers with `([^`]+)`", DOC).group(1)
    assert spec_rule == joined
    FieldSpec(f"obs{joined}pixels", "<f4")


def test_the_documented_fingerprint_example_is_what_the_code_computes():
    documented, fingerprint = doc_example()
    # The step the example describes, built from its own paths (split at the documented join character).
    joined = one(r"keys joined with `([^`]+)`", STEP_CHUNKS).group(1)
    step: dict = {}
    for path, dtype, shape in reversed(documented):  # given in another order than the sorted one
        *parents, leaf = path.split(joined)
        node = step
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = np.zeros(shape, np.dtype(dtype))
    fields = S.structure_of(S.flatten(step))
    assert [f.describe() for f in fields] == documented
    assert S.structure_fingerprint(fields) == fingerprint
    # The recipe the prose states, followed literally: compact JSON, BLAKE2b-64, little-endian, one bit right.
    text = json.dumps(documented, separators=(",", ":"))
    assert int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1 == fingerprint


def _prefix(text: str) -> tuple[bytes, int]:
    m = one(r'`b"([A-Z]{4})"`, u16 version (\d+), u16 0, u32 (?:header length )?H, H bytes of JSON', text)
    return m.group(1).encode(), int(m.group(2))


def _json_keys(text: str) -> list[str]:
    """The keys of the JSON object the paragraph shows (`{"fp": ..., "k": ..., ...}`), in order."""
    obj = one(r'`(\{"fp":.*?\})`', text.replace("\n", " ")).group(1)
    return re.findall(r'"(\w+)":', obj)


def _entry_names(text: str, key: str) -> list[str]:
    m = one(rf'"{key}": \[\[([a-z_, ]+)\], \.\.\.\]', text.replace("\n", " "))
    return [name.strip() for name in m.group(1).split(",")]


def test_a_step_chunk_is_laid_out_as_documented():
    magic, version = _prefix(STEP_CHUNKS)
    steps = {"count": np.arange(6, dtype=np.int64).reshape(3, 2) * 0, "noise": np.random.default_rng(0).random(3)}
    leaves = S.flatten({"count": steps["count"][0], "noise": steps["noise"][0]})
    fields = S.structure_of(leaves)
    fp = S.structure_fingerprint(fields)
    blob = S.encode_chunk(fields, [steps[f.path] for f in fields], fp)

    got_magic, got_version, flags, h = struct.unpack_from("<4sHHI", blob)
    assert (got_magic, got_version, flags) == (magic, version, 0)
    header = json.loads(blob[12 : 12 + h])
    assert list(header) == _json_keys(STEP_CHUNKS) == ["fp", "k", "f"]
    assert (header["fp"], header["k"]) == (fp, 3)
    names = _entry_names(STEP_CHUNKS, "f")
    assert names == ["path", "dtype", "shape", "codec", "stored_bytes"]
    entries = [dict(zip(names, e, strict=True)) for e in header["f"]]
    assert [[e["path"], e["dtype"], e["shape"]] for e in entries] == [f.describe() for f in fields]

    # Then each column (k values, row-major) in that order: lz4 (codec 1) for the integer zeros, raw (codec 0)
    # for random floats, which lz4 does not shrink by a quarter.
    lz4_codec = int(one(r"one lz4 block \(`codec` (\d)", STEP_CHUNKS).group(1))
    raw_codec = int(one(r"or raw \(`codec` (\d)\)", STEP_CHUNKS).group(1))
    at = 12 + h
    for e in entries:
        body = blob[at : at + e["stored_bytes"]]
        at += e["stored_bytes"]
        raw = np.ascontiguousarray(steps[e["path"]], np.dtype(e["dtype"])).tobytes()
        if e["path"] == "count":
            assert e["codec"] == lz4_codec
            assert lz4.block.decompress(body, uncompressed_size=len(raw)) == raw
        else:
            assert e["codec"] == raw_codec and body == raw
    assert at == len(blob)


def test_a_sequence_item_is_laid_out_as_documented():
    magic, version = _prefix(SEQUENCE_ITEMS)
    extras = {"state": np.arange(4, dtype=np.float32)}
    blob = S.encode_item(fingerprint=7, first=2, n=5, max_sequence_length=8, extras=extras)

    got_magic, got_version, flags, h = struct.unpack_from("<4sHHI", blob)
    assert (got_magic, got_version, flags) == (magic, version, 0)
    header = json.loads(blob[12 : 12 + h])
    assert list(header) == _json_keys(SEQUENCE_ITEMS) == ["fp", "first", "n", "t", "x"]
    assert (header["fp"], header["first"], header["n"], header["t"]) == (7, 2, 5, 8)
    assert _entry_names(SEQUENCE_ITEMS, "x") == ["path", "dtype", "shape"]
    assert header["x"] == [["state", "<f4", [4]]]
    assert blob[12 + h :] == extras["state"].tobytes()  # then each extra's raw bytes


def test_the_documented_header_version_and_magic_are_the_schema():
    assert int(one(r"^# apexrl wire protocol \(version (\d+)\)", DOC).group(1)) == schema.PROTOCOL_VERSION
    m = one(r"Frame 0 of every message is the (\d+)-byte header \(struct `\"([^\"]+)\"`", DOC)
    assert (int(m.group(1)), m.group(2)) == (schema.HEADER.size, schema.HEADER.format)
    assert int(one(r"\*\*Frame 0 is a (\d+)-byte header\*\*", DOC).group(1)) == schema.HEADER_SIZE
    m = one(r"`PROTOCOL_VERSION = (\d+)`, `SUPPORTED_VERSIONS = (\([\d, ]*\))`", DOC)
    assert (int(m.group(1)), eval(m.group(2))) == (schema.PROTOCOL_VERSION, schema.SUPPORTED_VERSIONS)
    # Bytes 0-15 keep their layout in every version: magic, version, op, request_id.
    m = one(r"bytes 0–(\d+)\s+\(([a-z_, ]+)\) keep this layout", DOC)
    names = [n.strip() for n in m.group(2).split(",")]
    assert [f.name for f in schema.HEADER_FIELDS[: len(names)]] == names
    assert struct.calcsize("<" + "".join(f.code for f in schema.HEADER_FIELDS[: len(names)])) == int(m.group(1)) + 1
    flag = one(r"`FLAG_MAX_PRIORITY` \((0x[0-9a-fA-F]+), the only\s+flag", DOC).group(1)
    assert int(flag, 16) == schema.FLAG_MAX_PRIORITY


@pytest.mark.parametrize("extra", [0, 1])
def test_a_field_name_is_at_most_the_documented_length(extra):
    limit = int(one(r"\(a nested mapping's path, `obs\.pixels`; at most (\d+)\s+characters\)", DOC).group(1))
    name = "a." + "b" * (limit - 2 + extra)
    if extra:
        with pytest.raises(ValueError, match="at most"):
            FieldSpec(name, "<f4")
    else:
        assert FieldSpec(name, "<f4").name == name
