// PrioritizedStore and SampleBatch. Inputs are validated and unpacked with the GIL held; the store call
// itself runs with the GIL released (it touches no Python object); results become numpy arrays that view
// the C++ buffers without copying, kept alive by a capsule owning the SampleResult.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/eviction/kinds.h"
#include "apexrl/sampling/kinds.h"
#include "apexrl/sharded_store.h"
#include "bindings.h"

namespace py = pybind11;

namespace apexrl::bindings {
namespace {

std::string ShapeOf(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string TypeName(const py::handle& h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// A 1-D numpy view of `obj` as contiguous T. Accepts any array-like whose dtype kind is in `kinds`
// ('f' float, 'i' signed, 'u' unsigned); everything else is a ValueError naming the argument.
template <typename T>
py::array_t<T, py::array::c_style> As1D(const py::handle& obj, const char* name, const char* kinds) {
  py::array a = py::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + " must be a 1-D array, got " + TypeName(obj));
  }
  if (a.ndim() != 1) throw InvalidArgument(std::string(name) + " must be 1-D, got shape " + ShapeOf(a));
  const char kind = a.dtype().kind();
  if (a.size() > 0 && std::strchr(kinds, kind) == nullptr) {
    throw InvalidArgument(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + "; expected " +
                          (std::strchr(kinds, 'f') ? "a float" : "an unsigned integer") + " array");
  }
  if (kind == 'i' && a.size() > 0) {  // signed keys: refuse negatives rather than wrap them around
    auto i64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    const int64_t* p = i64.data();
    for (py::ssize_t i = 0; i < i64.size(); ++i) {
      if (p[i] < 0 && std::is_unsigned_v<T>) {
        throw InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] is negative: " + std::to_string(p[i]));
      }
    }
  }
  return py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
}

int64_t AsInt(const py::handle& obj, const char* name) {
  if (py::isinstance<py::bool_>(obj) || !py::isinstance<py::int_>(obj)) {
    // numpy integers are accepted through __index__
    if (!PyIndex_Check(obj.ptr()) || py::isinstance<py::bool_>(obj)) {
      throw InvalidArgument(std::string(name) + " must be an integer, got " + TypeName(obj));
    }
  }
  const long long v = PyLong_AsLongLong(obj.ptr());
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + " is out of range: " + std::string(py::str(obj)));
  }
  return v;
}

double AsFloat(const py::handle& obj, const char* name) {
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + " must be a number, got " + TypeName(obj));
  }
  return v;
}

uint32_t AsEpoch(const py::object& epoch) {
  const int64_t e = AsInt(epoch, "epoch");
  if (e < 1 || e > static_cast<int64_t>(kMaxEpoch)) {
    throw InvalidArgument("epoch must be in [1, " + std::to_string(kMaxEpoch) + "], got " + std::to_string(e));
  }
  return static_cast<uint32_t>(e);
}

// Whether a buffer exports Python object pointers: numpy says so itself (dtype.hasobject, structured dtypes
// included); other exporters through the struct-module format, where 'O' is the object code (field names,
// between colons, are skipped).
bool HoldsObjects(const py::handle& obj, const char* format) {
  if (py::isinstance<py::array>(obj))
    return py::reinterpret_borrow<py::array>(obj).dtype().attr("hasobject").cast<bool>();
  if (format == nullptr) return false;
  bool in_name = false;
  for (const char* c = format; *c != '\0'; ++c) {
    if (*c == ':')
      in_name = !in_name;
    else if (!in_name && *c == 'O')
      return true;
  }
  return false;
}

// Holds the buffers of the items being inserted for the duration of the call (PEP 3118 exports are
// released with the GIL held, in the destructor).
class ItemBuffers {
 public:
  std::vector<const uint8_t*> data;
  std::vector<uint64_t> sizes;

  void Add(const py::handle& obj, const std::string& what) {
    auto view = std::make_unique<Py_buffer>();
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      throw InvalidArgument(what + " must be a C-contiguous bytes-like object, got " + TypeName(obj));
    }
    // An object array exports its PyObject pointers: storing them would store addresses, not data.
    if (HoldsObjects(obj, view->format)) {
      const std::string format = view->format != nullptr ? view->format : "";
      PyBuffer_Release(view.get());
      throw InvalidArgument(what + " holds Python objects (buffer format '" + format +
                            "'), not data; pass bytes or a numeric array");
    }
    views_.push_back(std::move(view));
    data.push_back(static_cast<const uint8_t*>(views_.back()->buf));
    sizes.push_back(static_cast<uint64_t>(views_.back()->len));
  }
  ~ItemBuffers() {
    for (auto& v : views_) PyBuffer_Release(v.get());
  }

 private:
  std::vector<std::unique_ptr<Py_buffer>> views_;
};

// Unpacks `items` into (pointer, size) pairs without copying. Accepted forms:
//   * a sequence of bytes-like objects (bytes, bytearray, memoryview, contiguous numpy arrays);
//   * a numpy array with n rows: row i is item i (fixed-size items);
//   * a contiguous bytes-like buffer plus `offsets` (n + 1 non-decreasing integers): item i is
//     buffer[offsets[i]:offsets[i+1]].
void UnpackItems(const py::handle& items, const py::handle& offsets, size_t n, ItemBuffers* out) {
  out->data.reserve(n);
  out->sizes.reserve(n);
  if (!offsets.is_none()) {
    out->Add(items, "items (with offsets)");
    const uint64_t buffer_len = out->sizes[0];
    const uint8_t* base = out->data[0];
    out->data.clear();
    out->sizes.clear();
    auto off = As1D<uint64_t>(offsets, "offsets", "iu");
    if (static_cast<size_t>(off.size()) != n + 1) {
      throw InvalidArgument("offsets must hold len(priorities) + 1 = " + std::to_string(n + 1) + " entries, got " +
                            std::to_string(off.size()));
    }
    const uint64_t* o = off.data();
    for (size_t i = 0; i < n; ++i) {
      if (o[i + 1] < o[i]) {
        throw InvalidArgument("offsets must not decrease: offsets[" + std::to_string(i + 1) +
                              "] = " + std::to_string(o[i + 1]) + " < offsets[" + std::to_string(i) +
                              "] = " + std::to_string(o[i]));
      }
    }
    if (n > 0 && o[n] > buffer_len) {
      throw InvalidArgument("offsets[-1] = " + std::to_string(o[n]) + " is past the end of the " +
                            std::to_string(buffer_len) + "-byte buffer");
    }
    for (size_t i = 0; i < n; ++i) {
      out->data.push_back(base + o[i]);
      out->sizes.push_back(o[i + 1] - o[i]);
    }
    return;
  }
  if (py::isinstance<py::array>(items)) {
    auto a = py::reinterpret_borrow<py::array>(items);
    if (a.ndim() < 2) {
      throw InvalidArgument("items as an array must have one row per item (ndim >= 2), got shape " + ShapeOf(a) +
                            "; pass a buffer with offsets= for variable-size items");
    }
    if (static_cast<size_t>(a.shape(0)) != n) {
      throw InvalidArgument("items has " + std::to_string(a.shape(0)) + " rows but priorities has " +
                            std::to_string(n) + " entries");
    }
    out->Add(items, "items");
    const uint8_t* base = out->data[0];
    const uint64_t row = n > 0 ? out->sizes[0] / n : 0;
    out->data.clear();
    out->sizes.clear();
    for (size_t i = 0; i < n; ++i) {
      out->data.push_back(base + i * row);
      out->sizes.push_back(row);
    }
    return;
  }
  if (py::isinstance<py::bytes>(items) || py::isinstance<py::str>(items) || !py::isinstance<py::sequence>(items)) {
    throw InvalidArgument("items must be a sequence of bytes-like objects (or a buffer with offsets=), got " +
                          TypeName(items));
  }
  auto seq = py::reinterpret_borrow<py::sequence>(items);
  if (static_cast<size_t>(seq.size()) != n) {
    throw InvalidArgument("items has " + std::to_string(seq.size()) + " entries but priorities has " +
                          std::to_string(n));
  }
  for (size_t i = 0; i < n; ++i) out->Add(seq[i], "items[" + std::to_string(i) + "]");
}

// Wraps a vector owned by `owner` as a 1-D numpy array without copying.
template <typename T>
py::array View(const std::shared_ptr<SampleResult>& owner, const T* data, size_t n) {
  auto* keep = new std::shared_ptr<SampleResult>(owner);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<SampleResult>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(sizeof(T))}, data, base);
}

// A sampled batch: numpy views of one SampleResult.
class PySampleBatch {
 public:
  explicit PySampleBatch(std::shared_ptr<SampleResult> r)
      : size_(r->keys.size()), total_mass_(r->total_mass), min_mass_(r->min_mass), store_size_(r->size) {
    keys_ = View(r, r->keys.data(), r->keys.size());
    weights_ = View(r, r->weights.data(), r->weights.size());
    probabilities_ = View(r, r->probabilities.data(), r->probabilities.size());
    offsets_ = View(r, r->offsets.data(), r->offsets.size());
    data_ = View(r, r->data.data(), r->data.size());
    item_chunk_offsets_ = View(r, r->item_chunk_offsets.data(), r->item_chunk_offsets.size());
    item_chunks_ = View(r, r->item_chunks.data(), r->item_chunks.size());
    chunk_data_ = View(r, r->chunk_data.data(), r->chunk_data.size());
    chunk_offsets_ = View(r, r->chunk_offsets.data(), r->chunk_offsets.size());
  }
  py::array item_chunk_offsets() const { return item_chunk_offsets_; }
  py::array item_chunks() const { return item_chunks_; }
  py::array chunk_data() const { return chunk_data_; }
  py::array chunk_offsets() const { return chunk_offsets_; }
  // One bytes object per chunk.
  py::list chunks() const {
    const auto* o = static_cast<const uint64_t*>(chunk_offsets_.data());
    const auto* d = static_cast<const char*>(chunk_data_.data());
    const size_t c = static_cast<size_t>(chunk_offsets_.size()) - 1;
    py::list out(c);
    for (size_t i = 0; i < c; ++i) out[i] = py::bytes(d + o[i], static_cast<size_t>(o[i + 1] - o[i]));
    return out;
  }
  size_t size() const { return size_; }
  py::array keys() const { return keys_; }
  py::array weights() const { return weights_; }
  py::array probabilities() const { return probabilities_; }
  py::array data() const { return data_; }
  py::array offsets() const { return offsets_; }
  double total_mass() const { return total_mass_; }
  double min_mass() const { return min_mass_; }
  uint64_t store_size() const { return store_size_; }
  // One read-only memoryview per item, each a slice of `data` (keeps the batch's memory alive).
  py::object items() {
    if (!items_) {
      py::list out(size_);
      py::object whole = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(data_.ptr()));
      if (!whole) throw py::error_already_set();
      whole = whole.attr("toreadonly")();
      const auto* o = static_cast<const uint64_t*>(offsets_.data());
      for (size_t i = 0; i < size_; ++i) {
        py::slice sl(static_cast<py::ssize_t>(o[i]), static_cast<py::ssize_t>(o[i + 1]), 1);
        out[i] = whole[sl];
      }
      items_ = out;
    }
    return items_;
  }

 private:
  size_t size_;
  double total_mass_, min_mass_;
  uint64_t store_size_;
  py::array keys_, weights_, probabilities_, data_, offsets_;
  py::array item_chunk_offsets_, item_chunks_, chunk_data_, chunk_offsets_;
  py::object items_;  // built on first access
};

class PyStore {
 public:
  explicit PyStore(std::shared_ptr<ShardedStore> store) : store_(std::move(store)) {}
  // A disk table's store (its items' bytes are where they lie in the log): read through `disk`, never changed here.
  PyStore(std::shared_ptr<ShardedStore> store, std::shared_ptr<DiskTable> disk)
      : store_(std::move(store)), disk_(std::move(disk)) {}

  static std::unique_ptr<PyStore> Create(const py::object& capacity, const py::object& alpha, const py::object& shards,
                                         const std::string& eviction, const py::object& alpha_evict,
                                         const py::object& seed, const py::object& max_size, const py::object& epoch,
                                         const std::string& sampler, const py::object& max_times_sampled) {
    return std::make_unique<PyStore>(std::make_unique<ShardedStore>(
        Config(capacity, alpha, shards, eviction, alpha_evict, seed, max_size, epoch, sampler, max_times_sampled)));
  }

  // The store configuration of the constructor's arguments (InvalidArgument naming a bad one).
  static StoreConfig Config(const py::object& capacity, const py::object& alpha, const py::object& shards,
                            const std::string& eviction, const py::object& alpha_evict, const py::object& seed,
                            const py::object& max_size, const py::object& epoch, const std::string& sampler,
                            const py::object& max_times_sampled) {
    StoreConfig c;
    const int64_t cap = AsInt(capacity, "capacity");
    if (cap < 1) throw InvalidArgument("capacity must be >= 1, got " + std::to_string(cap));
    c.capacity = static_cast<uint64_t>(cap);
    c.alpha = AsFloat(alpha, "alpha");
    const int64_t s = AsInt(shards, "shards");
    if (s < 1 || s > static_cast<int64_t>(kMaxShards)) {
      throw InvalidArgument("shards must be in [1, " + std::to_string(kMaxShards) + "], got " + std::to_string(s));
    }
    c.shards = static_cast<uint32_t>(s);
    c.eviction = ParseEvictionKind(eviction);
    c.alpha_evict = AsFloat(alpha_evict, "alpha_evict");
    const int64_t sd = AsInt(seed, "seed");
    if (sd < 0) throw InvalidArgument("seed must be >= 0, got " + std::to_string(sd));
    c.seed = static_cast<uint64_t>(sd);
    if (!max_size.is_none()) {
      const int64_t ms = AsInt(max_size, "max_size");
      if (ms < cap) {
        throw InvalidArgument("max_size must be >= capacity = " + std::to_string(cap) + ", got " + std::to_string(ms));
      }
      c.max_size = static_cast<uint64_t>(ms);
    }
    c.epoch = AsEpoch(epoch);
    c.sampler = ParseSamplerKind(sampler);
    const int64_t mts = AsInt(max_times_sampled, "max_times_sampled");
    if (mts < 0 || mts > static_cast<int64_t>(UINT32_MAX)) {
      throw InvalidArgument("max_times_sampled must be in [0, 4294967295] (0: no limit), got " + std::to_string(mts));
    }
    c.max_times_sampled = static_cast<uint32_t>(mts);
    return c;
  }

  py::object Insert(const py::object& priorities, const py::object& items, const py::object& offsets,
                    const py::object& chunks, const py::object& item_chunks, const py::object& item_chunk_offsets,
                    bool return_chunk_keys) {
    if (disk_) throw InvalidArgument("a table on disk takes its inserts through the serving loop, which logs them");
    auto prio = As1D<double>(priorities, "priorities", "fiu");
    const size_t n = static_cast<size_t>(prio.size());
    if (n > kMaxBatchItems) {  // before unpacking n items
      throw InvalidArgument("cannot insert " + std::to_string(n) + " items in one call; the limit is " +
                            std::to_string(kMaxBatchItems) + " (split the call)");
    }
    ItemBuffers buffers;
    UnpackItems(items, offsets, n, &buffers);
    const bool with_chunks = !chunks.is_none();
    if (with_chunks == item_chunk_offsets.is_none() || item_chunks.is_none() != item_chunk_offsets.is_none()) {
      throw InvalidArgument("chunks, item_chunks and item_chunk_offsets go together: pass all three or none");
    }
    ItemBuffers chunk_buffers;
    ChunkBatch batch;
    py::array_t<uint64_t, py::array::c_style> refs;
    py::array_t<uint64_t, py::array::c_style> ref_offsets;
    py::array_t<uint64_t> chunk_keys(0);
    if (with_chunks) {
      if (py::isinstance<py::bytes>(chunks) || py::isinstance<py::str>(chunks) ||
          !py::isinstance<py::sequence>(chunks)) {
        throw InvalidArgument("chunks must be a sequence of bytes-like objects, got " + TypeName(chunks));
      }
      auto seq = py::reinterpret_borrow<py::sequence>(chunks);
      if (static_cast<uint64_t>(seq.size()) > kMaxBatchItems) {
        throw InvalidArgument("cannot insert " + std::to_string(seq.size()) + " chunks in one call; the limit is " +
                              std::to_string(kMaxBatchItems));
      }
      for (size_t c = 0; c < static_cast<size_t>(seq.size()); ++c) {
        chunk_buffers.Add(seq[c], "chunks[" + std::to_string(c) + "]");
      }
      ref_offsets = As1D<uint64_t>(item_chunk_offsets, "item_chunk_offsets", "iu");
      if (static_cast<size_t>(ref_offsets.size()) != n + 1) {
        throw InvalidArgument("item_chunk_offsets must hold len(priorities) + 1 = " + std::to_string(n + 1) +
                              " entries, got " + std::to_string(ref_offsets.size()));
      }
      auto raw = As1D<uint64_t>(item_chunks, "item_chunks", "iu");
      const uint64_t* o = ref_offsets.data();
      for (size_t i = 0; i < n; ++i) {
        if (o[i + 1] < o[i]) throw InvalidArgument("item_chunk_offsets must not decrease");
      }
      if (o[0] != 0 || o[n] != static_cast<uint64_t>(raw.size())) {
        throw InvalidArgument("item_chunk_offsets must run from 0 to len(item_chunks) = " + std::to_string(raw.size()));
      }
      refs = raw;  // a signed array's negative values wrap to huge ones: not a chunk key, refused by the store
      batch.data = chunk_buffers.data.data();
      batch.sizes = chunk_buffers.sizes.data();
      batch.count = chunk_buffers.data.size();
      chunk_keys = py::array_t<uint64_t>(static_cast<py::ssize_t>(batch.count));
      batch.chunk_keys = chunk_keys.mutable_data();
      batch.item_chunks = refs.data();
      batch.item_chunk_offsets = o;
    }
    py::array_t<uint64_t> keys(static_cast<py::ssize_t>(n));
    const double* p = prio.data();
    Key* k = keys.mutable_data();
    {
      py::gil_scoped_release release;  // safe: only raw pointers into buffers this frame keeps alive
      store_->Insert(p, buffers.data.data(), buffers.sizes.data(), n, k, with_chunks ? &batch : nullptr);
    }
    if (return_chunk_keys) return py::make_tuple(keys, chunk_keys);
    return std::move(keys);
  }

  PySampleBatch Sample(const py::object& n, const py::object& beta) {
    const int64_t count = AsInt(n, "n");
    if (count < 1) throw InvalidArgument("n must be >= 1, got " + std::to_string(count));
    if (static_cast<uint64_t>(count) > kMaxBatchItems) {  // before any allocation for n draws
      throw InvalidArgument("n = " + std::to_string(count) + " is above the limit of " +
                            std::to_string(kMaxBatchItems) + " items per sample call");
    }
    const double b = AsFloat(beta, "beta");
    auto result = std::make_shared<SampleResult>();
    {
      py::gil_scoped_release release;
      store_->Sample(static_cast<size_t>(count), b, result.get());
      if (disk_) disk_->ReadItems(result.get());
    }
    return PySampleBatch(std::move(result));
  }

  size_t UpdatePriorities(const py::object& keys, const py::object& priorities) {
    auto k = As1D<uint64_t>(keys, "keys", "iu");
    auto p = As1D<double>(priorities, "priorities", "fiu");
    if (k.size() != p.size()) {
      throw InvalidArgument("keys and priorities differ in length: " + std::to_string(k.size()) + " vs " +
                            std::to_string(p.size()));
    }
    py::gil_scoped_release release;
    return store_->UpdatePriorities(k.data(), p.data(), static_cast<size_t>(k.size()));
  }

  size_t Erase(const py::object& keys) {
    auto k = As1D<uint64_t>(keys, "keys", "iu");
    py::gil_scoped_release release;
    return store_->Erase(k.data(), static_cast<size_t>(k.size()));
  }

  size_t RemoveToFit() {
    py::gil_scoped_release release;
    return store_->RemoveToFit();
  }

  py::dict Stats() const {
    StoreStats s;
    double total, min_mass;
    {
      py::gil_scoped_release release;
      s = store_->Stats();
      total = store_->TotalMass();
      min_mass = store_->MinMass();
    }
    py::dict d;
    d["size"] = s.size;
    d["capacity"] = store_->config().capacity;
    d["shards"] = store_->config().shards;
    d["bytes_held"] = s.bytes_held;
    d["chunks"] = s.chunks;
    d["chunk_bytes"] = s.chunk_bytes;
    d["bytes_reserved"] = s.bytes_reserved;
    d["total_priority"] = total;
    d["min_mass"] = min_mass;
    d["inserted"] = s.inserted;
    d["sampled"] = s.sampled;
    d["sample_calls"] = s.sample_calls;
    d["updated"] = s.updated;
    d["stale_updates"] = s.stale_updates;
    d["evicted"] = s.evicted;
    d["erased"] = s.erased;
    d["remove_to_fit_calls"] = s.remove_to_fit_calls;
    d["removed_by_sampling"] = s.removed_by_sampling;
    d["max_size"] = store_->config().max_size;
    d["epoch"] = store_->config().epoch;
    return d;
  }

  void Save(const std::string& path) const {
    if (disk_) {
      throw InvalidArgument("a table on disk is not saved in snapshots: its items are in its log at '" +
                            disk_->options().path + "'");
    }
    py::gil_scoped_release release;
    store_->Save(path);
  }
  static std::unique_ptr<PyStore> Load(const std::string& path, const py::object& epoch) {
    std::unique_ptr<ShardedStore> s;
    const uint32_t e = epoch.is_none() ? 0 : AsEpoch(epoch);
    {
      py::gil_scoped_release release;
      s = e == 0 ? ShardedStore::Load(path) : ShardedStore::Load(path, e);
    }
    return std::make_unique<PyStore>(std::move(s));
  }
  static uint32_t SnapshotEpoch(const std::string& path) {
    py::gil_scoped_release release;
    return ShardedStore::SnapshotEpoch(path);
  }
  static uint32_t SnapshotVersion(const std::string& path) {
    py::gil_scoped_release release;
    return ShardedStore::SnapshotVersion(path);
  }
  // Every live item, oldest first across the shards, and the chunks they reference (see "contents" below).
  py::dict Contents() const {
    std::vector<Shard::Contents> shards;
    {
      py::gil_scoped_release release;
      shards = store_->Dump();
      for (Shard::Contents& c : shards) {
        for (size_t i = 0; disk_ && i < c.keys.size(); ++i) {
          c.items[i] =
              disk_->ReadItem(c.keys[i], reinterpret_cast<const uint8_t*>(c.items[i].data()), c.items[i].size());
        }
      }
    }
    struct Row {
      uint64_t seq;
      size_t shard, index;
    };
    std::vector<Row> rows;
    std::vector<std::vector<uint64_t>> chunk_index(shards.size());  // per shard: chunk id -> index in `chunks`
    py::list chunks;
    for (size_t s = 0; s < shards.size(); ++s) {
      const Shard::Contents& c = shards[s];
      for (size_t i = 0; i < c.keys.size(); ++i) rows.push_back({c.seqs[i], s, i});
      const uint32_t max_id = c.chunk_ids.empty() ? 0 : c.chunk_ids.back() + 1;
      chunk_index[s].assign(max_id, 0);
      for (size_t j = 0; j < c.chunk_ids.size(); ++j) {
        chunk_index[s][c.chunk_ids[j]] = py::len(chunks);
        chunks.append(py::bytes(c.chunks[j]));
      }
    }
    // Insertion numbers are store-wide: one order across the shards (stable: equal ones keep shard order).
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.seq < b.seq; });
    const size_t n = rows.size();
    py::array_t<uint64_t> keys(n), seqs(n), offsets(n + 1);
    py::array_t<double> priorities(n);
    uint64_t bytes = 0;
    for (const Row& r : rows) bytes += shards[r.shard].items[r.index].size();
    py::array_t<uint8_t> data(bytes);
    py::list item_chunks;
    auto k = keys.mutable_unchecked<1>();
    auto q = seqs.mutable_unchecked<1>();
    auto o = offsets.mutable_unchecked<1>();
    auto p = priorities.mutable_unchecked<1>();
    uint8_t* out = data.mutable_data();
    o(0) = 0;
    for (size_t i = 0; i < n; ++i) {
      const Shard::Contents& c = shards[rows[i].shard];
      const size_t j = rows[i].index;
      k(i) = c.keys[j];
      q(i) = c.seqs[j];
      p(i) = c.priorities[j];
      if (!c.items[j].empty()) std::memcpy(out + o(i), c.items[j].data(), c.items[j].size());
      o(i + 1) = o(i) + c.items[j].size();
      py::list refs;
      for (uint32_t id : c.item_chunk_ids[j]) refs.append(chunk_index[rows[i].shard][id]);
      item_chunks.append(refs);
    }
    py::dict d;
    d["keys"] = keys;
    d["priorities"] = priorities;
    d["insertion"] = seqs;
    d["data"] = data;
    d["offsets"] = offsets;
    d["chunks"] = chunks;
    d["item_chunks"] = item_chunks;
    return d;
  }
  void CheckInvariants() const {
    py::gil_scoped_release release;
    store_->Validate();
  }

  ShardedStore& store() { return *store_; }
  const ShardedStore& store() const { return *store_; }
  // Shared with a serving loop, which may outlive the Python object's last reference during shutdown.
  const std::shared_ptr<ShardedStore>& shared() const { return store_; }

 private:
  std::shared_ptr<ShardedStore> store_;
  std::shared_ptr<DiskTable> disk_;  // a disk table's store: null otherwise
};

std::string FsPath(const py::object& path) { return py::str(py::module_::import("os").attr("fspath")(path)); }

}  // namespace

std::shared_ptr<ShardedStore> StoreOf(const py::handle& store) { return store.cast<PyStore&>().shared(); }

namespace {

// A table on disk (disk_table.h), as Python opens it and hands it to the serving loop.
struct PyDiskTable {
  std::shared_ptr<DiskTable> disk;
};

py::dict OpenedDict(const DiskTableOpened& o) {
  py::dict d;
  d["items"] = o.items;
  d["records"] = o.records;
  d["epoch"] = o.epoch;
  d["lives"] = o.lives;
  d["compacted_bytes"] = o.compacted_bytes;
  d["dropped_items"] = o.dropped_items;
  d["item_bytes"] = o.item_bytes;
  d["dropped_bytes"] = o.log.dropped_bytes;
  d["dropped_segments"] = o.log.dropped_segments;
  d["reason"] = o.log.reason;
  return d;
}

}  // namespace

std::shared_ptr<DiskTable> DiskTableOf(const py::handle& disk) { return disk.cast<PyDiskTable&>().disk; }

void RegisterStore(py::module_& m) {
  py::class_<PySampleBatch>(m, "SampleBatch", R"doc(
A prioritized sample. Item i's bytes are ``data[offsets[i]:offsets[i+1]]`` (also ``items[i]``, a memoryview).
All arrays view memory owned by the batch: no per-item copies are made.)doc")
      .def_property_readonly("keys", &PySampleBatch::keys, "uint64 keys of the sampled items")
      .def_property_readonly("weights", &PySampleBatch::weights,
                             "float32 importance-sampling weights (N P(k))^-beta / max_j w_j, in (0, 1]")
      .def_property_readonly("probabilities", &PySampleBatch::probabilities,
                             "float64 probability of each sampled item for one draw")
      .def_property_readonly("data", &PySampleBatch::data, "uint8 array: every sampled item's bytes, in order")
      .def_property_readonly("offsets", &PySampleBatch::offsets, "uint64 array of n + 1 offsets into data")
      .def_property_readonly("item_chunk_offsets", &PySampleBatch::item_chunk_offsets,
                             "uint64 array of n + 1 offsets into item_chunks (all 0 for items without chunks)")
      .def_property_readonly("item_chunks", &PySampleBatch::item_chunks,
                             "uint64 array: item i's chunks, as indices into this batch's chunks, are "
                             "item_chunks[item_chunk_offsets[i]:item_chunk_offsets[i + 1]]")
      .def_property_readonly("chunk_data", &PySampleBatch::chunk_data,
                             "uint8 array: the bytes of every chunk the batch references, each once")
      .def_property_readonly("chunk_offsets", &PySampleBatch::chunk_offsets,
                             "uint64 array of (number of chunks) + 1 offsets into chunk_data")
      .def_property_readonly("chunks", &PySampleBatch::chunks, "list of bytes, one per chunk")
      .def_property_readonly("items", &PySampleBatch::items, "list of read-only memoryviews, one per item")
      .def_property_readonly("total_mass", &PySampleBatch::total_mass,
                             "sum of priority^alpha the draws were made from (probabilities[i] * total_mass is "
                             "item i's mass); 0.0 in the uniform fallback (every mass 0)")
      .def_property_readonly("min_mass", &PySampleBatch::min_mass,
                             "smallest positive mass, the IS weights' normaliser; 0.0 in the uniform fallback")
      .def_property_readonly("size", &PySampleBatch::store_size, "items in the store when the batch was drawn")
      .def("__len__", &PySampleBatch::size)
      .def("__repr__", [](const PySampleBatch& b) { return "SampleBatch(n=" + std::to_string(b.size()) + ")"; });

  // The kind tables (eviction/kinds.cc, sampling/kinds.cc) and the store's defaults, so that Python's table
  // configuration and flags list the names the store parses rather than a copy of them.
  m.def(
      "eviction_kinds",
      [] {
        py::list out;
        for (const EvictionKindEntry& k : EvictionKindTable()) {
          out.append(py::make_tuple(static_cast<uint32_t>(k.kind), k.name,
                                    k.alias != nullptr ? py::object(py::str(k.alias)) : py::object(py::none())));
        }
        return out;
      },
      "[(number, name, alias or None), ...]: the store's eviction policies (PrioritizedStore(eviction=...)) as "
      "numbered in snapshots, in the kind table's order.");
  m.def(
      "sampler_kinds",
      [] {
        py::list out;
        for (const SamplerKindEntry& k : SamplerKindTable()) {
          out.append(py::make_tuple(static_cast<uint32_t>(k.kind), k.name, py::none()));
        }
        return out;
      },
      "[(number, name, alias or None), ...]: the store's samplers (PrioritizedStore(sampler=...)) as numbered in "
      "snapshots, in the kind table's order.");
  m.attr("DEFAULT_EVICTION") = EvictionKindName(StoreConfig{}.eviction);
  m.attr("DEFAULT_SAMPLER") = SamplerKindName(StoreConfig{}.sampler);

  py::class_<PyDiskTable>(m, "DiskTable", R"doc(
A table stored on disk (storage="disk"): a store like PrioritizedStore's whose every change the serving loop logs
under `path` (checksummed records in segment files; a LOCK file keeps a second process out) before it answers.
Opening replays the log into a new store: every item it holds, with its key, priority and insertion order, the
log cut at its first torn or corrupt record (`opened` says what was dropped). `epoch` is this life's unless an
earlier life of the log used it. The store keeps where each item's bytes lie in the log (16 bytes an item), not
the bytes: `store.sample()` and `store.contents()` read them back from the log, the newest from its last
`cache_bytes` kept in memory (default 1 GiB; 0: none). Only the serving loop may change
the store (`store.insert()` and `store.save()` are refused).)doc")
      .def(py::init([](const py::object& path, const std::string& durability, double interval_s,
                       const py::object& segment_bytes, const py::object& capacity, const py::object& alpha,
                       const py::object& shards, const std::string& eviction, const py::object& alpha_evict,
                       const py::object& seed, const py::object& max_size, const py::object& epoch,
                       const std::string& sampler, const py::object& max_times_sampled, const py::object& cache_bytes) {
             DiskTableOptions o;
             o.path = FsPath(path);
             o.durability = ParseDurability(durability);
             o.interval_s = interval_s;
             const int64_t cache = AsInt(cache_bytes, "cache_bytes");
             if (cache < 0)
               throw InvalidArgument("cache_bytes must be >= 0 (0: no cache), got " + std::to_string(cache));
             o.cache_bytes = static_cast<uint64_t>(cache);
             const int64_t seg = AsInt(segment_bytes, "segment_bytes");
             if (seg < 4096) throw InvalidArgument("segment_bytes must be >= 4096, got " + std::to_string(seg));
             o.log.segment_bytes = static_cast<uint64_t>(seg);
             StoreConfig c = PyStore::Config(capacity, alpha, shards, eviction, alpha_evict, seed, max_size, epoch,
                                             sampler, max_times_sampled);
             py::gil_scoped_release release;
             return std::make_unique<PyDiskTable>(PyDiskTable{std::make_shared<DiskTable>(c, std::move(o))});
           }),
           py::arg("path"), py::kw_only(), py::arg("durability") = "sync", py::arg("interval_s") = 0.010,
           py::arg("segment_bytes") = 64ll << 20, py::arg("capacity") = 1'000'000, py::arg("alpha") = 0.6,
           py::arg("shards") = 8, py::arg("eviction") = std::string(EvictionKindName(StoreConfig{}.eviction)),
           py::arg("alpha_evict") = -0.4, py::arg("seed") = 0, py::arg("max_size") = py::none(), py::arg("epoch") = 1,
           py::arg("sampler") = std::string(SamplerKindName(StoreConfig{}.sampler)), py::arg("max_times_sampled") = 0,
           py::arg("cache_bytes") = static_cast<int64_t>(DiskTableOptions::kDefaultCacheBytes))
      .def_property_readonly(
          "store", [](const PyDiskTable& t) { return std::make_unique<PyStore>(t.disk->store(), t.disk); },
          "The table's store (a PrioritizedStore sharing it): read it (sample() and contents() read the items' "
          "bytes from the log); change it through the serving loop only (insert() and save() are refused).")
      .def_property_readonly(
          "opened", [](const PyDiskTable& t) { return OpenedDict(t.disk->opened()); },
          "What opening found: items restored, records read, the new epoch, earlier lives, and the bytes and "
          "segments the log's recovery dropped with the reason (empty when it ended cleanly).")
      .def_property_readonly("path", [](const PyDiskTable& t) { return t.disk->options().path; })
      .def_property_readonly("cache_bytes", [](const PyDiskTable& t) { return t.disk->options().cache_bytes; })
      .def_property_readonly(
          "durability", [](const PyDiskTable& t) { return std::string(DurabilityName(t.disk->options().durability)); })
      .def("stats", [](const PyDiskTable& t) {
        const DiskTableStats s = t.disk->Stats();
        py::dict d;
        d["records"] = s.records;
        d["record_bytes"] = s.bytes;
        d["syncs"] = s.syncs;
        d["write_errors"] = s.write_errors;
        d["items_logged_again"] = s.restored;
        d["compactions"] = s.compactions;
        d["compaction_errors"] = s.compact_errors;
        d["unsynced_writes"] = s.unsynced_writes;
        d["failed"] = s.failed;
        d["cache_hits"] = s.cache_hits;
        d["cache_misses"] = s.cache_misses;
        d["cache_bytes"] = s.cache_bytes;
        return d;
      });

  py::class_<PyStore>(m, "PrioritizedStore", R"doc(
A key-value store of byte items with proportional prioritized sampling (Schaul et al., Ape-X), or another
sampler.

sampler="prioritized" (default): P(k) = p_k^alpha / sum_j p_j^alpha, drawn stratified; IS weights
(N P(k))^-beta / max_j w_j. "uniform": draws with replacement, every item equally likely (weights 1,
probabilities 1/N). "fifo" / "lifo" / "max_heap" / "min_heap": a sample of n returns min(n, len, 65536) distinct items,
oldest / newest / highest / lowest priority first across the store (weights 1, probabilities 1). With
max_times_sampled=k > 0 an item is removed right after its k-th draw (stats: removed_by_sampling); a draw of a
with-replacement sampler beyond an item's allowance in the same call is dropped, so that batch holds fewer
items. Capacity is
soft: insert always succeeds, remove_to_fit() evicts down to capacity with the eviction policy ("fifo":
globally oldest first; "prioritized": victims drawn proportional to p^alpha_evict); max_size (default
2 * capacity) is hard: an insert that leaves more items evicts down to capacity itself. Keys carry the
store's epoch (1..4095), so keys of an earlier life of a restarted store address nothing. Thread-safe; the
heavy methods release the GIL.)doc")
      .def(py::init(&PyStore::Create), py::arg("capacity") = 1'000'000, py::arg("alpha") = 0.6, py::arg("shards") = 8,
           py::arg("eviction") = std::string(EvictionKindName(StoreConfig{}.eviction)), py::arg("alpha_evict") = -0.4,
           py::arg("seed") = 0, py::arg("max_size") = py::none(), py::arg("epoch") = 1,
           py::arg("sampler") = std::string(SamplerKindName(StoreConfig{}.sampler)), py::arg("max_times_sampled") = 0)
      .def("insert", &PyStore::Insert, py::arg("priorities"), py::arg("items"), py::arg("offsets") = py::none(),
           py::arg("chunks") = py::none(), py::arg("item_chunks") = py::none(),
           py::arg("item_chunk_offsets") = py::none(), py::arg("return_chunk_keys") = false,
           "Insert items with priorities; returns their uint64 keys (in order), and with return_chunk_keys the "
           "tuple (keys, chunk_keys). With `chunks` (a sequence of bytes-like blobs, e.g. compressed frames or "
           "steps), item i references chunks item_chunks[item_chunk_offsets[i]:item_chunk_offsets[i + 1]] (distinct, "
           "at most 4096): a value below len(chunks) is one of this call's chunks (each referenced by some item), "
           "any other the chunk key of a chunk stored by an earlier call (StaleChunksError, nothing stored, if it "
           "is gone). The call goes to one shard, and each chunk is kept, counted once in bytes_held, while an item "
           "referencing it lives.")
      .def("sample", &PyStore::Sample, py::arg("n"), py::arg("beta") = 0.4,
           "Draw n items with the store's sampler (prioritized: with replacement, stratified, proportional to "
           "priority^alpha); len(batch) is the number returned, fewer than n only for an ordered sampler holding "
           "fewer items or with max_times_sampled.")
      .def("update_priorities", &PyStore::UpdatePriorities, py::arg("keys"), py::arg("priorities"),
           "Set new priorities; returns how many keys still addressed an item (stale ones are counted).")
      .def("erase", &PyStore::Erase, py::arg("keys"), "Remove the items of these keys; returns how many.")
      .def("remove_to_fit", &PyStore::RemoveToFit, "Evict down to capacity; returns how many items were removed.")
      .def("stats", &PyStore::Stats, "Counters and sizes as a dict.")
      .def(
          "save", [](const PyStore& s, const py::object& path) { s.Save(FsPath(path)); }, py::arg("path"),
          "Write a versioned, checksummed snapshot (atomically: temporary file, then rename).")
      .def_static(
          "load", [](const py::object& path, const py::object& epoch) { return PyStore::Load(FsPath(path), epoch); },
          py::arg("path"), py::arg("epoch") = py::none(),
          "Read a snapshot written by save(); raises SnapshotError if it is truncated, corrupted or of an "
          "older format. The restored store issues new keys with `epoch` (1..4095, not the saved one; "
          "None: the saved epoch % 4095 + 1): keys of restored items stay valid, keys the saved store "
          "issued after the save are stale.")
      .def_static(
          "snapshot_epoch", [](const py::object& path) { return PyStore::SnapshotEpoch(FsPath(path)); },
          py::arg("path"), "The epoch a snapshot was saved under, read from its header only.")
      .def_static(
          "snapshot_version", [](const py::object& path) { return PyStore::SnapshotVersion(FsPath(path)); },
          py::arg("path"), "The format version of a snapshot, read from its header only.")
      .def("contents", &PyStore::Contents,
           "Every live item, oldest first (by insertion number, across the shards), as a dict: keys (uint64), "
           "priorities (float64), insertion (uint64 insertion numbers), data (uint8) and offsets (uint64, n + 1) "
           "of the items' bytes, chunks (list of bytes: every stored chunk, shard by shard, ids ascending) and "
           "item_chunks (per item, the indices into chunks of the chunks it references). What a snapshot "
           "restored with load() holds: apexrl export reads snapshots through this.")
      .def_readonly_static("MAX_MASS", &kMaxMass,
                           "Largest accepted priority^alpha; a larger one is refused with ValueError.")
      .def_readonly_static("MAX_EPOCH", &kMaxEpoch, "Epochs are 1..MAX_EPOCH.")
      .def_readonly_static("MAX_BATCH_ITEMS", &kMaxBatchItems, "Most items one insert() or sample() call takes.")
      .def("check_invariants", &PyStore::CheckInvariants,
           "Verify every internal invariant (slow; for tests). Raises RuntimeError on a violation.")
      .def("__len__", [](const PyStore& s) { return s.store().Size(); })
      .def_property_readonly("capacity", [](const PyStore& s) { return s.store().config().capacity; })
      .def_property_readonly("alpha", [](const PyStore& s) { return s.store().config().alpha; })
      .def_property_readonly("alpha_evict", [](const PyStore& s) { return s.store().config().alpha_evict; })
      .def_property_readonly("shards", [](const PyStore& s) { return s.store().config().shards; })
      .def_property_readonly("seed", [](const PyStore& s) { return s.store().config().seed; })
      .def_property_readonly(
          "max_size", [](const PyStore& s) { return s.store().config().max_size; },
          "Hard ceiling: an insert that leaves more items evicts down to capacity itself.")
      .def_property_readonly(
          "epoch", [](const PyStore& s) { return s.store().config().epoch; },
          "Carried by every key this store issues (1..4095).")
      .def_property_readonly("eviction", [](const PyStore& s) { return EvictionKindName(s.store().config().eviction); })
      .def_property_readonly("sampler", [](const PyStore& s) { return SamplerKindName(s.store().config().sampler); })
      .def_property_readonly(
          "max_times_sampled", [](const PyStore& s) { return s.store().config().max_times_sampled; },
          "An item is removed right after its k-th draw (0: no limit).")
      .def_property_readonly(
          "total_priority", [](const PyStore& s) { return s.store().TotalMass(); },
          "Sum of priority^alpha over every item: the sampling mass.")
      .def("__repr__", [](const PyStore& s) {
        const auto& c = s.store().config();
        return "PrioritizedStore(size=" + std::to_string(s.store().Size()) +
               ", capacity=" + std::to_string(c.capacity) + ", alpha=" + std::string(py::str(py::float_(c.alpha))) +
               ", shards=" + std::to_string(c.shards) + ", eviction='" + EvictionKindName(c.eviction) + "'" +
               (c.sampler != SamplerKind::kPrioritized ? ", sampler='" + std::string(SamplerKindName(c.sampler)) + "'"
                                                       : std::string()) +
               (c.max_times_sampled > 0 ? ", max_times_sampled=" + std::to_string(c.max_times_sampled)
                                        : std::string()) +
               ")";
      });
}

}  // namespace apexrl::bindings
