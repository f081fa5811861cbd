// The replay server's serving loop (apexrl._core.ServeLoop) and, for tests that hold the native code to the
// Python definitions, its decoder, item check, rate limiter and insert window.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/serve/insert_window.h"
#include "apexrl/serve/item_check.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/serve_loop.h"
#include "apexrl/serve/wire.h"
#include "apexrl/serve/zmq_api.h"
#include "apexrl/slices/slice_table.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

using serve::ControlRequest;
using serve::LoopConfig;
using serve::ServeLoop;

std::string Bytes(const py::handle& obj) {
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request();
  return std::string(static_cast<const char*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
}

// Decodes a request as the loop does: (status, op, request_id, message); status 0 and the decoded op for a
// good request.
py::tuple Decode(const py::list& frames, uint64_t max_bytes) {
  std::vector<std::string> owned;
  for (const auto& f : frames) owned.push_back(Bytes(f));
  std::vector<serve::FrameView> views;
  serve::Message msg;
  for (size_t i = 0; i < owned.size() && i < serve::kMaxKeptFrames; ++i) {
    views.push_back({reinterpret_cast<const uint8_t*>(owned[i].data()), owned[i].size()});
  }
  for (const auto& s : owned) msg.total_bytes += s.size();
  msg.frames = views.data();
  msg.kept = views.size();
  msg.count = owned.size();
  serve::Request req;
  const serve::Refusal r = serve::Decode(msg, max_bytes, &req);
  if (r.ok()) return py::make_tuple(0, req.op, req.request_id, std::string());
  return py::make_tuple(static_cast<int>(r.status), r.op, r.request_id, r.message);
}

// The loop's tables from Python: a list of (name, store or SliceTable, limiter[, DiskTable or None]), limiter a
// dict with "kind"
// ("min_size", "sample_to_insert_ratio" or "queue") and that kind's numbers (min_size; samples_per_insert,
// min_size_to_sample, error_buffer; size).
std::vector<serve::TableSpec> TableSpecs(const py::object& tables) {
  std::vector<serve::TableSpec> out;
  for (const auto& item : tables) {
    const auto t = item.cast<py::tuple>();
    if (t.size() != 3 && t.size() != 4) throw InvalidArgument("a table is (name, store, limiter[, disk table])");
    serve::TableSpec spec;
    spec.name = t[0].cast<std::string>();
    if (py::isinstance<SliceTable>(t[1])) {
      spec.slices = t[1].cast<std::shared_ptr<SliceTable>>();
    } else {
      spec.store = StoreOf(t[1]);
    }
    if (t.size() == 4 && !t[3].is_none()) spec.disk = DiskTableOf(t[3]);
    const auto d = t[2].cast<py::dict>();
    const std::string kind = d["kind"].cast<std::string>();
    auto number = [&d](const char* key, double fallback) {
      return d.contains(key) && !d[key].is_none() ? d[key].cast<double>() : fallback;
    };
    // A count as an integer, read exactly over the whole documented range [0, 2^63 - 1] (through a double,
    // counts above 2^53 would round, so they were refused); an integral float is taken as its integer.
    auto count = [&](const char* key, uint64_t fallback) -> uint64_t {
      if (!d.contains(key) || d[key].is_none()) return fallback;
      py::object v = d[key];
      if (py::isinstance<py::float_>(v)) {
        const double x = v.cast<double>();
        if (!(x >= 0 && x < 9.2e18) || x != static_cast<double>(static_cast<uint64_t>(x))) {
          throw InvalidArgument("table '" + spec.name + "': " + key + " must be a count in [0, 2^63 - 1]");
        }
        return static_cast<uint64_t>(x);
      }
      if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v) || v < py::int_(0) || v > py::int_(INT64_MAX)) {
        throw InvalidArgument("table '" + spec.name + "': " + key + " must be a count in [0, 2^63 - 1]");
      }
      return v.cast<uint64_t>();
    };
    if (kind == "min_size") {
      spec.limiter.kind = serve::LimiterKind::kMinSize;
      spec.limiter.min_size = count("min_size", 1);
    } else if (kind == "sample_to_insert_ratio") {
      spec.limiter.kind = serve::LimiterKind::kSampleToInsertRatio;
      spec.limiter.spi = number("samples_per_insert", 0);
      spec.limiter.eb = number("error_buffer", 0);
      spec.limiter.min_size = count("min_size_to_sample", 1);
    } else if (kind == "queue") {
      spec.limiter.kind = serve::LimiterKind::kQueue;
      spec.limiter.queue_size = count("size", 0);
    } else {
      throw InvalidArgument("table '" + spec.name + "': unknown rate limiter kind '" + kind +
                            "' (min_size, sample_to_insert_ratio or queue)");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

void RegisterServe(py::module_& m) {
  py::class_<ServeLoop>(m, "ServeLoop", R"doc(
The replay server's request path (cpp/apexrl/serve/serve_loop.h). Built over a configured zmq ROUTER socket
(its address, Socket.underlying) and the path of the libzmq that pyzmq loaded; from start() to the end of
stop() only the loop's thread touches the socket. HELLO and STATS come to Python through next_control() and
go back through control_reply(). Use apexrl.replay.server.ReplayServer.)doc")
      .def(py::init([](uintptr_t socket, const std::string& libzmq, const py::object& store, uint64_t max_bytes,
                       uint64_t max_reply_bytes, uint32_t workers, uint64_t inline_sample_max, double max_wait_s,
                       uint64_t max_waiting, uint64_t max_waiting_per_peer, uint64_t max_waiting_bytes,
                       uint64_t max_unread_bytes, double samples_per_insert, double error_buffer,
                       uint64_t min_size_to_sample, uint64_t dedup_max_ids, uint64_t dedup_max_bytes,
                       std::map<std::string, uint32_t> role_ops, const py::object& tables) {
             LoopConfig c;
             c.max_bytes = max_bytes;
             c.max_reply_bytes = max_reply_bytes;
             c.workers = workers;
             c.inline_sample_max = inline_sample_max;
             c.max_wait_s = max_wait_s;
             c.max_waiting = max_waiting;
             c.max_waiting_per_peer = max_waiting_per_peer;
             c.max_waiting_bytes = max_waiting_bytes;
             c.max_unread_bytes = max_unread_bytes;
             c.samples_per_insert = samples_per_insert;
             c.error_buffer = error_buffer;
             c.min_size_to_sample = min_size_to_sample;
             c.dedup_max_ids = dedup_max_ids;
             c.dedup_max_bytes = dedup_max_bytes;
             c.role_ops = std::move(role_ops);
             serve::ZmqApi api;
             try {
               api = serve::ZmqApi::Bind(libzmq);
             } catch (const std::runtime_error& e) {
               throw py::import_error(e.what());
             }
             if (tables.is_none()) {
               return std::make_unique<ServeLoop>(api, reinterpret_cast<void*>(socket), StoreOf(store), std::move(c));
             }
             return std::make_unique<ServeLoop>(api, reinterpret_cast<void*>(socket), TableSpecs(tables), std::move(c));
           }),
           py::arg("socket"), py::arg("libzmq"), py::arg("store"), py::kw_only(), py::arg("max_bytes"),
           py::arg("max_reply_bytes"), py::arg("workers"), py::arg("inline_sample_max"), py::arg("max_wait_s"),
           py::arg("max_waiting"), py::arg("max_waiting_per_peer"), py::arg("max_waiting_bytes"),
           py::arg("max_unread_bytes"), py::arg("samples_per_insert"), py::arg("error_buffer"),
           py::arg("min_size_to_sample"), py::arg("dedup_max_ids"), py::arg("dedup_max_bytes"),
           py::arg("role_ops") = std::map<std::string, uint32_t>{}, py::arg("tables") = py::none())
      .def("start", &ServeLoop::Start)
      .def("stop", &ServeLoop::Stop, py::call_guard<py::gil_scoped_release>())
      .def(
          "next_control",
          [](ServeLoop& loop, double timeout_s) -> py::object {
            ControlRequest c;
            bool closed = false, got;
            {
              py::gil_scoped_release release;
              got = loop.NextControl(timeout_s, &c, &closed);
            }
            if (!got) return closed ? py::object(py::str("closed")) : py::object(py::none());
            py::list frames;
            for (const auto& f : c.frames) frames.append(py::bytes(f));
            return py::make_tuple(py::bytes(c.peer), c.identity, c.op, frames);
          },
          py::arg("timeout_s"),
          "(peer, identity, op, frames) of the next HELLO/STATS, or (b'', LEVEL, 0, [text]) of a line to log; None "
          "after timeout_s; 'closed' once the loop has stopped and nothing is left")
      .def(
          "control_reply",
          [](ServeLoop& loop, const py::bytes& peer, const py::list& frames) {
            std::vector<std::string> out;
            for (const auto& f : frames) out.push_back(Bytes(f));
            loop.ControlReply(std::string(peer), std::move(out));
          },
          py::arg("peer"), py::arg("frames"))
      .def(
          "set_layout",
          [](ServeLoop& loop, const ItemLayout& layout, const py::object& table) {
            if (table.is_none()) {
              loop.SetLayout(layout);
            } else {
              loop.SetLayout(table.cast<uint32_t>(), layout);
            }
          },
          py::arg("layout"), py::arg("table") = py::none(),
          "the item layout a table's inserts are checked against (table: its index; None: the table `default`)")
      .def_property_readonly("num_tables", &ServeLoop::num_tables)
      .def("stats", [](const ServeLoop& loop) {
        py::dict d;
        for (const auto& s : loop.Stats()) {
          if (s.integer) {
            d[py::str(s.name)] = py::int_(static_cast<long long>(s.value));
          } else {
            d[py::str(s.name)] = py::float_(s.value);
          }
        }
        return d;
      });

  // ------------------------------------------------------------------ the pieces, for tests against Python
  m.def("serve_decode", &Decode, py::arg("frames"), py::arg("max_bytes") = 0,
        "(status, op, request_id, message) the serving loop's decoder gives a request");
  m.def(
      "serve_first_bad_item",
      [](const ItemLayout& layout, const py::object& data, const py::object& offsets) -> py::object {
        const std::string d = Bytes(data), o = Bytes(offsets);
        if (o.size() % 8 != 0 || o.size() < 8) throw InvalidArgument("offsets must be n + 1 >= 1 u64 values");
        auto why = FirstBadItem(layout, reinterpret_cast<const uint8_t*>(d.data()),
                                ItemSpans::Offsets(reinterpret_cast<const uint8_t*>(o.data()), o.size() / 8 - 1));
        if (!why) return py::none();
        return py::str(*why);
      },
      "the message naming the first bad item of a batch (offsets already valid), or None");
  m.def(
      "serve_plan",
      [] {
        py::list header;
        for (const auto& f : serve::kHeaderFields) header.append(py::make_tuple(f.name, f.offset, f.size));
        py::dict requests;
        for (uint16_t op = 1; op <= serve::kMaxReplayOp; ++op) {
          const serve::RequestPlan plan = serve::PlanOf(op);
          if (plan.frames == 0) continue;
          py::list frames;
          for (size_t k = 0; k + 1 < plan.frames; ++k) {
            const serve::FramePlan& f = plan.frame[k];
            py::object length = py::none();
            switch (f.length) {
              case serve::FramePlan::kN:
                length = py::str("n");
                break;
              case serve::FramePlan::kNPlus1:
                length = py::str("n+1");
                break;
              case serve::FramePlan::kAny:
                length = py::str("any");
                break;
              case serve::FramePlan::kFixed:
                length = py::int_(f.fixed);
                break;
              case serve::FramePlan::kUnsized:
                break;
            }
            py::object rule = f.rule ? py::object(py::str(f.rule)) : py::object(py::none());
            frames.append(py::make_tuple(f.name, f.type, length, rule));
          }
          py::dict d;
          d["frames"] = frames;
          d["count"] = plan.count_used ? py::object(py::str("n")) : py::object(py::none());
          d["count_min"] = plan.count_min;
          d["param"] = plan.beta ? py::object(py::str("beta")) : py::object(py::none());
          d["timeout_ms"] = plan.timeout;
          requests[py::str(serve::OpName(op))] = d;
        }
        py::dict d;
        d["HEADER"] = header;
        d["REQUESTS"] = requests;
        return d;
      },
      "the serving loop's wire plan (serve/wire.h): the header's fields as (name, offset, size) and, per data op, "
      "its request's frames as (name, type, length, rule) and its use of count, param and timeout_ms");
  m.def("serve_constants", [] {
    py::dict d;
    d["MAGIC"] = py::bytes(serve::kMagic, 4);
    d["PROTOCOL_VERSION"] = serve::kProtocolVersion;
    d["HEADER_SIZE"] = serve::kHeaderSize;
    d["MAX_BATCH"] = serve::kMaxBatch;
    d["MAX_ERROR_MESSAGE"] = serve::kMaxErrorMessage;
    py::dict ops, statuses;
    for (uint16_t op = 1; op <= serve::kMaxReplayOp; ++op) ops[py::str(serve::OpName(op))] = op;
    d["OPS"] = ops;
    d["MAX_STATUS"] = serve::kMaxStatus;
    return d;
  });
  m.def("serve_deadlock_reason", &serve::DeadlockReason, py::arg("n"), py::arg("m"), py::arg("spi"), py::arg("eb"));

  py::class_<serve::RateLimiter>(m, "NativeRateLimiter", "The serving loop's rate limiter (tests).")
      .def(py::init([](const py::object& spi, double eb, uint64_t min_size) {
             return std::make_unique<serve::RateLimiter>(spi.is_none() ? 0.0 : spi.cast<double>(), eb, min_size);
           }),
           py::arg("spi"), py::arg("eb"), py::arg("min_size"))
      .def("big_enough", &serve::RateLimiter::BigEnough)
      .def("insert_ok", &serve::RateLimiter::InsertOk)
      .def("sample_ok", &serve::RateLimiter::SampleOk)
      .def("try_insert", &serve::RateLimiter::TryInsert)
      .def("try_sample", &serve::RateLimiter::TrySample)
      .def("undo", &serve::RateLimiter::Undo, py::arg("inserted") = 0, py::arg("sampled") = 0)
      .def("never_admitted", [](const serve::RateLimiter& rl, uint16_t op, uint64_t n,
                                uint64_t size) { return rl.NeverAdmitted(op, n, size); })
      .def("counts",
           [](const serve::RateLimiter& rl) {
             uint64_t i, s;
             rl.Counts(&i, &s);
             return py::make_tuple(i, s);
           })
      .def("describe", &serve::RateLimiter::Describe);

  py::class_<serve::InsertWindow>(m, "NativeInsertWindow", "The serving loop's exactly-once insert window (tests).")
      .def(py::init<uint64_t, uint64_t>(), py::arg("max_ids"), py::arg("max_bytes"))
      .def("claim",
           [](serve::InsertWindow& w, const std::string& identity, uint64_t session, uint64_t sequence, uint64_t owner,
              double deadline, double now) -> py::object {
             std::vector<Key> keys;
             switch (w.TryClaim(serve::InsertId{identity, session, sequence}, owner, deadline, now, &keys)) {
               case serve::InsertWindow::Claim::kDone:
                 return py::make_tuple("done", keys);
               case serve::InsertWindow::Claim::kBusy:
                 return py::make_tuple("busy", py::none());
               default:
                 return py::make_tuple("new", py::none());
             }
           })
      .def("release", [](serve::InsertWindow& w, const std::string& identity, uint64_t session, uint64_t sequence,
                         uint64_t owner) { w.Release(serve::InsertId{identity, session, sequence}, owner); })
      .def("finish",
           [](serve::InsertWindow& w, const std::string& identity, uint64_t session, uint64_t sequence, uint64_t owner,
              const std::vector<Key>& keys) {
             w.Finish(serve::InsertId{identity, session, sequence}, owner, keys.data(), keys.size());
           })
      .def("stats", [](const serve::InsertWindow& w) {
        const auto s = w.Stats();
        py::dict d;
        d["duplicate_inserts"] = s.duplicates;
        d["insert_ids_remembered"] = s.remembered;
        d["insert_ids_forgotten"] = s.forgotten;
        d["insert_ids_bytes"] = s.bytes;
        d["insert_ids_pending"] = s.pending;
        return d;
      });
}

}  // namespace apexrl::bindings
