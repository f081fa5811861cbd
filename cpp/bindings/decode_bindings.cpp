// ItemLayout (the one item layout: item_layout.h) and decode_items: the native item decoder behind
// TransitionSpec.decode_into; rebuild_frame_stacks: the native frame-stack rebuild behind
// FrameStackCodec.decode_valid_into. Arguments are checked with the GIL held (types, shapes, every item inside the
// buffer, every output big enough); the decode itself runs with the GIL released, so several sampler threads decode
// batches side by side.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "apexrl/decode.h"
#include "apexrl/frame_decode.h"
#include "apexrl/step_decode.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style>;
using ByteArray = py::array_t<uint8_t, py::array::c_style>;
using U16Array = py::array_t<uint16_t, py::array::c_style>;
using U64Array = py::array_t<uint64_t, py::array::c_style>;

ItemLayout MakeLayout(uint32_t fingerprint, const std::vector<std::tuple<std::string, std::size_t, bool>>& fields,
                      std::string repr) {
  ItemLayout layout;
  layout.fingerprint = fingerprint;
  layout.repr = std::move(repr);
  for (const auto& [name, nbytes, compress] : fields) {
    if (nbytes > (std::size_t{64} << 20)) throw py::value_error("field '" + name + "': more than 64 MiB per item");
    layout.fields.push_back(ItemField{name, nbytes, compress});
  }
  if (layout.fields.empty()) throw py::value_error("a decode layout needs at least one field");
  return layout;
}

void DecodeItemsPy(const ItemLayout& layout, const py::array& data, const py::array& starts, const py::array& sizes,
                   const py::list& outs) {
  if (!py::isinstance<ByteArray>(data) || data.ndim() != 1) {
    throw py::type_error("data must be a contiguous 1-D uint8 array");
  }
  if (!py::isinstance<Int64Array>(starts) || !py::isinstance<Int64Array>(sizes) || starts.ndim() != 1 ||
      sizes.ndim() != 1 || starts.size() != sizes.size()) {
    throw py::type_error("starts and sizes must be contiguous 1-D int64 arrays of one length");
  }
  const auto n = static_cast<std::size_t>(starts.size());
  const auto* s = static_cast<const int64_t*>(starts.data());
  const auto* z = static_cast<const int64_t*>(sizes.data());
  const auto buf_size = static_cast<int64_t>(data.size());
  for (std::size_t i = 0; i < n; ++i) {  // every item inside the buffer: DecodeItems reads only there
    if (s[i] < 0 || s[i] > buf_size || (z[i] > 0 && z[i] > buf_size - s[i])) {
      throw py::value_error("item " + std::to_string(i) + ": outside the " + std::to_string(buf_size) + "-byte buffer");
    }
  }
  if (outs.size() != layout.fields.size()) {
    throw py::value_error("expected " + std::to_string(layout.fields.size()) + " output arrays, got " +
                          std::to_string(outs.size()));
  }
  std::vector<py::array> keep;
  std::vector<uint8_t*> dst;
  for (std::size_t k = 0; k < layout.fields.size(); ++k) {
    py::array a = py::reinterpret_borrow<py::object>(outs[k]);
    if (!(a.flags() & py::array::c_style) || !a.writeable()) {
      throw py::value_error("output for field '" + layout.fields[k].name + "' is not a writable C-contiguous array");
    }
    if (static_cast<std::size_t>(a.nbytes()) < n * layout.fields[k].nbytes) {
      throw py::value_error("output for field '" + layout.fields[k].name + "' holds " + std::to_string(a.nbytes()) +
                            " bytes, " + std::to_string(n * layout.fields[k].nbytes) + " needed");
    }
    dst.push_back(static_cast<uint8_t*>(a.mutable_data()));
    keep.push_back(std::move(a));
  }
  const auto* bytes = static_cast<const uint8_t*>(data.data());
  std::string error;
  {
    py::gil_scoped_release release;
    error = DecodeItems(layout, bytes, s, z, n, dst.data());
  }
  if (!error.empty()) throw py::value_error(error);
}

U64Array CheckedU64Any(const py::array& a, const char* what) {
  if (!py::isinstance<U64Array>(a)) throw py::type_error(std::string(what) + " must be a C-contiguous uint64 array");
  return py::reinterpret_borrow<U64Array>(a);
}

U64Array CheckedU64(const py::array& a, const char* what) {
  if (!py::isinstance<U64Array>(a) || a.ndim() != 1) {
    throw py::type_error(std::string(what) + " must be a contiguous 1-D uint64 array");
  }
  return py::reinterpret_borrow<U64Array>(a);
}

py::array_t<uint8_t> RebuildFrameStacksPy(std::size_t depth, std::size_t frame_bytes, const py::array& items,
                                          const py::list& refs, const py::array& item_chunks,
                                          const py::array& item_chunk_offsets, const py::buffer& chunk_data,
                                          const py::array& chunk_offsets, const py::list& outs) {
  if (depth == 0 || frame_bytes == 0 || frame_bytes > (std::size_t{64} << 20)) {
    throw py::value_error("depth and frame_bytes must be positive (frame_bytes at most 64 MiB)");
  }
  if (!py::isinstance<Int64Array>(items) || items.ndim() != 1) {
    throw py::type_error("items must be a contiguous 1-D int64 array");
  }
  const U64Array ic = CheckedU64(item_chunks, "item_chunks");
  const U64Array ico = CheckedU64(item_chunk_offsets, "item_chunk_offsets");
  const U64Array co = CheckedU64(chunk_offsets, "chunk_offsets");
  if (co.size() > (int64_t{1} << 31)) throw py::value_error("more than 2^31 chunks");
  const auto n = static_cast<std::size_t>(items.size());
  const auto* g = static_cast<const int64_t*>(items.data());
  for (std::size_t j = 0; j < n; ++j) {  // each item's chunk list is inside item_chunk_offsets
    if (g[j] < 0 || g[j] + 1 >= ico.size()) {
      throw py::value_error("items[" + std::to_string(j) + "] = " + std::to_string(g[j]) + ": not an item of the " +
                            std::to_string(ico.size() ? ico.size() - 1 : 0) + " the chunk offsets describe");
    }
  }
  if (refs.size() != outs.size() || refs.empty()) {
    throw py::value_error("refs and outs must be lists of one array per stack, of one length");
  }
  std::vector<U16Array> keep_refs;
  std::vector<const uint16_t*> ref_ptrs;
  std::vector<py::array> keep_outs;
  std::vector<uint8_t*> out_ptrs;
  for (std::size_t k = 0; k < refs.size(); ++k) {
    py::array r = py::reinterpret_borrow<py::object>(refs[k]);
    if (!py::isinstance<U16Array>(r) || static_cast<std::size_t>(r.size()) != n * depth) {
      throw py::value_error("refs[" + std::to_string(k) + "] must be a contiguous uint16 array of " +
                            std::to_string(n) + " x " + std::to_string(depth) + " references");
    }
    py::array o = py::reinterpret_borrow<py::object>(outs[k]);
    if (!py::isinstance<ByteArray>(o) || !o.writeable()) {
      throw py::value_error("outs[" + std::to_string(k) + "] must be a writable C-contiguous uint8 array");
    }
    if (static_cast<std::size_t>(o.nbytes()) < n * depth * frame_bytes) {
      throw py::value_error("outs[" + std::to_string(k) + "] holds " + std::to_string(o.nbytes()) + " bytes, " +
                            std::to_string(n * depth * frame_bytes) + " needed");
    }
    keep_refs.push_back(py::reinterpret_borrow<U16Array>(r));
    ref_ptrs.push_back(static_cast<const uint16_t*>(r.data()));
    out_ptrs.push_back(static_cast<uint8_t*>(o.mutable_data()));
    keep_outs.push_back(std::move(o));
  }
  const py::buffer_info blob = chunk_data.request();  // held until return: the bytes stay alive and in place
  if (blob.ndim > 1 || (blob.ndim == 1 && blob.strides[0] != blob.itemsize)) {
    throw py::value_error("chunk_data must be a contiguous bytes-like object");
  }
  FrameChunkSet set;
  set.item_chunks = ic.data();
  set.item_chunks_size = static_cast<std::size_t>(ic.size());
  set.item_chunk_offsets = ico.data();
  set.item_chunk_offsets_size = static_cast<std::size_t>(ico.size());
  set.chunk_data = static_cast<const uint8_t*>(blob.ptr);
  set.chunk_data_size = static_cast<std::size_t>(blob.size * blob.itemsize);
  set.chunk_offsets = co.data();
  set.chunk_offsets_size = static_cast<std::size_t>(co.size());
  py::array_t<uint8_t> ok(static_cast<py::ssize_t>(n));
  uint8_t* ok_ptr = ok.mutable_data();
  {
    py::gil_scoped_release release;
    RebuildFrameStacks(depth, frame_bytes, refs.size(), n, g, ref_ptrs.data(), set, out_ptrs.data(), ok_ptr);
  }
  return ok;
}

// A C-contiguous uint64 array of `rows` x `cols` (any shape with that many elements).
U64Array CheckedTable(const py::array& a, const char* what, std::size_t rows, std::size_t cols) {
  const U64Array t = CheckedU64Any(a, what);
  if (static_cast<std::size_t>(t.size()) != rows * cols) {
    throw py::value_error(std::string(what) + " must hold " + std::to_string(rows) + " x " + std::to_string(cols) +
                          " uint64 values, got " + std::to_string(t.size()));
  }
  return t;
}

py::array_t<uint8_t> DecodeStepsPy(const py::buffer& chunk_data, const py::array& columns, const py::array& chunk_steps,
                                   const py::array& row_bytes, const py::list& outs, std::size_t n, std::size_t t,
                                   const py::array& copies) {
  const U64Array steps = CheckedU64(chunk_steps, "chunk_steps");
  const U64Array rb = CheckedU64(row_bytes, "row_bytes");
  const auto num_chunks = static_cast<std::size_t>(steps.size());
  const auto num_fields = static_cast<std::size_t>(rb.size());
  const U64Array cols = CheckedTable(columns, "columns", num_chunks * num_fields, 3);
  const auto num_copies = static_cast<std::size_t>(copies.size() / 5);
  const U64Array cps = CheckedTable(copies, "copies", num_copies, 5);
  if (outs.size() != num_fields) throw py::value_error("outs must hold one array per field");
  if (t > (std::size_t{1} << 24) || n > (std::size_t{1} << 24)) throw py::value_error("n and t must be below 2^24");
  std::vector<py::array> keep;
  std::vector<uint8_t*> out_ptrs;
  for (std::size_t f = 0; f < num_fields; ++f) {
    py::array o = py::reinterpret_borrow<py::object>(outs[f]);
    if (!(o.flags() & py::array::c_style) || !o.writeable()) {
      throw py::value_error("outs[" + std::to_string(f) + "] must be a writable C-contiguous array");
    }
    const uint64_t need = static_cast<uint64_t>(n) * t * rb.data()[f];
    if (rb.data()[f] > (uint64_t{1} << 31) || static_cast<uint64_t>(o.nbytes()) != need) {
      throw py::value_error("outs[" + std::to_string(f) + "] holds " + std::to_string(o.nbytes()) + " bytes, " +
                            std::to_string(need) + " expected");
    }
    out_ptrs.push_back(static_cast<uint8_t*>(o.mutable_data()));
    keep.push_back(std::move(o));
  }
  const py::buffer_info blob = chunk_data.request();  // held until return: the bytes stay alive and in place
  if (blob.ndim > 1 || (blob.ndim == 1 && blob.strides[0] != blob.itemsize)) {
    throw py::value_error("chunk_data must be a contiguous bytes-like object");
  }
  StepDecodeJob job;
  job.chunk_data = static_cast<const uint8_t*>(blob.ptr);
  job.chunk_data_size = static_cast<std::size_t>(blob.size * blob.itemsize);
  job.num_chunks = num_chunks;
  job.num_fields = num_fields;
  static_assert(sizeof(StepColumn) == 3 * sizeof(uint64_t) && sizeof(StepCopy) == 5 * sizeof(uint64_t));
  job.columns = reinterpret_cast<const StepColumn*>(cols.data());
  job.chunk_steps = steps.data();
  job.row_bytes = rb.data();
  job.outs = out_ptrs.data();
  job.n = n;
  job.t = t;
  job.copies = reinterpret_cast<const StepCopy*>(cps.data());
  job.num_copies = num_copies;
  py::array_t<uint8_t> ok(static_cast<py::ssize_t>(n));
  std::memset(ok.mutable_data(), 1, n);
  job.ok = ok.mutable_data();
  {
    py::gil_scoped_release release;
    DecodeSteps(job);
  }
  return ok;
}

}  // namespace

void RegisterDecode(py::module_& m) {
  py::class_<ItemLayout>(m, "ItemLayout",
                         "A TransitionSpec's item layout, for the server's item check and the native decoder (built "
                         "by TransitionSpec.native_layout; immutable).")
      .def(py::init(&MakeLayout), py::arg("fingerprint"), py::arg("fields"), py::arg("repr"))
      .def_property_readonly("header_bytes", &ItemLayout::HeaderBytes);
  m.def("decode_items", &DecodeItemsPy, py::arg("layout"), py::arg("data"), py::arg("starts"), py::arg("sizes"),
        py::arg("outs"),
        "Check and decode items [starts[i], starts[i] + sizes[i]) of data into outs (one C-contiguous array per "
        "field, rows of the field's bytes), with the GIL released. ValueError with TransitionSpec.decode's "
        "message on the first bad item.");
  m.def("decode_steps", &DecodeStepsPy, py::arg("chunk_data"), py::arg("columns"), py::arg("chunk_steps"),
        py::arg("row_bytes"), py::arg("outs"), py::arg("n"), py::arg("t"), py::arg("copies"),
        "Copy sampled sequence items' steps out of their step chunks (wire/steps.py) into outs (one C-contiguous array "
        "of n x t steps per field), with the GIL released: columns (chunks x fields x (offset, stored, codec)) say "
        "where each chunk's field column lies in chunk_data, copies ((chunk, src_row, item, dst_row, rows) rows) what "
        "goes where. Returns ok (uint8 per item): 0 for an item a copy of which was out of range or read a column "
        "that does not decompress to chunk_steps x row_bytes.");
  m.def("rebuild_frame_stacks", &RebuildFrameStacksPy, py::arg("depth"), py::arg("frame_bytes"), py::arg("items"),
        py::arg("refs"), py::arg("item_chunks"), py::arg("item_chunk_offsets"), py::arg("chunk_data"),
        py::arg("chunk_offsets"), py::arg("outs"),
        "Rebuild the frame stacks of the sampled items `items` (indices into the batch's chunk lists) from their "
        "u16 frame references (refs: one (n, depth) uint16 array per stack) and the batch's frame chunks, into "
        "outs (one uint8 array per stack, rows of depth * frame_bytes), with the GIL released. Returns a uint8 "
        "mask: 1 where an item's stacks were rebuilt, 0 where a reference or a chunk it uses is bad (the rules of "
        "FrameStackCodec.decode_valid).");
}

}  // namespace apexrl::bindings
