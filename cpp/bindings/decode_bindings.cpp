// DecodeLayout and decode_items: the native item decoder behind TransitionSpec.decode_into. Arguments are
// checked with the GIL held (types, shapes, every item inside the buffer, every output big enough); the
// decode itself runs with the GIL released, so several sampler threads decode batches side by side.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "apexrl/decode.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style>;
using ByteArray = py::array_t<uint8_t, py::array::c_style>;

DecodeLayout MakeLayout(uint32_t fingerprint, const std::vector<std::tuple<std::string, std::size_t, bool>>& fields,
                        std::string spec_repr) {
  DecodeLayout layout;
  layout.fingerprint = fingerprint;
  layout.spec_repr = std::move(spec_repr);
  for (const auto& [name, nbytes, compress] : fields) {
    if (nbytes > (std::size_t{64} << 20)) throw py::value_error("field '" + name + "': more than 64 MiB per item");
    layout.fields.push_back(DecodeField{name, nbytes, compress});
  }
  if (layout.fields.empty()) throw py::value_error("a decode layout needs at least one field");
  return layout;
}

void DecodeItemsPy(const DecodeLayout& layout, const py::array& data, const py::array& starts,
                   const py::array& sizes, const py::list& outs) {
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
      throw py::value_error("item " + std::to_string(i) + ": outside the " + std::to_string(buf_size) +
                            "-byte buffer");
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

}  // namespace

void RegisterDecode(py::module_& m) {
  py::class_<DecodeLayout>(m, "DecodeLayout",
                           "What the native decoder needs of a TransitionSpec (built by the spec; immutable).")
      .def(py::init(&MakeLayout), py::arg("fingerprint"), py::arg("fields"), py::arg("spec_repr"))
      .def_property_readonly("header_bytes", &DecodeLayout::HeaderBytes);
  m.def("decode_items", &DecodeItemsPy, py::arg("layout"), py::arg("data"), py::arg("starts"), py::arg("sizes"),
        py::arg("outs"),
        "Check and decode items [starts[i], starts[i] + sizes[i]) of data into outs (one C-contiguous array per "
        "field, rows of the field's bytes), with the GIL released. ValueError with TransitionSpec.decode's "
        "message on the first bad item.");
}

}  // namespace apexrl::bindings
