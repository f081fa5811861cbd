// Registration entry points of the _core extension, one per binding file.
#ifndef APEXRL_BINDINGS_BINDINGS_H_
#define APEXRL_BINDINGS_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace apexrl::bindings {

void RegisterErrors(pybind11::module_& m);
void RegisterStore(pybind11::module_& m);

}  // namespace apexrl::bindings

#endif  // APEXRL_BINDINGS_BINDINGS_H_
