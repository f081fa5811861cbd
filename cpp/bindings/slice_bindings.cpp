// SliceTable (apexrl.replay.slices wraps it): arrays are checked and unpacked with the GIL held, the table's calls
// run with it released, and a sample's arrays view the C++ buffers, kept alive by a capsule owning them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/slices/slice_table.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

template <typename T>
py::array View(std::vector<T>& v, const py::capsule& base) {
  return py::array_t<T>({static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(T))}, v.data(), base);
}

uint64_t Insert(SliceTable& table, uint64_t fingerprint, const py::list& chunks, const U64Array& steps,
                const py::object& priorities) {
  const size_t m = chunks.size();
  if (steps.ndim() != 1 || static_cast<size_t>(steps.size()) != m) {
    throw InvalidArgument("steps must hold one count per chunk (" + std::to_string(m) + ")");
  }
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
  return table.Insert(fingerprint, data.data(), sizes.data(), steps.data(), m, pp);
}

py::dict Sample(SliceTable& table, size_t n, double beta) {
  auto out = std::make_unique<SliceSample>();
  {
    py::gil_scoped_release release;
    table.Sample(n, beta, out.get());
  }
  SliceSample* s = out.release();
  py::capsule base(s, [](void* p) { delete static_cast<SliceSample*>(p); });
  py::dict d;
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
  py::class_<SliceTable>(m, "SliceTable")
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
             return std::make_unique<SliceTable>(c);
           }),
           py::arg("capacity_steps"), py::arg("length"), py::arg("burn_in"), py::arg("sampler"), py::arg("alpha"),
           py::arg("eta"), py::arg("strict_length"), py::arg("span"), py::arg("seed"))
      .def("insert", &Insert, py::arg("fingerprint"), py::arg("chunks"), py::arg("steps"), py::arg("priorities"))
      .def("sample", &Sample, py::arg("n"), py::arg("beta"))
      .def("update", &Update, py::arg("keys"), py::arg("priorities"))
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
