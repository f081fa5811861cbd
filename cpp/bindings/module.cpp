// The private extension apexrl._core. It only registers; each area binds itself in its own file.
#include "bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "Native core of apexrl: the lock-sharded prioritized replay store and the replay server's serving loop "
      "and the transition decoder (use the apexrl package).";
  apexrl::bindings::RegisterErrors(m);
  apexrl::bindings::RegisterStore(m);
  apexrl::bindings::RegisterServe(m);
  apexrl::bindings::RegisterDecode(m);
  apexrl::bindings::RegisterSlices(m);
}
