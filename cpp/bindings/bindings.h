// Registration entry points of the _core extension, one per binding file.
#ifndef APEXRL_BINDINGS_BINDINGS_H_
#define APEXRL_BINDINGS_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "apexrl/disk_table.h"
#include "apexrl/sharded_store.h"

namespace apexrl::bindings {

void RegisterErrors(pybind11::module_& m);
void RegisterStore(pybind11::module_& m);
void RegisterServe(pybind11::module_& m);
void RegisterDecode(pybind11::module_& m);
void RegisterSlices(pybind11::module_& m);

// The native store behind a PrioritizedStore object (TypeError if it is not one).
std::shared_ptr<ShardedStore> StoreOf(const pybind11::handle& store);
// The disk table behind a DiskTable object (TypeError if it is not one).
std::shared_ptr<DiskTable> DiskTableOf(const pybind11::handle& disk);

}  // namespace apexrl::bindings

#endif  // APEXRL_BINDINGS_BINDINGS_H_
