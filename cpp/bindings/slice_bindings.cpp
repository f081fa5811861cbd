// SliceTable (apexrl.replay.slices wraps it): arrays are checked and unpacked with the GIL held, the table's calls
// run with it released, and a sample's arrays view the C++ buffers of its SliceSample, kept alive by the opaque
// object owning it (the sample's "native", which decode_slices takes).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/slices/slice_decode.h"
#include "apexrl/slices/slice_table.h"
#include "apexrl/slices/window_item.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

template <typename T>
py::array View(std::vector<T>& v, const py::handle& base) {
  return py::array_t<T>({static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(T))}, v.data(), base);
}

uint64_t Insert(SliceTable& table, uint64_t fingerprint, const py::list& chunks, const U64Array& steps,
                const py::object& priorities, const U64Array& columns) {
  const size_t m = chunks.size();
  if (steps.ndim() != 1 || static_cast<size_t>(steps.size()) != m) {
    throw InvalidArgument("steps must hold one count per chunk (" + std::to_string(m) + ")");
  }
  if (columns.ndim() != 3 || static_cast<size_t>(columns.shape(0)) != m || columns.shape(2) != 3) {
    throw InvalidArgument("columns must have shape (" + std::to_string(m) + ", fields, 3)");
  }
  const auto num_fields = static_cast<size_t>(columns.shape(1));
  std::vector<py::buffer_info> views;
  views.reserve(m);
  std::vector<const uint8_t*> data;
  std::vector<uint64_t> sizes;
  for (size_t c = 0; c < m; ++c) {
    if (!py::isinstance<py::bytes>(chunks[c]) && !PyObject_CheckBuffer(chunks[c].ptr())) {
      throw InvalidArgument("chunk " + std::to_string(c) + " must be bytes-like");
    }
    views.push_back(py::reinterpret_borrow<py::buffer>(chunks[c]).request());
    data.push_back(static_cast<const uint8_t*>(views.back().ptr));
    sizes.push_back(static_cast<uint64_t>(views.back().size * views.back().itemsize));
  }
  uint64_t total = 0;
  for (py::ssize_t c = 0; c < steps.size(); ++c) total += steps.data()[c];
  F64Array p;
  if (!priorities.is_none()) {
    p = F64Array::ensure(priorities);
    if (!p || p.ndim() != 1 || static_cast<uint64_t>(p.size()) != total) {
      throw InvalidArgument("priorities must be a 1-D float array of one value per step (" + std::to_string(total) +
                            ")");
    }
  }
  const double* pp = priorities.is_none() ? nullptr : p.data();
  py::gil_scoped_release release;
  return table.Insert(fingerprint, data.data(), sizes.data(), steps.data(), m, pp, columns.data(), num_fields);
}

py::dict Sample(SliceTable& table, size_t n, double beta, bool copy_chunks) {
  auto out = std::make_unique<SliceSample>();
  {
    py::gil_scoped_release release;
    table.Sample(n, beta, out.get(), copy_chunks);
  }
  SliceSample* s = out.get();
  py::object base = py::cast(std::move(out));
  py::dict d;
  d["native"] = base;
  d["keys"] = View(s->keys, base);
  d["probabilities"] = View(s->probabilities, base);
  d["weights"] = View(s->weights, base);
  d["rows"] = View(s->rows, base);
  d["first"] = View(s->first, base);
  d["fingerprints"] = View(s->fingerprints, base);
  d["window_chunk_offsets"] = View(s->window_chunk_offsets, base);
  d["window_chunks"] = View(s->window_chunks, base);
  d["chunk_data"] = View(s->chunk_data, base);
  d["chunk_offsets"] = View(s->chunk_offsets, base);
  d["chunk_steps"] = View(s->chunk_steps, base);
  d["columns"] = View(s->columns, base).attr("reshape")(s->chunk_steps.size(), s->num_fields, 3);
  d["total_mass"] = s->total_mass;
  d["min_mass"] = s->min_mass;
  d["windows"] = s->windows;
  return d;
}

size_t Update(SliceTable& table, const U64Array& keys, const F64Array& values) {
  const size_t n = keys.ndim() == 1 ? static_cast<size_t>(keys.size()) : 0;
  if (keys.ndim() != 1) throw InvalidArgument("keys must be 1-D");
  const size_t length = table.config().length;
  bool per_step = false;
  if (values.ndim() == 1 && static_cast<size_t>(values.size()) == n) {
    per_step = false;
  } else if (values.ndim() == 2 && static_cast<size_t>(values.shape(0)) == n &&
             static_cast<size_t>(values.shape(1)) == length) {
    per_step = true;
  } else {
    throw InvalidArgument("priorities must have shape (" + std::to_string(n) + ",) or (" + std::to_string(n) + ", " +
                          std::to_string(length) + ")");
  }
  py::gil_scoped_release release;
  return table.Update(keys.data(), n, values.data(), per_step);
}

// The output arrays of a window decode: n x window rows each, writable, C-contiguous; their row bytes and data.
struct Outs {
  std::vector<py::array> keep;
  std::vector<uint8_t*> ptrs;
  std::vector<uint64_t> row_bytes;
  uint8_t* mask = nullptr;
};

Outs CheckOuts(const py::list& outs, size_t num_fields, const py::array& mask, size_t n, size_t window) {
  if (outs.size() != num_fields) {
    throw py::value_error("outs must hold one array per field (" + std::to_string(num_fields) + ")");
  }
  if (window < 1 || window > kMaxEpisodeSteps) throw py::value_error("window must be in [1, 2^24)");
  Outs r;
  auto& keep = r.keep;
  auto& ptrs = r.ptrs;
  auto& row_bytes = r.row_bytes;
  for (size_t f = 0; f < num_fields; ++f) {
    py::array o = py::reinterpret_borrow<py::object>(outs[f]);
    const bool shaped =
        o.ndim() >= 2 && static_cast<size_t>(o.shape(0)) == n && static_cast<size_t>(o.shape(1)) == window;
    if (!shaped || !(o.flags() & py::array::c_style) || !o.writeable()) {
      throw py::value_error("outs[" + std::to_string(f) + "] must be a writable C-contiguous array of shape (" +
                            std::to_string(n) + ", " + std::to_string(window) + ", ...)");
    }
    row_bytes.push_back(n == 0 ? 0 : static_cast<uint64_t>(o.nbytes()) / (n * window));
    ptrs.push_back(static_cast<uint8_t*>(o.mutable_data()));
    keep.push_back(std::move(o));
  }
  const bool mask_ok = mask.ndim() == 2 && static_cast<size_t>(mask.shape(0)) == n &&
                       static_cast<size_t>(mask.shape(1)) == window && mask.itemsize() == 1 &&
                       (mask.flags() & py::array::c_style) && mask.writeable();
  if (!mask_ok) throw py::value_error("mask must be a writable C-contiguous (n, window) bool array");
  r.mask = static_cast<uint8_t*>(py::array(mask).mutable_data());
  return r;
}

py::array_t<uint8_t> DecodeSlicesPy(const SliceSample& s, const py::list& outs, const py::array& mask, size_t window) {
  const size_t n = s.rows.size();
  const Outs o = CheckOuts(outs, s.num_fields, mask, n, window);
  py::array_t<uint8_t> ok(static_cast<py::ssize_t>(n));
  {
    py::gil_scoped_release release;
    DecodeSlices(s, o.row_bytes.data(), o.ptrs.data(), window, o.mask, ok.mutable_data());
  }
  return ok;
}

// A byte frame (bytes-like, C-contiguous) as (data, size).
std::pair<const uint8_t*, uint64_t> Bytes(const py::buffer_info& b) {
  if (b.ndim > 1 || (b.ndim == 1 && b.strides[0] != b.itemsize)) {
    throw py::value_error("data and chunk_data must be contiguous 1-D byte buffers");
  }
  return {static_cast<const uint8_t*>(b.ptr), static_cast<uint64_t>(b.size * b.itemsize)};
}

U64Array Offsets(const py::object& o, const char* what, size_t* count) {
  U64Array a = U64Array::ensure(o);
  if (!a || a.ndim() != 1 || a.size() < 1) throw py::value_error(std::string(what) + " must be a 1-D array of offsets");
  *count = static_cast<size_t>(a.size()) - 1;
  return a;
}

py::tuple DecodeWindowItemsPy(const py::buffer& data, const py::object& offsets, const py::object& item_chunks,
                              const py::object& item_chunk_offsets, const py::buffer& chunk_data,
                              const py::object& chunk_offsets, uint64_t fingerprint, const py::list& outs,
                              const py::array& mask, size_t window) {
  size_t n = 0, n_refs = 0, m = 0;
  const U64Array off = Offsets(offsets, "offsets", &n);
  const U64Array ico = Offsets(item_chunk_offsets, "item_chunk_offsets", &n_refs);
  const U64Array co = Offsets(chunk_offsets, "chunk_offsets", &m);
  if (n_refs != n) throw py::value_error("item_chunk_offsets must hold one offset per item, and one more");
  const U64Array refs = U64Array::ensure(item_chunks);
  if (!refs || refs.ndim() != 1) throw py::value_error("item_chunks must be a 1-D array of chunk indices");
  if (outs.size() < 1 || outs.size() > 65536) throw py::value_error("outs must hold 1..65536 arrays");
  const Outs o = CheckOuts(outs, outs.size(), mask, n, window);
  const py::buffer_info d = data.request(), cd = chunk_data.request();
  WindowItemsReply reply;
  std::tie(reply.data, reply.data_size) = Bytes(d);
  reply.offsets = off.data();
  reply.n = n;
  reply.item_chunks = refs.data();
  reply.num_item_chunks = static_cast<uint64_t>(refs.size());
  reply.item_chunk_offsets = ico.data();
  std::tie(reply.chunk_data, reply.chunk_data_size) = Bytes(cd);
  reply.chunk_offsets = co.data();
  reply.num_chunks = m;
  py::array_t<uint8_t> ok(static_cast<py::ssize_t>(n));
  py::array_t<uint64_t> rows(static_cast<py::ssize_t>(n));
  {
    py::gil_scoped_release release;
    DecodeWindowItems(reply, fingerprint, outs.size(), o.row_bytes.data(), o.ptrs.data(), window, o.mask,
                      ok.mutable_data(), rows.mutable_data());
  }
  return py::make_tuple(ok, rows);
}

py::dict Stats(const SliceTable& table) {
  const SliceStats s = table.Stats();
  py::dict d;
  d["episodes"] = s.episodes;
  d["steps"] = s.steps;
  d["windows"] = s.windows;
  d["chunk_bytes"] = s.chunk_bytes;
  d["metadata_bytes"] = s.metadata_bytes;
  d["total_mass"] = s.total_mass;
  d["min_mass"] = s.min_mass;
  d["inserted_episodes"] = s.inserted_episodes;
  d["evicted_episodes"] = s.evicted_episodes;
  d["sampled"] = s.sampled;
  d["updated"] = s.updated;
  d["stale_updates"] = s.stale_updates;
  return d;
}

}  // namespace

void RegisterSlices(py::module_& m) {
  py::class_<SliceSample>(m, "SliceSample", "A SliceTable sample's C++ buffers (opaque; its dict's arrays view them).");
  m.def("decode_slices", &DecodeSlicesPy, py::arg("sample"), py::arg("outs"), py::arg("mask"), py::arg("window"),
        "Decode a SliceTable sample's windows into outs (one writable C-contiguous (n, window, ...) array per field, "
        "the fields in the order of the columns given at insert) and mask ((n, window) bool), with the GIL "
        "released: each window's steps, then zeros. Returns ok (uint8 per window): 0 where a window does not fit "
        "in `window` steps or a column does not decompress to its size (its rows and mask all zero).");
  m.def("decode_window_items", &DecodeWindowItemsPy, py::arg("data"), py::arg("offsets"), py::arg("item_chunks"),
        py::arg("item_chunk_offsets"), py::arg("chunk_data"), py::arg("chunk_offsets"), py::arg("fingerprint"),
        py::arg("outs"), py::arg("mask"), py::arg("window"),
        "Decode a slices table's SAMPLE reply (its window items, slices/window_item.h, and the frames as received) "
        "into outs (one writable C-contiguous (n, window, ...) array per field, in path order) and mask, with the "
        "GIL released; every item field and frame offset checked before it is read through. Returns (ok, rows): "
        "ok 0 and rows 0 for a window that is malformed, of another fingerprint, or does not decode (its rows and "
        "mask all zero).");
  py::class_<SliceTable, std::shared_ptr<SliceTable>>(m, "SliceTable")
      .def(py::init([](uint64_t capacity_steps, uint32_t length, uint32_t burn_in, const std::string& sampler,
                       double alpha, double eta, bool strict_length, uint32_t span, uint64_t seed) {
             SliceConfig c;
             c.capacity_steps = capacity_steps;
             c.length = length;
             c.burn_in = burn_in;
             if (sampler == "prioritized") {
               c.sampler = SliceSampling::kPrioritized;
             } else if (sampler == "uniform") {
               c.sampler = SliceSampling::kUniform;
             } else {
               throw InvalidArgument("sampler must be 'prioritized' or 'uniform', got '" + sampler + "'");
             }
             c.alpha = alpha;
             c.eta = eta;
             c.strict_length = strict_length;
             c.span = span;
             c.seed = seed;
             return std::make_shared<SliceTable>(c);
           }),
           py::arg("capacity_steps"), py::arg("length"), py::arg("burn_in"), py::arg("sampler"), py::arg("alpha"),
           py::arg("eta"), py::arg("strict_length"), py::arg("span"), py::arg("seed"))
      .def("insert", &Insert, py::arg("fingerprint"), py::arg("chunks"), py::arg("steps"), py::arg("priorities"),
           py::arg("columns"))
      .def("sample", &Sample, py::arg("n"), py::arg("beta"), py::arg("copy_chunks") = false)
      .def("update", &Update, py::arg("keys"), py::arg("priorities"))
      .def("clear", &SliceTable::Clear)
      .def("save", &SliceTable::Save, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "Write every episode held (chunks, columns, step priorities) and the next episode number to path, "
           "checksummed and atomically; the table serves on while the file is written. Returns the episodes "
           "written; SnapshotError when the file cannot be written (an earlier file at path is kept).")
      .def("load", &SliceTable::Load, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "Fill this new table from a file save() wrote: the episodes keep their numbers (and so their window "
           "keys), their windows are this table's. SnapshotError on a truncated, corrupted or foreign file "
           "(nothing changed); ValueError if the table ever held an episode. Returns the episodes held.")
      .def("stats", &Stats)
      .def("windows",
           [](const SliceTable& t) {
             std::vector<uint64_t> keys;
             std::vector<double> masses;
             t.Windows(&keys, &masses);
             return py::make_tuple(py::array_t<uint64_t>(keys.size(), keys.data()),
                                   py::array_t<double>(masses.size(), masses.data()));
           })
      .def("step_priorities",
           [](const SliceTable& t, uint64_t episode) {
             const std::vector<double> p = t.StepPriorities(episode);
             return py::array_t<double>(p.size(), p.data());
           })
      .def("validate", &SliceTable::Validate);
}

}  // namespace apexrl::bindings
