#include "apexrl/serve/zmq_api.h"

#include <dlfcn.h>

#include <stdexcept>

namespace apexrl::serve {
namespace {

template <typename Fn>
void BindOne(void* lib, const std::string& path, const char* name, Fn* out) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) throw std::runtime_error("libzmq at " + path + " has no symbol " + name);
  *out = reinterpret_cast<Fn>(sym);
}

}  // namespace

ZmqApi ZmqApi::Bind(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot bind the libzmq that pyzmq loaded (" + path +
                             "): " + (why != nullptr ? why : "not loaded in this process"));
  }
  // The handle is kept (never dlclose'd): pyzmq holds the library for the life of the process anyway.
  ZmqApi api;
  BindOne(lib, path, "zmq_msg_init", &api.msg_init);
  BindOne(lib, path, "zmq_msg_init_size", &api.msg_init_size);
  BindOne(lib, path, "zmq_msg_init_data", &api.msg_init_data);
  BindOne(lib, path, "zmq_msg_close", &api.msg_close);
  BindOne(lib, path, "zmq_msg_data", &api.msg_data);
  BindOne(lib, path, "zmq_msg_size", &api.msg_size);
  BindOne(lib, path, "zmq_msg_more", &api.msg_more);
  BindOne(lib, path, "zmq_msg_gets", &api.msg_gets);
  BindOne(lib, path, "zmq_msg_recv", &api.msg_recv);
  BindOne(lib, path, "zmq_msg_send", &api.msg_send);
  BindOne(lib, path, "zmq_poll", &api.poll);
  BindOne(lib, path, "zmq_errno", &api.errno_);
  BindOne(lib, path, "zmq_strerror", &api.strerror);
  BindOne(lib, path, "zmq_version", &api.version);
  int major = 0, minor = 0, patch = 0;
  api.version(&major, &minor, &patch);
  if (major < 4 || (major == 4 && minor < 2)) {
    throw std::runtime_error("libzmq at " + path + " is " + std::to_string(major) + "." + std::to_string(minor) + "." +
                             std::to_string(patch) + "; the serving loop needs 4.2 or newer");
  }
  return api;
}

}  // namespace apexrl::serve
