// The one place C++ exceptions become Python exceptions:
//   InvalidArgument (std::invalid_argument) -> ValueError      (pybind11's built-in translation)
//   SnapshotError                            -> apexrl.SnapshotError, a subclass of ValueError
//   StaleChunks                              -> apexrl._core.StaleChunksError, a subclass of ValueError
//   IoError                                  -> OSError
#include "apexrl/errors.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {

void RegisterErrors(py::module_& m) {
  py::register_exception<SnapshotError>(m, "SnapshotError", PyExc_ValueError);
  py::register_exception<StaleChunks>(m, "StaleChunksError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    }
  });
}

}  // namespace apexrl::bindings
