#!/usr/bin/env python3
"""Makes a draft model GGUF for speculative decoding out of a target GGUF, with no download.

Speculative-decoding experiments need draft models of known quality: one that is good
(the target's first layers, or the whole target at a coarser quantization), one that is
worse (fewer layers), and one that is deliberately bad (to check that the engine and the
metrics catch a bad draft). Downloading matched draft models is not possible here (model
weights come only from pinned packages, see scripts/fetch-model.sh), so this script cuts and
requantizes the target itself. A draft made from the target shares its tokenizer by
construction: every metadata pair (tokens, merges, token types, chat template, ...) is copied.

What it writes:
  * the target's metadata, with `<arch>.block_count` set to the new number of blocks,
    `general.name` naming the draft (e.g. "Smollm2-135M-...-draft-L10-q4_0"), and, with
    --quant, `general.file_type` set to the new type; metadata arrays with one entry per
    block (none in Llama) are reindexed like the blocks;
  * every tensor that is not in a block (token_embd, output_norm, output) as in the target;
  * the selected blocks `blk.I.*`, renumbered 0..n-1 in the selected order;
  * the target's data alignment, tensor names, shapes and (without --quant) types and bytes.

Then it reads the file back with gguf's GGUFReader and checks every tensor's name, type,
shape, offset alignment and bytes (a hash of what was written; byte-identical to the target
where nothing was requantized), every metadata pair, and, for requantized tensors, that the
values are the target's within quantization error. The file is written as OUT.partial and
renamed to OUT only when that check passes.

Requires the PyPI packages gguf and numpy (pip install gguf numpy); installs nothing.
Exit status: 0 ok, 1 failed (bad input, or a check failed), 2 usage error,
3 gguf/numpy not installed.
"""

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time

# Quantization types gguf.quants can *write*. specula's engine-worker loads f32, f16, bf16,
# q8_0, q4_0 and q4_1; q5_0/q5_1 are for llama.cpp.
QUANT_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]

EPILOG = """\
block selection (--layers):
  N            the target's first N blocks, blk.0 .. blk.N-1 (a single number is a count)
  LIST         comma-separated block indices and inclusive ranges, kept in the given order
               and renumbered 0..len-1: "0,1,2,20,21", "0-5,20-29", "29-20" (descending);
               a list of one block: "7-7"
  default      all blocks

--bad (a deliberately bad draft, for checking that a bad draft is caught):
  every selected block index i is replaced by L-1-i, L being the target's block count: the
  blocks come from the wrong end of the network and run in reversed order. With a 30-block
  target, "--layers 10 --bad" keeps blk.29, blk.28, ..., blk.20 as the draft's blk.0..blk.9,
  and "--bad" alone keeps all 30 blocks in reverse order. Embeddings, final norm and output
  head stay the target's, so the draft loads and runs like a good one, but its hidden states
  are garbage and its proposals should almost never be accepted. Combines with --quant.

examples:
  scripts/make-draft.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/draft-L10.gguf --layers 10
  scripts/make-draft.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/draft.q4_0.gguf --quant q4_0
  scripts/make-draft.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/draft-bad.gguf --layers 10 --bad
  scripts/make-draft.py --self-test models/SmolLM2-135M-Instruct.Q4_1.gguf

Note that specula serves a model under its file name without ".gguf" and a trailing quant tag
(draft-L10.q4_0.gguf is served as "draft-L10"); general.name is only metadata.
"""

BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


class DraftError(Exception):
    """A problem with the input or the arguments, reported as one line."""


def import_deps():
    """Imports numpy and gguf, or exits 3 naming the install command."""
    try:
        import numpy
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError as e:
        print(
            f"make-draft: needs the Python packages gguf and numpy ({e}); "
            "install them with: pip install gguf numpy",
            file=sys.stderr,
        )
        sys.exit(3)
    return numpy, gguf


# ---------------------------------------------------------------------------------------------
# Block selection and naming


def parse_layers(spec, n_blocks):
    """The selected source block indices, in order. A bare number N is a count."""
    spec = spec.strip()
    if re.fullmatch(r"\d+", spec):
        n = int(spec)
        if not 1 <= n <= n_blocks:
            raise DraftError(f"--layers {n}: the target has {n_blocks} blocks; give 1..{n_blocks}")
        return list(range(n))
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            out.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
        elif re.fullmatch(r"\d+", part):
            out.append(int(part))
        else:
            raise DraftError(f"--layers {spec!r}: {part!r} is neither a block index nor a range A-B")
    if not out:
        raise DraftError(f"--layers {spec!r}: selects no block")
    bad = [i for i in out if i >= n_blocks]
    if bad:
        raise DraftError(
            f"--layers {spec!r}: block {bad[0]} does not exist; the target has blocks 0..{n_blocks - 1}"
        )
    return out


def compact(indices):
    """[0,1,2,5,9,8,7] -> "0-2+5+9-7": runs of consecutive indices (either direction)."""
    parts, i = [], 0
    while i < len(indices):
        j = i
        step = 0
        if i + 1 < len(indices) and abs(indices[i + 1] - indices[i]) == 1:
            step = indices[i + 1] - indices[i]
            while j + 1 < len(indices) and indices[j + 1] - indices[j] == step:
                j += 1
        parts.append(str(indices[i]) if j == i else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return "+".join(parts)


def label_friendly(text):
    """Letters, digits and . _ + - only (safe in file names and as a metric label value)."""
    text = re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-.")
    return re.sub(r"-{2,}", "-", text) or "model"


def draft_name(target_name, layers_tag, quant, bad):
    tags = ["draft", layers_tag]
    if quant:
        tags.append(quant)
    if bad:
        tags.append("bad")
    return label_friendly(" ".join([target_name] + tags))


# ---------------------------------------------------------------------------------------------
# Metadata


def field_value(field, GGUFValueType):
    """(value, vtype, sub_type) of a reader field, in the form GGUFWriter.add_key_value takes.
    Strings are kept as raw bytes, so nothing is re-encoded."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise DraftError(f"metadata {field.name}: nested arrays are not supported")
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data], vtype, sub
        return [v for i in field.data for v in field.parts[i].tolist()], vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), vtype, None
    return field.parts[field.data[0]].tolist()[0], vtype, None


def field_bytes(field):
    """Everything the file holds for one metadata pair (key, type, value)."""
    return b"".join(bytes(p) for p in field.parts)


def open_target(path, gguf):
    """GGUFReader of path, with a plain message for a file that is not a GGUF."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise DraftError(f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF')")
    return gguf.GGUFReader(path)


def string_field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# The draft


class Plan:
    """What to write: metadata changes and the output tensors, in order."""

    def __init__(self, arch, n_blocks, selection, quant, name):
        self.arch = arch
        self.n_blocks = n_blocks
        self.selection = selection
        self.quant = quant
        self.name = name
        self.tensors = []  # (out_name, source ReaderTensor, out GGMLQuantizationType or None = copy)


def build_plan(reader, selection, quant_type, name, gguf):
    T = gguf.GGMLQuantizationType
    arch = string_field(reader, "general.architecture")
    if not arch:
        raise DraftError("the target has no general.architecture")
    bc = reader.fields.get(f"{arch}.block_count")
    if bc is None:
        raise DraftError(f"the target has no {arch}.block_count")
    n_blocks = int(bc.parts[bc.data[0]][0])

    by_block = {}
    for t in reader.tensors:
        m = BLOCK_RE.match(t.name)
        if m:
            i = int(m.group(1))
            if i >= n_blocks:
                raise DraftError(f"tensor {t.name} is past {arch}.block_count = {n_blocks}")
            by_block.setdefault(i, []).append(t)
    missing = [i for i in range(n_blocks) if i not in by_block]
    if missing:
        raise DraftError(f"the target has no tensors for block {missing[0]}")

    plan = Plan(arch, n_blocks, selection, quant_type, name)

    def out_type(t):
        if quant_type is None:
            return None
        if len([d for d in t.shape if d != 1]) <= 1 or len(t.shape) == 1:
            # 1-D tensors (norms, biases) are kept in f32.
            return T.F32 if t.tensor_type != T.F32 else None
        return quant_type

    # Each output tensor takes the place the target's tensor of the same name has in the file
    # (the target may order blocks blk.0, blk.1, blk.10, ...), so that a no-op keeps the file's
    # layout; a name the target lacks goes where its source tensor was.
    position = {t.name: i for i, t in enumerate(reader.tensors)}
    planned = [(t.name, t, out_type(t)) for t in reader.tensors if not BLOCK_RE.match(t.name)]
    for new, old in enumerate(selection):
        for bt in by_block[old]:
            rest = BLOCK_RE.match(bt.name).group(2)
            planned.append((f"blk.{new}.{rest}", bt, out_type(bt)))
    planned.sort(key=lambda p: position.get(p[0], position[p[1].name]))
    plan.tensors = planned
    return plan


def out_nbytes_and_shape(t, qtype, gguf):
    """numpy-order element shape and byte size of tensor t written as qtype."""
    np_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if qtype is None:
        return np_shape, int(t.n_bytes)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if np_shape[-1] % block != 0:
        raise DraftError(
            f"--quant {qtype.name.lower()}: tensor {t.name} has rows of {np_shape[-1]} values, "
            f"not a multiple of the {qtype.name} block size {block}"
        )
    n = 1
    for d in np_shape[:-1]:
        n *= d
    return np_shape, n * (np_shape[-1] // block) * size


def tensor_payload(t, qtype, np, gguf):
    """The bytes to write for tensor t (as a numpy array)."""
    if qtype is None:
        return t.data
    values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    values = values.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
    return gguf.quants.quantize(values, qtype)


def digest(array, np):
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).data, digest_size=16).digest()


def write_draft(target, out, layers=None, quant=None, bad=False, name=None, verify=True, reader=None):
    """Writes the draft; returns a summary (with the checked file's GGUFReader as 'reader').
    `reader` may be the target's GGUFReader, already open (parsing metadata takes seconds)."""
    np, gguf = import_deps()
    T = gguf.GGMLQuantizationType
    V = gguf.GGUFValueType

    if os.path.exists(out) and os.path.samefile(target, out):
        raise DraftError("OUT is the target file")
    started = time.monotonic()
    if reader is None:
        reader = open_target(target, gguf)
    arch = string_field(reader, "general.architecture")
    if not arch:
        raise DraftError("the target has no general.architecture")
    bc = reader.fields.get(f"{arch}.block_count")
    if bc is None:
        raise DraftError(f"the target has no {arch}.block_count")
    n_blocks = int(bc.parts[bc.data[0]][0])

    selection = parse_layers(layers, n_blocks) if layers is not None else list(range(n_blocks))
    first_n = selection == list(range(len(selection)))
    layers_tag = f"L{len(selection)}" if first_n else f"L{compact(selection)}"
    if bad:
        mirrored = [n_blocks - 1 - i for i in selection]
        if mirrored == selection:
            raise DraftError(
                f"--bad: the mirrored selection {selection} is the selection itself; choose other blocks"
            )
        selection = mirrored

    qtype = None
    if quant is not None:
        qtype = T[quant.upper()]
    target_name = (
        string_field(reader, "general.name")
        or os.path.basename(target).removesuffix(".gguf")
    )
    name = label_friendly(name) if name else draft_name(target_name, layers_tag, quant, bad)

    plan = build_plan(reader, selection, qtype, name, gguf)

    # Metadata: every pair, in the target's order, with the draft's changes.
    changed = {}
    changed["general.name"] = (name.encode("utf-8"), V.STRING, None)
    changed[f"{arch}.block_count"] = (len(selection), bc.types[0], None)
    if qtype is not None:
        ftype = {
            T.F32: gguf.LlamaFileType.ALL_F32, T.F16: gguf.LlamaFileType.MOSTLY_F16,
            T.BF16: gguf.LlamaFileType.MOSTLY_BF16, T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
            T.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, T.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
            T.Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0, T.Q5_1: gguf.LlamaFileType.MOSTLY_Q5_1,
        }[qtype]
        ft = reader.fields.get("general.file_type")
        changed["general.file_type"] = (int(ftype), ft.types[0] if ft else V.UINT32, None)
    per_block_keys = []
    for key, f in reader.fields.items():
        # Arrays with one entry per block (e.g. per-layer head counts in some architectures).
        if (key.startswith(f"{arch}.") and f.types and f.types[0] == V.ARRAY
                and len(f.data) == n_blocks and key not in changed):
            vals, vt, st = field_value(f, V)
            changed[key] = ([vals[i] for i in selection], vt, st)
            per_block_keys.append(key)

    partial = out + ".partial"
    writer = gguf.GGUFWriter(partial, arch)
    keys_written = ["general.architecture"]
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.alignment":
            writer.add_custom_alignment(int(f.parts[f.data[0]][0]))
        elif key in changed:
            val, vt, st = changed[key]
            writer.add_key_value(key, val, vt, st)
        else:
            val, vt, st = field_value(f, V)
            writer.add_key_value(key, val, vt, st)
        keys_written.append(key)
    for key, (val, vt, st) in changed.items():
        if key not in reader.fields:
            writer.add_key_value(key, val, vt, st)
            keys_written.append(key)
    if writer.data_alignment != reader.alignment:
        raise DraftError(f"alignment {writer.data_alignment} != the target's {reader.alignment}")

    expected = []  # (name, type, GGUF-order shape, nbytes)
    for out_name, t, ot in plan.tensors:
        np_shape, nbytes = out_nbytes_and_shape(t, ot, gguf)
        typ = ot if ot is not None else t.tensor_type
        # Element shape in numpy order plus raw_dtype: GGUFWriter keeps the shape as given when the
        # dtype passed is not uint8 (for uint8 it would take it for a *byte* shape and convert).
        writer.add_tensor_info(out_name, np_shape, np.dtype(np.float32), nbytes, raw_dtype=typ)
        expected.append((out_name, typ, tuple(reversed(np_shape)), nbytes))

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        hashes = []
        for (out_name, t, ot), (_, _, _, nbytes) in zip(plan.tensors, expected):
            payload = tensor_payload(t, ot, np, gguf)
            if payload.nbytes != nbytes:
                raise DraftError(f"{out_name}: {payload.nbytes} bytes to write, {nbytes} announced")
            hashes.append(digest(payload, np))
            writer.write_tensor_data(payload)
        writer.close()
    except BaseException:
        writer.close()
        if os.path.exists(partial):
            os.remove(partial)
        raise
    wrote = time.monotonic()

    summary = {
        "blocks": selection,
        "n_blocks_target": n_blocks,
        "name": name,
        "tensors": len(expected),
        "requantized": sum(1 for _, _, ot in plan.tensors if ot is not None),
        "per_block_keys": per_block_keys,
        "write_s": wrote - started,
    }
    if verify:
        try:
            summary.update(verify_draft(reader, partial, plan, expected, hashes, changed, keys_written, np, gguf))
        except BaseException:
            os.remove(partial)
            raise
    os.replace(partial, out)
    summary["total_s"] = time.monotonic() - started
    summary["size"] = os.path.getsize(out)
    return summary


def verify_draft(src, path, plan, expected, hashes, changed, keys_written, np, gguf):
    """Reads the written file back and checks it against the plan. Raises DraftError."""
    T = gguf.GGMLQuantizationType
    r = gguf.GGUFReader(path)
    problems = []

    # Metadata: the same keys in the same order, each byte-identical to the target's except the
    # changed ones, which must read back as written.
    got_keys = [k for k in r.fields if not k.startswith("GGUF.")]
    if got_keys != keys_written:
        problems.append(f"metadata keys {got_keys} != {keys_written}")
    for key in got_keys:
        f = r.fields[key]
        if key in changed:
            val, vt, st = changed[key]
            got = field_value(f, gguf.GGUFValueType)
            if got[0] != val or got[1] != vt:
                problems.append(f"metadata {key}: read back {got[0]!r:.80}, wrote {val!r:.80}")
        elif field_bytes(f) != field_bytes(src.fields[key]):
            problems.append(f"metadata {key} differs from the target's")
    if r.alignment != src.alignment:
        problems.append(f"alignment {r.alignment} != target's {src.alignment}")

    # Tensors: names, order, types, shapes, offsets, bytes; values for requantized ones.
    if len(r.tensors) != len(expected):
        problems.append(f"{len(r.tensors)} tensors, expected {len(expected)}")
    max_err = {}
    for t, (name, typ, shape, nbytes), h, (_, srct, ot) in zip(r.tensors, expected, hashes, plan.tensors):
        if t.name != name:
            problems.append(f"tensor {t.name!r} where {name!r} was expected")
            continue
        if t.tensor_type != typ:
            problems.append(f"{name}: type {t.tensor_type.name}, expected {typ.name}")
        if tuple(int(d) for d in t.shape.tolist()) != shape:
            problems.append(f"{name}: shape {t.shape.tolist()}, expected {list(shape)}")
        if t.n_bytes != nbytes:
            problems.append(f"{name}: {t.n_bytes} bytes, expected {nbytes}")
        if (t.data_offset - r.data_offset) % r.alignment != 0 or r.data_offset % r.alignment != 0:
            problems.append(f"{name}: data offset {t.data_offset} not aligned to {r.alignment}")
        if digest(t.data, np) != h:
            problems.append(f"{name}: bytes differ from those written")
        if ot is None:
            if digest(t.data, np) != digest(srct.data, np):
                problems.append(f"{name}: not byte-identical to the target's {srct.name}")
        else:
            a = gguf.quants.dequantize(srct.data, srct.tensor_type).astype(np.float64).ravel()
            b = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
            if a.shape != b.shape:
                problems.append(f"{name}: {b.size} values, target's {srct.name} has {a.size}")
                continue
            # Relative RMS error: ~0.1 for 4-bit types, ~0.005 for q8_0, 0 for f32. A layout
            # mistake (transposed rows, wrong block order) would give ~1.4.
            rel = float(np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(a ** 2)) + 1e-30))
            limit = 0.25 if typ in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1) else 0.05
            max_err[typ.name] = max(max_err.get(typ.name, 0.0), rel)
            if rel > limit:
                problems.append(f"{name}: relative RMS error {rel:.3f} against the target (limit {limit})")
    last = r.tensors[-1] if r.tensors else None
    if last is not None:
        end = last.data_offset + last.n_bytes
        size = os.path.getsize(path)
        if not end <= size < end + r.alignment:
            problems.append(f"file size {size}, tensor data ends at {end}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DraftError("check of the written file failed: " + "; ".join(problems[:5]) + more)
    return {"verified": True, "max_rel_rms_error": max_err, "reader": r}


# ---------------------------------------------------------------------------------------------
# Self-test


def self_test(target):
    """Builds two 2-block drafts in a temporary folder and checks them: the first two blocks
    byte-copied (every tensor byte-identical to the target's), and a --bad draft of a block
    list requantized to q8_0 (each block's values those of the target's mirrored block, within
    q8_0 error). No full copy (slow); `make-draft.py TARGET OUT` makes one and its read-back
    check compares every byte. Parsing a GGUF's metadata takes GGUFReader ~2 s, so each file
    is parsed once."""
    np, gguf = import_deps()
    started = time.monotonic()
    src = open_target(target, gguf)
    arch = string_field(src, "general.architecture")
    n_blocks = int(src.fields[f"{arch}.block_count"].parts[-1][0])
    if n_blocks < 3:
        raise DraftError("--self-test needs a target with at least 3 blocks")
    src_by_name = {t.name: t for t in src.tensors}
    checks = 0

    def expect(cond, what):
        nonlocal checks
        checks += 1
        if not cond:
            raise DraftError(f"self-test: {what}")

    def same_bytes(a, b):
        return a.n_bytes == b.n_bytes and digest(a.data, np) == digest(b.data, np)

    def blocks_of(r):
        return sorted({int(m.group(1)) for t in r.tensors if (m := BLOCK_RE.match(t.name))})

    def check_blocks(path, summary, mapping, quant=None):
        r = summary["reader"]  # the written file, as GGUFReader read it back
        expect(int(r.fields[f"{arch}.block_count"].parts[-1][0]) == len(mapping), f"{path}: block_count")
        expect(blocks_of(r) == list(range(len(mapping))), f"{path}: block tensors {blocks_of(r)}")
        expect(r.alignment == src.alignment, f"{path}: alignment")
        for t in r.tensors:
            m = BLOCK_RE.match(t.name)
            s = src_by_name[f"blk.{mapping[int(m.group(1))]}.{m.group(2)}" if m else t.name]
            expect(t.shape.tolist() == s.shape.tolist(), f"{path}: {t.name} shape")
            if quant is None:
                expect(t.tensor_type == s.tensor_type, f"{path}: {t.name} type")
                expect(same_bytes(t, s), f"{path}: {t.name} bytes differ from {s.name}")
            elif len(t.shape) == 1:
                expect(t.tensor_type == gguf.GGMLQuantizationType.F32, f"{path}: {t.name} not F32")
            else:
                expect(t.tensor_type == quant, f"{path}: {t.name} type {t.tensor_type.name}")
            if quant is not None and m:
                # The values are those of the target block it should come from (within error).
                a = gguf.quants.dequantize(s.data, s.tensor_type).astype(np.float64).ravel()
                b = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
                rel = np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(a ** 2)) + 1e-30)
                expect(rel < 0.05, f"{path}: {t.name} is not {s.name} (relative RMS error {rel:.3f})")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"):
            if key in src.fields:
                expect(field_bytes(r.fields[key]) == field_bytes(src.fields[key]), f"{path}: {key}")
        n_src = sum(1 for t in src.tensors if not BLOCK_RE.match(t.name))
        per_block = len(src.tensors) - n_src
        expect(len(r.tensors) == n_src + per_block // n_blocks * len(mapping), f"{path}: tensor count")
        name = string_field(r, "general.name")
        expect(re.fullmatch(r"[A-Za-z0-9._+-]+", name) is not None, f"{path}: name {name!r} not label friendly")
        return name

    expect(parse_layers("0-2,5,9-7", n_blocks) == [0, 1, 2, 5, 9, 8, 7], "parse_layers of a list")
    expect(parse_layers("3", n_blocks) == [0, 1, 2], "parse_layers of a count")
    expect(compact([0, 1, 2, 5, 9, 8, 7]) == "0-2+5+9-7", "compact")
    expect(label_friendly("Smollm2 135M (v1)/x draft L2") == "Smollm2-135M-v1-x-draft-L2", "label_friendly")

    with tempfile.TemporaryDirectory(prefix="make-draft-self-test-") as tmp:
        def draft(file, **kw):
            path = os.path.join(tmp, file)
            return path, write_draft(target, path, reader=src, **kw)

        # The first two blocks, byte-copied.
        p, s = draft("l2.gguf", layers="2")
        expect(check_blocks(p, s, [0, 1]).endswith("-draft-L2"), "name of the 2-block draft")
        # The bad draft of a block list, requantized to q8_0: blocks 1 and 0 become L-2 and L-1.
        p, s = draft("bad-q8.gguf", layers="1,0", bad=True, quant="q8_0")
        name = check_blocks(p, s, [n_blocks - 2, n_blocks - 1], quant=gguf.GGMLQuantizationType.Q8_0)
        expect(name.endswith("-draft-L1-0-q8_0-bad"), f"name of the bad q8_0 draft: {name}")
        expect(s["max_rel_rms_error"].get("Q8_0", 1.0) < 0.05, f"q8_0 error {s['max_rel_rms_error']}")
        del s

        for bad_args in (dict(layers="0"), dict(layers=str(n_blocks + 1)), dict(layers=f"0,{n_blocks}"),
                         dict(layers="1,x")):
            try:
                draft("refused.gguf", **bad_args)
                expect(False, f"{bad_args} accepted")
            except DraftError:
                expect(not os.path.exists(os.path.join(tmp, "refused.gguf")), f"{bad_args} wrote a file")
    return checks, time.monotonic() - started


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="make-draft.py",
        description="Write a draft model GGUF for speculative decoding experiments, made from a\n"
        "target GGUF with no download: a subset of its transformer blocks, optionally requantized,\n"
        "optionally deliberately bad. Metadata, tokenizer and alignment are the target's. The file\n"
        "is read back and checked (names, types, shapes, bytes, metadata) before it becomes OUT.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("target", metavar="TARGET.gguf", help="the target model (e.g. a Llama-architecture GGUF)")
    ap.add_argument("out", metavar="OUT.gguf", nargs="?", help="where to write the draft (not with --self-test)")
    ap.add_argument("--layers", metavar="N|LIST", help="blocks to keep: a count N (the first N) or a list "
                    "like 0-5,20-29 (see below); default: all")
    ap.add_argument("--quant", metavar="TYPE", type=str.lower, choices=QUANT_TYPES,
                    help="requantize every 2-D weight to TYPE (one of: " + ", ".join(QUANT_TYPES) + "; "
                    "specula's engine-worker loads all but q5_0/q5_1); 1-D tensors (norms) are "
                    "written as f32. Default: every tensor byte-copied as stored")
    ap.add_argument("--bad", action="store_true", help="make a deliberately bad draft: blocks mirrored "
                    "(i -> L-1-i) and reversed, see below")
    ap.add_argument("--name", help="general.name of the draft (default: the target's name plus "
                    "'-draft-L<n>[-<quant>][-bad]', made label friendly)")
    ap.add_argument("--no-verify", action="store_true", help="skip reading the file back and checking it")
    ap.add_argument("--self-test", action="store_true", help="build two 2-block drafts of TARGET.gguf "
                    "(byte-copied; --bad with q8_0) in a temporary folder, check them, print 'ok' "
                    "(about 10 s for the default model)")
    args = ap.parse_args(argv)

    if args.self_test:
        if args.out or args.layers or args.quant or args.bad or args.name:
            ap.error("--self-test takes only TARGET.gguf")
        try:
            checks, secs = self_test(args.target)
        except (DraftError, ValueError, OSError) as e:
            print(f"make-draft: {e}", file=sys.stderr)
            return 1
        print(f"make-draft self-test: ok ({checks} checks, {secs:.1f} s)")
        return 0

    if not args.out:
        ap.error("OUT.gguf is required")
    if not os.path.isfile(args.target):
        print(f"make-draft: {args.target}: no such file", file=sys.stderr)
        return 1
    try:
        s = write_draft(args.target, args.out, layers=args.layers, quant=args.quant, bad=args.bad,
                        name=args.name, verify=not args.no_verify)
    except (DraftError, ValueError, OSError) as e:
        # ValueError: GGUFReader's word for a file that is not a (supported) GGUF.
        print(f"make-draft: {e}", file=sys.stderr)
        return 1
    blocks = compact(s["blocks"])
    checked = "checked" if s.get("verified") else "NOT checked"
    err = ", ".join(f"{k} rel. RMS error <= {v:.4f}" for k, v in s["max_rel_rms_error"].items()) \
        if s.get("max_rel_rms_error") else ""
    print(
        f"make-draft: wrote {args.out} ({s['size'] / 1e6:.1f} MB, {s['name']}): "
        f"{len(s['blocks'])} of {s['n_blocks_target']} blocks (target blk {blocks}), "
        f"{s['tensors']} tensors ({s['requantized']} requantized), {checked}"
        f"{'; ' + err if err else ''}; {s['total_s']:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
